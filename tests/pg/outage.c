/*
** outage.c - the PostgreSQL log goes away while a call is being decided:
** the caller is answered by the call's deadline, not held for the store's
** own retry limit (30 s).
**
**   outage URL      (under tests/pg/with_server.sh: IDEM_PG_CTL set)
**
** A guarded tool with timeout_ms 2000.  (1) An attempt is under way when
** the server stops: its finish gives up within seconds, not after 30 s,
** and answers outcome_unknown saying the log could not record it.  (2) A new call while the server is down: begin gives up as
** soon, and nothing runs.  (3) The server is back: (2)'s call has no
** record, and (1)'s record is pending with no attempt counted - its outcome
** was never written - for reconciliation to settle.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "../check.h"
#include "idem.h"

static const char POLICY[] =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
    "\"timeout_ms\":2000,\"retries\":0}}}";
static const char ARGS[] = "{\"order_id\":\"o_1\"}";

/* Twice the deadline and more; the store's own limit is 30 s. */
#define BOUND_MS 10000

static long long mono_ms(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (long long)t.tv_sec * 1000 + t.tv_nsec / 1000000;
}

static int ctl(const char *what) {
  char cmd[4200];
  const char *c = getenv("IDEM_PG_CTL");
  if (!c) return -1;
  snprintf(cmd, sizeof cmd, "\"%s\" %s", c, what);
  return system(cmd);
}

int main(int argc, char **argv) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_record *r = NULL;
  idem_call c = {sizeof c, "out", "c1", "refund_payment", ARGS, strlen(ARGS),
                 NULL, 0};
  long long t0, ms;
  int rc;
  const char *env;
  size_t len;
  if (argc != 2 || !getenv("IDEM_PG_CTL")) {
    fprintf(stderr, "usage: outage URL (under tests/pg/with_server.sh)\n");
    return 2;
  }
  if (idem_policy_parse(POLICY, strlen(POLICY), "policy", &p) != IDEM_OK ||
      idem_guard_open(argv[1], p, &g) != IDEM_OK) {
    fprintf(stderr, "open: %s\n", g ? idem_guard_errmsg(g) : "policy");
    return 1;
  }
  /* (1) the attempt runs; the server stops before its outcome is written */
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(ctl("stop"), 0);
  t0 = mono_ms();
  rc = idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{\"re\":1}", 8, NULL);
  ms = mono_ms() - t0;
  /* the effect happened and the log could not record it: the guard's
  ** own answer says so (outcome_unknown), never an error or "failed" */
  env = idem_step_envelope(s, &len);
  printf("  finish with the server down: rc %d after %lld ms: %s\n", rc, ms,
         env ? env : idem_guard_errmsg(g));
  CHECK_INT(rc, IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  CHECK(ms < BOUND_MS);
  CHECK(env && strstr(env, "the call's deadline") != NULL);
  idem_step_free(s);
  s = NULL;

  /* (2) a new call while it is down */
  c.call_id = "c2";
  t0 = mono_ms();
  rc = idem_guard_begin(g, &c, &s);
  ms = mono_ms() - t0;
  printf("  begin with the server down: rc %d after %lld ms\n", rc, ms);
  CHECK_INT(rc, IDEM_STORE);
  CHECK(ms < BOUND_MS);
  CHECK(idem_step_next(s) != IDEM_NEXT_EXECUTE);
  idem_step_free(s);
  s = NULL;

  /* (3) back */
  CHECK_INT(ctl("start"), 0);
  CHECK_INT(idem_guard_record(g, "out", "c2", &r), IDEM_NOTFOUND);
  idem_record_free(r);
  r = NULL;
  CHECK_INT(idem_guard_record(g, "out", "c1", &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, IDEM_STATE_PENDING);
    CHECK_INT(r->attempts, 0);
  }
  idem_record_free(r);
  idem_guard_close(g);
  idem_policy_free(p);
  return check_done();
}

/*
** test_guard.c - the refund story of SPEC §1, through the guard, in process.
**
** The payment provider is a small honest simulator: a ledger of applied
** refunds (by idempotency key, and counted per order) that can apply and
** then stall past the deadline, fail before applying, or reject.  It does
** NOT dedupe on the key unless told to, so every double application the
** guard failed to prevent would show in the ledger.
**
**   test_guard DIR    (a fresh directory for the SQLite logs)
*/
#define _GNU_SOURCE
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"

/* ---- the provider ----------------------------------------------------------- */

enum { MODE_OK, MODE_STALL, MODE_FAIL_BEFORE, MODE_REJECT, MODE_SLOW };

typedef struct provider {
  pthread_mutex_t mu;
  int mode;
  int stall_ms;
  int applied;         /* refunds applied in total          */
  int calls;           /* downstream calls received          */
  int checks;          /* status checks received             */
  char keys[256][300]; /* applied keys, in order             */
} provider;

static provider P = {PTHREAD_MUTEX_INITIALIZER, MODE_OK, 0, 0, 0, 0, {{0}}};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

static char *dupz(const char *s) {
  char *p = malloc(strlen(s) + 1);
  strcpy(p, s);
  return p;
}

static int refund_run(void *ctx, const char *key, const char *args, size_t len,
                      char **result, char **error) {
  char buf[400];
  int mode, stall, n;
  (void)ctx;
  (void)args;
  (void)len;
  pthread_mutex_lock(&P.mu);
  P.calls++;
  mode = P.mode;
  stall = P.stall_ms;
  if (mode == MODE_FAIL_BEFORE) {
    pthread_mutex_unlock(&P.mu);
    *error = dupz("connection refused");
    return IDEM_OUTCOME_NOT_APPLIED;
  }
  if (mode == MODE_REJECT) {
    pthread_mutex_unlock(&P.mu);
    *error = dupz("card expired");
    return IDEM_OUTCOME_REJECTED;
  }
  n = P.applied++;
  if (n < 256) snprintf(P.keys[n], sizeof P.keys[n], "%s", key);
  pthread_mutex_unlock(&P.mu);
  if (mode == MODE_STALL || mode == MODE_SLOW) sleep_ms(stall);
  snprintf(buf, sizeof buf, "{\"refund_id\":\"re_%d\",\"amount_cents\":6000}",
           n + 1);
  *result = dupz(buf);
  return IDEM_OUTCOME_APPLIED;
}

static int refund_check(void *ctx, const char *key, const char *args,
                        size_t len, char **result, char **error) {
  int i, found = 0;
  (void)ctx;
  (void)args;
  (void)len;
  (void)error;
  pthread_mutex_lock(&P.mu);
  P.checks++;
  for (i = 0; i < P.applied && i < 256; i++)
    if (strcmp(P.keys[i], key) == 0) found = i + 1;
  pthread_mutex_unlock(&P.mu);
  if (!found) return IDEM_OUTCOME_NOT_APPLIED;
  {
    char buf[200];
    snprintf(buf, sizeof buf,
             "{\"refund_id\":\"re_%d\",\"status\":\"applied\"}", found);
    *result = dupz(buf);
  }
  return IDEM_OUTCOME_APPLIED;
}

static void provider_reset(int mode, int stall_ms) {
  pthread_mutex_lock(&P.mu);
  P.mode = mode;
  P.stall_ms = stall_ms;
  P.applied = P.calls = P.checks = 0;
  pthread_mutex_unlock(&P.mu);
}

static int applied(void) {
  int n;
  pthread_mutex_lock(&P.mu);
  n = P.applied;
  pthread_mutex_unlock(&P.mu);
  return n;
}

/* ---- helpers ------------------------------------------------------------------ */

static const char *dir;
static int log_no;

static idem_guard *open_guard(const idem_policy *pol) {
  char url[4200];
  idem_guard *g = NULL;
  snprintf(url, sizeof url, "sqlite:%s/guard%d.db", dir, ++log_no);
  if (idem_guard_open(url, pol, &g) != IDEM_OK) {
    fprintf(stderr, "open %s: %s\n", url, idem_guard_errmsg(g));
    exit(1);
  }
  return g;
}

static idem_policy *policy(const char *text) {
  idem_policy *p = NULL;
  if (idem_policy_parse(text, strlen(text), "test", &p) != IDEM_OK) {
    fprintf(stderr, "policy: %s\n", idem_policy_errmsg(p));
    exit(1);
  }
  return p;
}

static const char *REFUND_POLICY =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":1,\"backoff_ms\":1,\"wait_ms\":2000,"
    "\"status\":{\"tool\":\"get_refund_status\","
    "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
    "\"get_refund_status\":{\"class\":\"read_only\"},"
    "\"lookup\":{\"class\":\"read_only\"}}}";

static const char *NOCHECK_POLICY =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":0,\"backoff_ms\":1,\"wait_ms\":300}}}";

static const char *ARGS = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}";

/* Guard one call; returns the envelope (free()) and checks it names the
** expected status. */
static char *call(idem_guard *g, const char *session, const char *call_id,
                  const char *tool, const char *args, int with_check,
                  const char *want_status) {
  idem_call c = {session, call_id, tool, args, strlen(args)};
  idem_tool t = {refund_run, with_check ? refund_check : NULL, NULL};
  char *env = NULL, want[64];
  size_t len;
  int rc = idem_guard_call(g, &c, &t, &env, &len);
  if (rc != IDEM_OK) {
    fprintf(stderr, "idem_guard_call(%s): %s\n", call_id, idem_guard_errmsg(g));
    check_failed++;
    return NULL;
  }
  snprintf(want, sizeof want, "{\"status\":\"%s\"", want_status);
  if (strncmp(env, want, strlen(want)) != 0) {
    fprintf(stderr, "%s: expected %s, got %s\n", call_id, want_status, env);
    check_failed++;
  } else
    check_passed++;
  return env;
}

#define HAS(env, s) CHECK((env) && strstr((env), (s)) != NULL)

/* A later turn of the model: delivery times have millisecond resolution,
** and a call made in the very millisecond an identical outcome was told is
** fenced (the safe side), so a "later" call is made at least 2 ms later. */
static void next_turn(void) { sleep_ms(2); }

/* ---- the story ------------------------------------------------------------------ */

static void test_story(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  char *e;
  idem_record *r = NULL;

  provider_reset(MODE_OK, 0);
  /* first call */
  e = call(g, "sess_1", "toolu_7", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "\"replayed\":false");
  HAS(e, "\"idempotency_key\":\"sess_1:toolu_7:a280fb850f483293\"");
  HAS(e, "\"result\":{\"amount_cents\":6000,\"refund_id\":\"re_1\"}");
  free(e);
  CHECK_INT(applied(), 1);
  /* replay: the same call again (transport retry, harness replay) */
  e = call(g, "sess_1", "toolu_7", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "\"replayed\":true");
  HAS(e, "re_1");
  free(e);
  CHECK_INT(applied(), 1);
  /* reformatted arguments are the same action */
  e = call(g, "sess_1", "toolu_7", "refund_payment",
           " {\"amount_cents\": 6000.0, \"order_id\" : \"ord_1\"} ", 1,
           "succeeded");
  HAS(e, "\"replayed\":true");
  free(e);
  CHECK_INT(applied(), 1);
  /* conflict: the call id reused with other arguments */
  e = call(g, "sess_1", "toolu_7", "refund_payment",
           "{\"order_id\":\"ord_1\",\"amount_cents\":9000}", 1, "conflict");
  HAS(e, "\"message\":");
  free(e);
  CHECK_INT(applied(), 1);
  /* a legitimate second refund: a new decision, after the model was told */
  next_turn();
  e = call(g, "sess_1", "toolu_9", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "\"replayed\":false");
  free(e);
  CHECK_INT(applied(), 2);
  /* bad arguments: nothing recorded, nothing run */
  e = call(g, "sess_1", "toolu_10", "refund_payment",
           "{\"order_id\":\"ord_1\",\"order_id\":\"ord_2\"}", 1,
           "invalid_arguments");
  HAS(e, "duplicate member name");
  free(e);
  CHECK_INT(idem_guard_record(g, "sess_1", "toolu_10", &r), IDEM_NOTFOUND);
  e = call(g, "sess_1", "toolu_11", "refund_payment", "[1]", 1,
           "invalid_arguments");
  free(e);
  /* refused: a tool the policy does not name */
  e = call(g, "sess_1", "toolu_12", "drop_database", "{}", 1, "refused");
  free(e);
  CHECK_INT(idem_guard_record(g, "sess_1", "toolu_12", &r), IDEM_NOTFOUND);
  CHECK_INT(applied(), 2);
  /* read-only tools run and are not recorded */
  e = call(g, "sess_1", "toolu_13", "lookup", "{}", 1, "succeeded");
  free(e);
  CHECK_INT(idem_guard_record(g, "sess_1", "toolu_13", &r), IDEM_NOTFOUND);
  CHECK_INT(applied(), 3); /* the fake counts any run */
  /* the record holds what SPEC §5 lists */
  CHECK_INT(idem_guard_record(g, "sess_1", "toolu_7", &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->resolution, IDEM_RESOLVED_EXECUTED);
    CHECK_INT(r->attempts, 1);
    CHECK(r->delivered >= r->created);
    CHECK_STR(r->key, "sess_1:toolu_7:a280fb850f483293");
    CHECK_STR(r->args, "{\"amount_cents\":6000,\"order_id\":\"ord_1\"}");
    CHECK(r->expires > r->created);
  }
  idem_record_free(r);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* A timeout after the provider applied the refund, reconciled by the
** status check: the model gets the real answer, no second refund. */
static void test_timeout_reconciled(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_record *r = NULL;
  char *e;
  provider_reset(MODE_STALL, 900);
  e = call(g, "sess_2", "toolu_1", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "\"status\":\"applied\"");
  free(e);
  CHECK_INT(applied(), 1);
  CHECK_INT(idem_guard_record(g, "sess_2", "toolu_1", &r), IDEM_OK);
  if (r) CHECK_INT(r->resolution, IDEM_RESOLVED_RECONCILED);
  idem_record_free(r);
  /* the model re-issues with a new call id: the action was told, and it is
  ** a new decision - but the first one is still stalling in the provider;
  ** here the model was told "succeeded", so a new call goes through */
  sleep_ms(1000);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Without a status check: outcome_unknown -> a re-issue with a new call id
** is fenced -> the late result is captured -> the next re-issue is answered
** already_applied -> after that a new identical call is a real repeat. */
static void test_timeout_fence_late(void) {
  idem_policy *p = policy(NOCHECK_POLICY);
  idem_guard *g = open_guard(p);
  idem_record *r = NULL;
  char *e;
  provider_reset(MODE_STALL, 700);
  e = call(g, "sess_3", "toolu_1", "refund_payment", ARGS, 0,
           "outcome_unknown");
  HAS(e, "Do not call refund_payment again");
  free(e);
  /* the model re-issues at once, with a new call id: fenced */
  e = call(g, "sess_3", "toolu_2", "refund_payment", ARGS, 0,
           "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"toolu_1\"");
  free(e);
  CHECK_INT(applied(), 1);
  /* the provider finishes: the late result is recorded */
  sleep_ms(900);
  CHECK_INT(idem_guard_record(g, "sess_3", "toolu_1", &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->resolution, IDEM_RESOLVED_LATE);
    CHECK_INT(r->delivered, 0);
  }
  idem_record_free(r);
  provider_reset(MODE_OK, 0);
  /* the next re-issue: already applied, with the earlier result */
  e = call(g, "sess_3", "toolu_3", "refund_payment", ARGS, 0,
           "already_applied");
  HAS(e, "\"duplicate_of\":\"toolu_1\"");
  HAS(e, "re_1");
  free(e);
  CHECK_INT(applied(), 0);
  /* its replay says the same */
  e = call(g, "sess_3", "toolu_3", "refund_payment", ARGS, 0,
           "already_applied");
  HAS(e, "\"replayed\":true");
  free(e);
  /* now the model has been told: a new identical call is a real repeat */
  next_turn();
  e = call(g, "sess_3", "toolu_4", "refund_payment", ARGS, 0, "succeeded");
  free(e);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Retries: not applied is retried with the same key; rejected is final. */
static void test_retries(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_record *r = NULL;
  char *e;
  provider_reset(MODE_FAIL_BEFORE, 0);
  e = call(g, "sess_4", "toolu_1", "refund_payment", ARGS, 1, "failed");
  HAS(e, "\"attempts\":2");
  HAS(e, "safe to call it again");
  free(e);
  CHECK_INT(P.calls, 2);
  CHECK_INT(idem_guard_record(g, "sess_4", "toolu_1", &r), IDEM_OK);
  if (r) CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
  idem_record_free(r);
  /* the same call later, provider back: executes, same key */
  provider_reset(MODE_OK, 0);
  e = call(g, "sess_4", "toolu_1", "refund_payment", ARGS, 1, "succeeded");
  free(e);
  CHECK_INT(applied(), 1);
  CHECK_STR(P.keys[0], "sess_4:toolu_1:a280fb850f483293");
  provider_reset(MODE_REJECT, 0);
  next_turn();
  e = call(g, "sess_4", "toolu_2", "refund_payment", ARGS, 1, "failed");
  HAS(e, "card expired");
  free(e);
  CHECK_INT(P.calls, 1);
  e = call(g, "sess_4", "toolu_2", "refund_payment", ARGS, 1, "failed");
  HAS(e, "\"replayed\":true");
  free(e);
  CHECK_INT(P.calls, 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* ---- concurrency ------------------------------------------------------------- */

typedef struct racer {
  idem_guard *g;
  const char *call_id;
  char *env;
} racer;

static void *race_main(void *arg) {
  racer *r = arg;
  idem_call c = {"sess_r", r->call_id, "refund_payment", ARGS, strlen(ARGS)};
  idem_tool t = {refund_run, refund_check, NULL};
  size_t len;
  idem_guard_call(r->g, &c, &t, &r->env, &len);
  return NULL;
}

/* Threads racing one call, and parallel identical calls with different
** call ids (parallel tool calls of one turn): one application each. */
static void test_races(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  enum { N = 8 };
  pthread_t th[N];
  racer rs[N];
  char ids[N][16];
  int i, ok = 0, dup = 0;
  provider_reset(MODE_SLOW, 50);
  for (i = 0; i < N; i++) {
    rs[i].g = g;
    rs[i].call_id = "toolu_same";
    rs[i].env = NULL;
    pthread_create(&th[i], NULL, race_main, &rs[i]);
  }
  for (i = 0; i < N; i++) pthread_join(th[i], NULL);
  for (i = 0; i < N; i++) {
    if (rs[i].env && strstr(rs[i].env, "\"status\":\"succeeded\"")) ok++;
    free(rs[i].env);
  }
  CHECK_INT(applied(), 1);
  CHECK_INT(ok, N); /* every racer learns the one outcome */

  provider_reset(MODE_SLOW, 50);
  for (i = 0; i < N; i++) {
    snprintf(ids[i], sizeof ids[i], "toolu_p%d", i);
    rs[i].call_id = ids[i];
    rs[i].env = NULL;
    pthread_create(&th[i], NULL, race_main, &rs[i]);
  }
  for (i = 0; i < N; i++) pthread_join(th[i], NULL);
  ok = 0;
  for (i = 0; i < N; i++) {
    if (rs[i].env && strstr(rs[i].env, "\"status\":\"succeeded\"")) ok++;
    if (rs[i].env && strstr(rs[i].env, "\"status\":\"already_applied\"")) dup++;
    free(rs[i].env);
  }
  CHECK_INT(applied(), 1);
  CHECK_INT(ok, 1);
  CHECK_INT(dup, N - 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* ---- a log that cannot be used ------------------------------------------------- */

static void test_bad_log(void) {
  char path[4200];
  idem_guard *g = NULL;
  FILE *f;
  snprintf(path, sizeof path, "%s/corrupt.db", dir);
  f = fopen(path, "w");
  fputs("this is not a database, it is a text file that happens to be here\n",
        f);
  for (int i = 0; i < 200; i++) fputs("garbage garbage garbage\n", f);
  fclose(f);
  snprintf(path, sizeof path, "sqlite:%s/corrupt.db", dir);
  CHECK(idem_guard_open(path, NULL, &g) != IDEM_OK);
  CHECK(strlen(idem_guard_errmsg(g)) > 10);
  idem_guard_close(g);
  g = NULL;
  /* a directory where the file should be */
  snprintf(path, sizeof path, "sqlite:%s", dir);
  CHECK(idem_guard_open(path, NULL, &g) != IDEM_OK);
  idem_guard_close(g);
}

/* ---- the two-phase API ---------------------------------------------------------- */

static void test_two_phase(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_call c = {"sess_5", "toolu_1", "refund_payment", ARGS, strlen(ARGS)};
  idem_step *s = NULL;
  size_t len;
  const char *a;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_STR(idem_step_key(s), "sess_5:toolu_1:a280fb850f483293");
  a = idem_step_args(s, &len);
  CHECK_MEM(a, len, "{\"amount_cents\":6000,\"order_id\":\"ord_1\"}");
  CHECK_INT(idem_step_attempt(s), 1);
  CHECK_INT(idem_step_deadline_ms(s), 300);
  /* the downstream call times out */
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "timeout"),
            IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_STR(idem_step_check_tool(s), "get_refund_status");
  a = idem_step_check_args(s, &len);
  CHECK_MEM(a, len, "{\"order_id\":\"ord_1\"}");
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  a = idem_step_envelope(s, &len);
  CHECK(a && strstr(a, "\"check_with\":{\"tool\":\"get_refund_status\","
                       "\"arguments\":{\"order_id\":\"ord_1\"}}"));
  CHECK(a && strstr(a, "call get_refund_status with"));
  /* the late result arrives */
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED,
                             "{\"refund_id\":\"re_9\"}", 20, NULL),
            IDEM_OK);
  idem_step_free(s);
  s = NULL;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  a = idem_step_envelope(s, &len);
  CHECK(a && strstr(a, "re_9") && strstr(a, "\"replayed\":true"));
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* A provider that dedupes on the key: the attempt times out, the retry with
** the same key finds the provider down (refused: not applied).  That says
** nothing of the first attempt, so the action stays in doubt and is
** checked - never recorded not_applied and run again blind. */
static void test_retry_after_doubt(void) {
  idem_policy *p = policy(
      "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
      "\"timeout_ms\":300,\"retries\":2,\"backoff_ms\":1,"
      "\"provider_dedupes\":true,\"status\":{\"tool\":\"get_refund_status\","
      "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
      "\"get_refund_status\":{\"class\":\"read_only\"}}}");
  idem_guard *g = open_guard(p);
  idem_call c = {"sess_6", "toolu_1", "refund_payment", ARGS, strlen(ARGS)};
  idem_step *s = NULL;
  const char *yes =
      "{\"data\":[{\"key\":\"sess_6:toolu_1:a280fb850f483293\"}]}";
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "timeout"),
            IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE); /* retry, same key */
  CHECK_INT(idem_step_attempt(s), 2);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0,
                             "connection refused"),
            IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE); /* the last retry */
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0,
                             "connection refused"),
            IDEM_OK);
  /* not "failed, safe to call again": the first attempt is in doubt */
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  /* what the status tool's answer says, by the policy's applied_when */
  CHECK_INT(idem_step_check_verdict(s, yes, strlen(yes)), IDEM_OUTCOME_APPLIED);
  CHECK_INT(idem_step_check_verdict(s, "{\"data\":[]}", 11),
            IDEM_OUTCOME_NOT_APPLIED);
  CHECK_INT(idem_step_check_verdict(s, "not json", 8), IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_APPLIED, "{\"id\":\"re_1\"}", 13),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(p);
}

int main(int argc, char **argv) {
  if (argc != 2) {
    fprintf(stderr, "usage: test_guard DIR\n");
    return 2;
  }
  dir = argv[1];
  test_story();
  test_timeout_reconciled();
  test_timeout_fence_late();
  test_retries();
  test_races();
  test_two_phase();
  test_retry_after_doubt();
  test_bad_log();
  return check_done();
}

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
#include <spawn.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"

extern char **environ;

/* ---- the wall clock, stepped --------------------------------------------- */

/*
** This program's clock_gettime() is the system's, with CLOCK_REALTIME moved
** by clock_step_ms: what an NTP step or a VM resume does to every reading
** of the wall clock (the library is linked in statically, so its readings
** come here).  The monotonic clocks are left alone, as a step leaves them.
*/
static volatile long long clock_step_ms;

int clock_gettime(clockid_t id, struct timespec *ts) {
  long long ns;
  if (syscall(SYS_clock_gettime, id, ts) != 0) return -1;
  if (id != CLOCK_REALTIME || clock_step_ms == 0) return 0;
  ns = (long long)ts->tv_sec * 1000000000LL + ts->tv_nsec +
       clock_step_ms * 1000000LL;
  ts->tv_sec = (time_t)(ns / 1000000000LL);
  ts->tv_nsec = (long)(ns % 1000000000LL);
  return 0;
}

/* ---- the provider ----------------------------------------------------------- */

/* MODE_LATE: the request sits in the provider's queue for stall_ms, THEN
** the refund is applied (a deadline ends the wait, not the attempt). */
enum {
  MODE_OK,
  MODE_STALL,
  MODE_FAIL_BEFORE,
  MODE_REJECT,
  MODE_SLOW,
  MODE_LATE,
  MODE_QUEUED, /* the seed's case: the tool hands the refund to the       */
               /* provider's queue, its own client gives up at once (the  */
               /* tool returns UNKNOWN), the refund lands stall_ms later */
  MODE_LOST,   /* the same, but the queue loses it: it never lands        */
  MODE_LOST_THEN_REFUSED /* the first call as MODE_LOST, every later one  */
                         /* refused before sending (not applied)          */
};

typedef struct provider {
  pthread_mutex_t mu;
  int mode;
  int stall_ms;
  int applied;         /* refunds applied in total          */
  int calls;           /* downstream calls received          */
  int checks;          /* status checks received             */
  char keys[256][300]; /* applied keys, in order             */
  int dedupe;          /* MODE_LATE: a key applied already is not applied */
                       /* again (the provider dedupes on the key)        */
  int landed;          /* MODE_LATE: calls that have finished            */
  int nsent;           /* MODE_LATE: the keys of every call, in order    */
  char sent[64][300];
} provider;

static provider P = {PTHREAD_MUTEX_INITIALIZER, MODE_OK, 0, 0, 0, 0, {{0}},
                     0, 0, 0, {{0}}};

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* A tool's result and error are handed over through the library's
** allocator (idem.h: one rule for memory). */
static char *dupz(const char *s) {
  char *p = idem_malloc(strlen(s) + 1);
  if (p) strcpy(p, s);
  return p;
}

/* The provider's queue applies a request stall_ms after it came. */
typedef struct queued {
  char key[300];
  int stall_ms;
} queued;

static void *queue_apply(void *arg) {
  queued *q = arg;
  int n;
  sleep_ms(q->stall_ms);
  pthread_mutex_lock(&P.mu);
  n = P.applied++;
  if (n < 256) snprintf(P.keys[n], sizeof P.keys[n], "%s", q->key);
  P.landed++;
  pthread_mutex_unlock(&P.mu);
  free(q);
  return NULL;
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
  if (mode == MODE_LOST_THEN_REFUSED) mode = P.calls == 1 ? MODE_LOST
                                                         : MODE_FAIL_BEFORE;
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
  if (mode == MODE_QUEUED || mode == MODE_LOST) {
    queued *q = malloc(sizeof *q);
    pthread_t t;
    if (P.nsent < 64) snprintf(P.sent[P.nsent++], sizeof P.sent[0], "%s", key);
    pthread_mutex_unlock(&P.mu);
    if (mode == MODE_QUEUED && q) {
      snprintf(q->key, sizeof q->key, "%s", key);
      q->stall_ms = stall;
      if (pthread_create(&t, NULL, queue_apply, q) == 0)
        pthread_detach(t);
      else
        free(q);
    } else
      free(q);
    *error = dupz("the tool's own HTTP client timed out after 30 ms");
    return IDEM_OUTCOME_UNKNOWN;
  }
  if (mode == MODE_LATE) {
    int i, found = -1;
    if (P.nsent < 64) snprintf(P.sent[P.nsent++], sizeof P.sent[0], "%s", key);
    pthread_mutex_unlock(&P.mu);
    sleep_ms(stall);
    pthread_mutex_lock(&P.mu);
    if (P.dedupe)
      for (i = 0; i < P.applied && i < 256; i++)
        if (strcmp(P.keys[i], key) == 0) found = i;
    if (found < 0) {
      n = P.applied++;
      if (n < 256) snprintf(P.keys[n], sizeof P.keys[n], "%s", key);
    } else
      n = found;
    P.landed++;
    pthread_mutex_unlock(&P.mu);
    snprintf(buf, sizeof buf,
             "{\"refund_id\":\"re_%d\",\"amount_cents\":6000}", n + 1);
    *result = dupz(buf);
    return IDEM_OUTCOME_APPLIED;
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
  P.dedupe = P.landed = P.nsent = 0;
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

/* The same refund tool, whose effects end with its executor (a local
** write): settle_ms 0, so an attempt that ended has finished (§6a). */
static const char *LOCAL_POLICY =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":1,\"backoff_ms\":1,\"wait_ms\":2000,\"settle_ms\":0,"
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
/* The model turn of the calls call() makes: next_turn() starts the next
** one (the model was told, and decides again). */
static int turn_no = 1;
static void next_turn(void) { turn_no++; }

/* As call(), in turn (NULL: none, the coalescing window decides). */
static char *call_in(idem_guard *g, const char *session, const char *call_id,
                     const char *tool, const char *args, int with_check,
                     const char *turn, const char *want_status) {
  idem_call c = {sizeof c, session, call_id, tool, args, strlen(args), turn, 0};
  idem_tool t = {sizeof t, refund_run, with_check ? refund_check : NULL, NULL};
  char *env = NULL, want[64];
  size_t len;
  int rc;
  rc = idem_guard_call(g, &c, &t, &env, &len);
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

static char *call(idem_guard *g, const char *session, const char *call_id,
                  const char *tool, const char *args, int with_check,
                  const char *want_status) {
  char turn[32];
  snprintf(turn, sizeof turn, "turn_%d", turn_no);
  return call_in(g, session, call_id, tool, args, with_check, turn,
                 want_status);
}

#define HAS(env, s) CHECK((env) && strstr((env), (s)) != NULL)

/* A later turn of the model: delivery times have millisecond resolution,
** and a call made in the very millisecond an identical outcome was told is
** fenced (the safe side), so a "later" call is made at least 2 ms later. */

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
  /* the reason in its own words, not a blanket one (issue 20) */
  HAS(e, "took effect (no answer within 300 ms)");
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
  const char *turn;
  char *env;
} racer;

static void *race_main(void *arg) {
  racer *r = arg;
  idem_call c = {sizeof c, "sess_r",     r->call_id, "refund_payment",
                 ARGS,     strlen(ARGS), r->turn, 0};
  idem_tool t = {sizeof t, refund_run, refund_check, NULL};
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
    rs[i].turn = "race_1";
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
    rs[i].turn = "race_2"; /* parallel tool calls of the next turn */
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
  idem_call c = {sizeof c, "sess_5",     "toolu_1", "refund_payment",
                 ARGS,     strlen(ARGS), NULL, 0};
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

/* A provider that dedupes on the key: the attempt ends without a verdict
** (an answer idem cannot read), the retry with the same key finds the
** provider down (refused: not applied).  That says nothing of the first
** attempt, so the action stays in doubt and is checked - never recorded
** not_applied and run again blind.  (An attempt that may still land - a
** timeout - is never retried: the record tracks one attempt in flight.) */
static void test_retry_after_doubt(void) {
  idem_policy *p = policy(
      "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
      "\"timeout_ms\":300,\"retries\":2,\"backoff_ms\":1,"
      "\"provider_dedupes\":true,\"status\":{\"tool\":\"get_refund_status\","
      "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
      "\"get_refund_status\":{\"class\":\"read_only\"}}}");
  idem_guard *g = open_guard(p);
  idem_call c = {sizeof c, "sess_6",     "toolu_1", "refund_payment",
                 ARGS,     strlen(ARGS), NULL, 0};
  idem_step *s = NULL;
  const char *yes =
      "{\"data\":[{\"key\":\"sess_6:toolu_1:a280fb850f483293\"}]}";
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_attempt_ended(s), IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "HTTP 502"),
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

/* ---- attempts still in flight (SPEC §6a) ------------------------------------ */

#define HASNT(env, s) CHECK((env) && strstr((env), (s)) == NULL)

static int calls(void) {
  int n;
  pthread_mutex_lock(&P.mu);
  n = P.calls;
  pthread_mutex_unlock(&P.mu);
  return n;
}

static int landed(void) {
  int n;
  pthread_mutex_lock(&P.mu);
  n = P.landed;
  pthread_mutex_unlock(&P.mu);
  return n;
}

/* How many different keys the provider was sent (MODE_LATE). */
static int distinct_sent(void) {
  int i, j, n = 0;
  pthread_mutex_lock(&P.mu);
  for (i = 0; i < P.nsent; i++) {
    for (j = 0; j < i && strcmp(P.sent[i], P.sent[j]) != 0; j++)
      ;
    n += j == i;
  }
  pthread_mutex_unlock(&P.mu);
  return n;
}

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void sleep_until(long long t) {
  long long now = mono_ms();
  if (t > now) sleep_ms((int)(t - now));
}

/* Wait up to ms until n calls of the late provider have finished. */
static void wait_landed(int n, int ms) {
  long long until = mono_ms() + ms;
  while (landed() < n && mono_ms() < until) sleep_ms(10);
  CHECK_INT(landed(), n);
}

/* Wait up to ms until the record of (session, call_id) is in state; the
** record (idem_record_free) or NULL, a failed check. */
static idem_record *wait_state(idem_guard *g, const char *session,
                               const char *call_id, int state, int ms) {
  long long until = mono_ms() + ms;
  idem_record *r = NULL;
  for (;;) {
    CHECK_INT(idem_guard_record(g, session, call_id, &r), IDEM_OK);
    if (!r || r->state == state || mono_ms() >= until) break;
    idem_record_free(r);
    r = NULL;
    sleep_ms(10);
  }
  if (r && r->state == state) return r;
  fprintf(stderr, "%s/%s: state %s, expected %s\n", session, call_id,
          r ? idem_state_name(r->state) : "(none)", idem_state_name(state));
  check_failed++;
  idem_record_free(r);
  return NULL;
}

/* The record of (session, call_id), or NULL (a failed check). */
static idem_record *record(idem_guard *g, const char *session,
                           const char *call_id) {
  idem_record *r = NULL;
  CHECK_INT(idem_guard_record(g, session, call_id, &r), IDEM_OK);
  return r;
}

/* A refund tool whose attempts may land after their deadline. settle_ms < 0
** leaves settle_ms out (no bound). */
static idem_policy *late_policy(int timeout_ms, int retries, int dedupe,
                                long long settle_ms, int with_status) {
  char text[1024], settle[64] = "";
  if (settle_ms >= 0)
    snprintf(settle, sizeof settle, ",\"settle_ms\":%lld", settle_ms);
  snprintf(text, sizeof text,
           "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
           "\"timeout_ms\":%d,\"retries\":%d,\"backoff_ms\":1,"
           "\"wait_ms\":300,\"provider_dedupes\":%s%s%s},"
           "\"get_refund_status\":{\"class\":\"read_only\"}}}",
           timeout_ms, retries, dedupe ? "true" : "false", settle,
           with_status ? ",\"status\":{\"tool\":\"get_refund_status\","
                         "\"arguments\":{\"order_id\":\"{order_id}\"}}"
                       : "");
  return policy(text);
}

/* The reproduction through idem_guard_call: the provider holds the
** refund past the deadline, THEN applies it, and a status check says
** "applied" only once it has.  The first call answers outcome_unknown (not
** succeeded, not failed); neither the same call nor a re-issue under a new
** call id runs the tool again while it hangs; the landing is recorded late;
** one refund.  with_status 0: no status check; dedupe: the provider dedupes
** on the key - still one request: no attempt goes out while an earlier one
** may land (the record tracks one attempt in flight, exactly). */
static void late_case(const char *sess, int with_status, int dedupe) {
  idem_policy *p = late_policy(200, 1, dedupe, -1, with_status);
  idem_guard *g = open_guard(p);
  int runs = 1;
  idem_record *r;
  char key[300] = "";
  char *e;
  provider_reset(MODE_LATE, 800);
  P.dedupe = dedupe;
  e = call(g, sess, "c1", "refund_payment", ARGS, with_status,
           "outcome_unknown");
  HAS(e, "\"attempts\":1");
  HASNT(e, "safe to call");
  HASNT(e, "\"result\"");
  if (with_status) HAS(e, "\"check_with\":{\"tool\":\"get_refund_status\"");
  free(e);
  CHECK_INT(calls(), runs);
  CHECK_INT(landed(), 0);
  if (with_status) {
    pthread_mutex_lock(&P.mu);
    CHECK(P.checks >= 1);
    pthread_mutex_unlock(&P.mu);
  }
  /* the record keeps the attempt that may land: in doubt, its executor */
  if ((r = record(g, sess, "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor != NULL && r->owner != NULL &&
          strcmp(r->executor, r->owner) == 0);
    CHECK_INT(r->pgid, 0);
    CHECK(r->settle_from > 0);
    snprintf(key, sizeof key, "%s", r->key);
  }
  idem_record_free(r);
  /* the same call again while it hangs: nothing runs (a resume whose
  ** executor is at work hears in_progress) */
  e = call(g, sess, "c1", "refund_payment", ARGS, with_status,
           with_status ? "in_progress" : "outcome_unknown");
  HASNT(e, "safe to call");
  free(e);
  CHECK_INT(calls(), runs);
  /* the model re-issues it under a new call id: fenced, nothing runs */
  e = call(g, sess, "c2", "refund_payment", ARGS, with_status,
           "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"c1\"");
  HASNT(e, "safe to call");
  free(e);
  CHECK_INT(calls(), runs);
  CHECK_INT(applied(), 0);
  CHECK_INT(landed(), 0); /* all of the above happened during the hang */
  /* the provider applies it: the late result is recorded */
  wait_landed(runs, 5000);
  if ((r = wait_state(g, sess, "c1", IDEM_STATE_SUCCEEDED, 3000)) != NULL) {
    CHECK_INT(r->resolution, IDEM_RESOLVED_LATE);
    CHECK(r->executor == NULL);
    CHECK_INT(r->delivered, 0);
    CHECK(r->result && strstr(r->result, "re_1"));
  }
  idem_record_free(r);
  CHECK_INT(applied(), 1); /* one refund (distinct keys when deduped) */
  CHECK_INT(distinct_sent(), 1);
  CHECK_INT(P.nsent, runs);
  CHECK_STR(P.sent[0], key);
  /* the re-issue before the model was told: already applied */
  e = call(g, sess, "c2", "refund_payment", ARGS, with_status,
           "already_applied");
  HAS(e, "\"duplicate_of\":\"c1\"");
  HAS(e, "re_1");
  free(e);
  /* the first call replays the late outcome */
  e = call(g, sess, "c1", "refund_payment", ARGS, with_status, "succeeded");
  HAS(e, "\"replayed\":true");
  HAS(e, "re_1");
  free(e);
  CHECK_INT(calls(), runs);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

static void test_late_landing(void) {
  late_case("late_check", 1, 0);
  late_case("late_dedupe", 1, 1);
  late_case("late_nocheck", 0, 0);
}

/* settle_ms 0 says the tool's effects end with its deadline: after it, a
** status check that does not show the attempt lets the guard run it again.
** For a provider that in truth applies later, that is two refunds - the
** documented trade-off of a settle_ms too small; counted here. */
static void test_late_settle_zero(void) {
  idem_policy *p = late_policy(200, 1, 0, 0, 1);
  idem_guard *g = open_guard(p);
  idem_record *r;
  char *e;
  provider_reset(MODE_LATE, 1200);
  /* attempt 1 times out, the check finds nothing, settle_ms 0 has passed:
  ** attempt 2 with the same key; it times out too, the check finds nothing
  ** and no retry is left: not applied */
  e = call(g, "settle0", "c1", "refund_payment", ARGS, 1, "failed");
  HAS(e, "\"attempts\":2");
  free(e);
  CHECK_INT(calls(), 2);
  CHECK_INT(distinct_sent(), 1);
  CHECK_INT(applied(), 0);
  wait_landed(2, 5000);
  CHECK_INT(applied(), 2); /* both attempts landed: two refunds */
  /* (the log says not_applied: the late results found the action settled
  ** and were dropped) */
  if ((r = record(g, "settle0", "c1")) != NULL) {
    CHECK_INT(r->attempts, 2);
    CHECK(r->executor == NULL);
  }
  idem_record_free(r);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* A small settle_ms: until it has passed since the deadline, a check that
** does not show the attempt changes nothing (outcome_unknown, in_progress,
** fenced); after it, the same call runs again with the same key. */
static void test_late_settle_small(void) {
  idem_policy *p = late_policy(200, 1, 0, 300, 1);
  idem_guard *g = open_guard(p);
  idem_record *r;
  long long t0 = mono_ms();
  char *e;
  provider_reset(MODE_LATE, 2000);
  e = call(g, "settle300", "c1", "refund_payment", ARGS, 1,
           "outcome_unknown");
  HAS(e, "\"attempts\":1");
  free(e);
  e = call(g, "settle300", "c1", "refund_payment", ARGS, 1, "in_progress");
  free(e);
  e = call(g, "settle300", "c2", "refund_payment", ARGS, 1,
           "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  CHECK_INT(calls(), 1);
  CHECK(mono_ms() < t0 + 500); /* the above ran before settle_ms passed */
  /* settle_ms has passed (the deadline was at t0 + 200): it runs again */
  sleep_until(t0 + 750);
  e = call(g, "settle300", "c1", "refund_payment", ARGS, 1,
           "outcome_unknown");
  HAS(e, "\"attempts\":2");
  free(e);
  CHECK_INT(calls(), 2);
  CHECK_INT(distinct_sent(), 1);
  CHECK_INT(landed(), 0);
  wait_landed(2, 5000);
  CHECK_INT(applied(), 2); /* the trade-off: two refunds */
  if ((r = wait_state(g, "settle300", "c1", IDEM_STATE_SUCCEEDED, 3000))) {
    CHECK_INT(r->resolution, IDEM_RESOLVED_LATE);
    CHECK(r->executor == NULL);
  }
  idem_record_free(r);
  e = call(g, "settle300", "c1", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "\"replayed\":true");
  free(e);
  CHECK_INT(calls(), 2);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Begin a call and time its first attempt out: EXECUTE, then
** finish(UNKNOWN), after idem_step_attempt_ended() when ended. */
/* Ended is not finished (SPEC §6a): the tool's own client gives up and the
** function returns UNKNOWN long before the guard's deadline, while the
** refund sits in the provider's queue and lands later.  The attempt ended
** without a verdict: the check that finds nothing yet settles nothing, no
** retry with the same key runs (retries 2), the re-issue is fenced, and
** once the refund shows the re-issue is already_applied - one refund. */
static void test_ended_not_finished(void) {
  idem_policy *p = late_policy(3000, 2, 0, -1, 1);
  idem_guard *g = open_guard(p);
  idem_record *r;
  char *e;
  provider_reset(MODE_QUEUED, 600);
  e = call(g, "enf", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  HAS(e, "\"attempts\":1");
  HAS(e, "timed out");
  HASNT(e, "safe to call");
  HASNT(e, "did not take effect");
  free(e);
  CHECK_INT(calls(), 1); /* no retry with the same key */
  if ((r = record(g, "enf", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor == NULL); /* nothing of it runs ... */
    CHECK(r->settle_from > 0);  /* ... but it may land */
  }
  idem_record_free(r);
  /* the model re-issues it at once: fenced, nothing runs */
  next_turn();
  e = call(g, "enf", "c2", "refund_payment", ARGS, 1, "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"c1\"");
  HASNT(e, "safe to call");
  free(e);
  CHECK_INT(calls(), 1);
  /* the refund lands; the next re-issue is already_applied */
  wait_landed(1, 5000);
  next_turn();
  e = call(g, "enf", "c3", "refund_payment", ARGS, 1, "already_applied");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  CHECK_INT(calls(), 1);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);

  /* settle_ms bounds it: a provider that lost the request never applies
  ** it; until settle_ms has passed since the end the re-issue is fenced,
  ** after it the re-issue runs - once */
  p = late_policy(3000, 2, 0, 300, 1);
  g = open_guard(p);
  provider_reset(MODE_LOST, 0);
  e = call(g, "enl", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  HASNT(e, "safe to call");
  free(e);
  next_turn();
  e = call(g, "enl", "c2", "refund_payment", ARGS, 1, "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  CHECK_INT(calls(), 1);
  sleep_ms(350);
  pthread_mutex_lock(&P.mu);
  P.mode = MODE_OK;
  pthread_mutex_unlock(&P.mu);
  next_turn();
  e = call(g, "enl", "c3", "refund_payment", ARGS, 1, "succeeded");
  free(e);
  CHECK_INT(calls(), 2);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);

  /* a provider that dedupes on the key: a retry with the same key is
  ** harmless, and runs (its landing and the queued one are one refund) */
  p = late_policy(3000, 2, 1, -1, 1);
  g = open_guard(p);
  provider_reset(MODE_LOST, 0);
  e = call(g, "end", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  free(e);
  CHECK_INT(calls(), 3); /* retries 2, each ended without a verdict */
  /* ... and a retry's own "not applied" speaks for the retry only: the
  ** first attempt may still land, so a re-issue under a new key (which
  ** the provider's dedupe cannot catch) stays fenced */
  provider_reset(MODE_LOST_THEN_REFUSED, 0);
  e = call(g, "enr", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  HASNT(e, "safe to call");
  free(e);
  CHECK_INT(calls(), 3);
  if ((r = record(g, "enr", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->settle_from > 0); /* the first attempt may land */
  }
  idem_record_free(r);
  next_turn();
  e = call(g, "enr", "c2", "refund_payment", ARGS, 1, "outcome_unknown");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  CHECK_INT(calls(), 3);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Under provider_dedupes, an attempt whose executor died (a process of
** this machine, no process group of its own) no longer runs: a retry with
** its key is harmless, and runs, though the attempt may still land; the
** provider keeps one refund per key. */
static void test_dead_executor_dedupe(void) {
  idem_policy *p = late_policy(3000, 2, 1, -1, 1);
  idem_guard *g = open_guard(p);
  char url[4200], self[4200];
  char *argv[] = {self, "--die-mid-call", url, NULL};
  int status = -1;
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  pid_t pid = -1;
  char *e;
  snprintf(url, sizeof url, "%s", idem_guard_log(g));
  self[n > 0 ? n : 0] = '\0';
  /* an executor that dies mid-call: this program again, as a process of
  ** its own (a fork of this threaded one must not open a guard) */
  CHECK(posix_spawn(&pid, self, NULL, NULL, argv, environ) == 0);
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0);
  provider_reset(MODE_OK, 0);
  P.dedupe = 1;
  e = call(g, "ded", "c1", "refund_payment", ARGS, 1, "succeeded");
  HASNT(e, "\"replayed\":true");
  free(e);
  CHECK_INT(calls(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* A status check given in code (idem_tool.check) is a status check,
** whatever the policy names: it is run, and the model is never told there
** is none. */
static void test_own_check(void) {
  idem_policy *p = late_policy(3000, 0, 0, -1, 0); /* no status in it */
  idem_guard *g = open_guard(p);
  char *e;
  provider_reset(MODE_QUEUED, 400);
  e = call(g, "own", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  HASNT(e, "there is no status check");
  HASNT(e, "safe to call");
  free(e);
  pthread_mutex_lock(&P.mu);
  CHECK_INT(P.checks, 1);
  pthread_mutex_unlock(&P.mu);
  wait_landed(1, 5000);
  /* the same call again: the check in code finds it applied */
  e = call(g, "own", "c1", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "re_1");
  free(e);
  /* without the function, the model hears the truth: no check */
  provider_reset(MODE_QUEUED, 100);
  e = call(g, "own", "c9", "refund_payment", "{\"order_id\":\"o9\"}", 0,
           "outcome_unknown");
  HAS(e, "there is no status check");
  free(e);
  wait_landed(1, 5000);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* idem_guard_resolve: an operator's verdict, on an action in doubt only. */
static void test_resolve_api(void) {
  idem_policy *p = late_policy(3000, 0, 0, -1, 1);
  idem_guard *g = open_guard(p);
  idem_record *r = NULL;
  char *e;
  provider_reset(MODE_LOST, 0);
  e = call(g, "rv", "c1", "refund_payment", ARGS, 1, "outcome_unknown");
  free(e);
  CHECK_INT(idem_guard_resolve(NULL, "rv", "c1", IDEM_OUTCOME_APPLIED, NULL, 0,
                               NULL, NULL),
            IDEM_MISUSE);
  CHECK_INT(idem_guard_resolve(g, "rv", "c1", IDEM_OUTCOME_UNKNOWN, NULL, 0,
                               NULL, NULL),
            IDEM_MISUSE);
  CHECK_INT(idem_guard_resolve(g, "rv", "c1", IDEM_OUTCOME_NOT_APPLIED, NULL,
                               0, NULL, NULL),
            IDEM_MISUSE); /* no reason */
  CHECK_INT(idem_guard_resolve(g, "rv", "c1", IDEM_OUTCOME_APPLIED, "{x", 2,
                               NULL, NULL),
            IDEM_INVALID);
  CHECK_INT(idem_guard_resolve(g, "rv", "nope", IDEM_OUTCOME_APPLIED, NULL, 0,
                               NULL, NULL),
            IDEM_NOTFOUND);
  CHECK_INT(idem_guard_resolve(g, "rv", "c1", IDEM_OUTCOME_APPLIED,
                               "{\"refund_id\": \"re_x\"}", 21, NULL, "bob"),
            IDEM_OK);
  if (idem_guard_record(g, "rv", "c1", &r) == IDEM_OK && r) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->resolution, IDEM_RESOLVED_OPERATOR);
    CHECK_STR(r->resolved_by, "bob");
    CHECK(r->resolved_at > 0);
    CHECK_STR(r->result, "{\"refund_id\":\"re_x\"}"); /* canonical */
  }
  idem_record_free(r);
  CHECK_INT(idem_guard_resolve(g, "rv", "c1", IDEM_OUTCOME_APPLIED, NULL, 0,
                               NULL, NULL),
            IDEM_STALE);
  CHECK(strstr(idem_guard_errmsg(g), "not in doubt") != NULL);
  CHECK_STR(idem_resolution_name(IDEM_RESOLVED_OPERATOR), "operator");
  /* a re-issue (the model was not told yet), and the replay: the
  ** verdict, nothing runs */
  next_turn();
  e = call(g, "rv", "c2", "refund_payment", ARGS, 1, "already_applied");
  HAS(e, "re_x");
  free(e);
  e = call(g, "rv", "c1", "refund_payment", ARGS, 1, "succeeded");
  HAS(e, "re_x");
  free(e);
  CHECK_INT(calls(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

static idem_step *timed_out(idem_guard *g, idem_call *c, int ended) {
  idem_step *s = NULL;
  CHECK_INT(idem_guard_begin(g, c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  if (ended) CHECK_INT(idem_step_attempt_ended(s), IDEM_OK);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0, "timeout"),
            IDEM_OK);
  return s;
}

/* ... and answer outcome_unknown (the check could not tell). */
static long long left_unknown(idem_guard *g, idem_call *c, int ended) {
  idem_step *s = timed_out(g, c, ended);
  long long token;
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  token = idem_step_token(s);
  idem_step_free(s);
  return token;
}

/* s's check finds nothing, and s stays in doubt: outcome_unknown, no
** second EXECUTE, never "safe to call again"; its envelope is returned. */
static const char *check_finds_nothing(idem_step *s) {
  const char *env;
  size_t len;
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER); /* no second EXECUTE */
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HASNT(env, "safe to call");
  HASNT(env, "did not take effect");
  return env;
}

/* The two-phase API: an UNKNOWN is an attempt that may still land; one
** that idem_step_attempt_ended() said ended has no verdict either, and may
** land too - unless the tool's effects end with it (settle_ms 0). */
static void test_two_phase_inflight(void) {
  idem_policy *p = policy(REFUND_POLICY), *pl = policy(LOCAL_POLICY);
  idem_guard *g = open_guard(p), *gl = open_guard(pl);
  idem_call c = {sizeof c, "tp1",        "c1", "refund_payment",
                 ARGS,     strlen(ARGS), NULL, 0};
  idem_step *s;
  idem_record *r;
  const char *env;
  char key[300];
  long long token;

  /* finish(UNKNOWN), then the check finds nothing: still unknown */
  s = timed_out(g, &c, 0);
  snprintf(key, sizeof key, "%s", idem_step_key(s));
  env = check_finds_nothing(s);
  HAS(env, "\"check_with\"");
  idem_step_free(s);
  if ((r = record(g, "tp1", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor != NULL && r->owner &&
          strcmp(r->executor, r->owner) == 0);
    CHECK_INT(r->attempts, 1);
    CHECK(r->settle_from >= r->created + 300);
  }
  idem_record_free(r);

  /* the attempt ended without a verdict (its own client gave up): ended
  ** is not finished - the request may sit in the provider's queue, so
  ** "not applied" leaves it in doubt, and never says failed */
  c.session = "tp2u";
  s = timed_out(g, &c, 1);
  if ((r = record(g, "tp2u", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor == NULL);  /* nothing of it runs */
    CHECK(r->settle_from >= r->created); /* but it ended then */
    CHECK(r->settle_from < r->created + 300); /* before its deadline */
  }
  idem_record_free(r);
  check_finds_nothing(s);
  idem_step_free(s);
  if ((r = record(g, "tp2u", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK_INT(r->attempts, 1);
  }
  idem_record_free(r);

  /* with settle_ms 0 (a local write, its effects end with the function),
  ** the end does finish it: "not applied" re-executes, with the same key */
  c.session = "tp2";
  s = timed_out(gl, &c, 1);
  snprintf(key, sizeof key, "%s", idem_step_key(s));
  if ((r = record(gl, "tp2", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor == NULL);
  }
  idem_record_free(r);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_attempt(s), 2);
  CHECK_STR(idem_step_key(s), key);
  if ((r = record(gl, "tp2", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_PENDING);
    CHECK(r->executor != NULL); /* the new attempt's */
  }
  idem_record_free(r);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{\"refund_id\":\"re_1\"}",
                             20, NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  if ((r = record(gl, "tp2", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->attempts, 2);
    CHECK(r->executor == NULL);
    CHECK_INT(r->settle_from, 0); /* a verdict: nothing of it can land */
  }
  idem_record_free(r);
  CHECK_INT(idem_step_attempt_ended(NULL), IDEM_MISUSE);

  /* idem_guard_late(UNKNOWN): the attempt ended without a verdict - it
  ** clears the executor only under the attempt's own token, and keeps
  ** when it stopped being watched (its deadline, earlier than the end) */
  c.session = "tp3";
  token = left_unknown(g, &c, 0);
  CHECK_INT(idem_guard_late(g, "tp3", "c1", token + 1, IDEM_OUTCOME_UNKNOWN,
                            NULL, 0, "connection reset", 1),
            IDEM_OK);
  if ((r = record(g, "tp3", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor != NULL);
  }
  idem_record_free(r);
  CHECK_INT(idem_guard_late(g, "tp3", "c1", token, IDEM_OUTCOME_UNKNOWN, NULL,
                            0, "connection reset", 1),
            IDEM_OK);
  if ((r = record(g, "tp3", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor == NULL);
    CHECK(r->settle_from < r->created + 300); /* its end, before its deadline */
    CHECK_INT(r->token, token);
    CHECK_STR(r->error, "connection reset");
  }
  idem_record_free(r);
  /* a resume's check that finds nothing: still in doubt (no settle_ms) */
  s = NULL;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_step_free(s);
  /* under settle_ms 0 the same runs it again, same key */
  token = left_unknown(gl, &c, 0);
  CHECK_INT(idem_guard_late(gl, "tp3", "c1", token, IDEM_OUTCOME_UNKNOWN, NULL,
                            0, "connection reset", 1),
            IDEM_OK);
  s = NULL;
  CHECK_INT(idem_guard_begin(gl, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_attempt(s), 2);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  idem_guard_close(g);
  idem_guard_close(gl);
  idem_policy_free(p);
  idem_policy_free(pl);
}

/* Attempt 1 timed out, settle_ms (0) passed, the check found nothing:
** attempt 2 runs.  A late word from attempt 1, under attempt 1's token (it
** ended without a verdict, or it certainly did not apply), speaks for
** attempt 1 only: attempt 2 is still running and may land, so the action
** stays pending with attempt 2's executor, an identical call meanwhile must
** not run, and attempt 2's result is its outcome. */
static void late_word_case(const char *sess, int outcome) {
  idem_policy *p = late_policy(100, 2, 0, 0, 1);
  idem_guard *g = open_guard(p);
  idem_call c = {sizeof c, sess,         "c1", "refund_payment",
                 ARGS,     strlen(ARGS), NULL, 0};
  idem_call c2 = {sizeof c2, sess,         "c2", "refund_payment",
                  ARGS,      strlen(ARGS), NULL, 0};
  idem_step *s = timed_out(g, &c, 0), *s2 = NULL;
  idem_record *r;
  long long token = idem_step_token(s);
  int steps = 0;
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  sleep_ms(150); /* past the deadline + settle_ms */
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE); /* attempt 2 starts */
  CHECK_INT(idem_step_attempt(s), 2);
  /* attempt 1's late word */
  CHECK_INT(idem_guard_late(g, sess, "c1", token, outcome, NULL, 0,
                            "connection reset", 1),
            IDEM_OK);
  if ((r = record(g, sess, "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_PENDING);
    CHECK(r->executor != NULL);
  }
  idem_record_free(r);
  /* the model re-issues it: attempt 2 may land, so c2 must not run */
  CHECK_INT(idem_guard_begin(g, &c2, &s2), IDEM_OK);
  while (idem_step_next(s2) != IDEM_NEXT_ANSWER &&
         idem_step_next(s2) != IDEM_NEXT_EXECUTE && ++steps < 200) {
    if (idem_step_next(s2) == IDEM_NEXT_CHECK)
      CHECK_INT(idem_step_resolve(s2, IDEM_OUTCOME_NOT_APPLIED, NULL, 0),
                IDEM_OK);
    else {
      sleep_ms((int)idem_step_delay_ms(s2));
      CHECK_INT(idem_step_poll(s2), IDEM_OK);
    }
  }
  if (idem_step_next(s2) == IDEM_NEXT_EXECUTE)
    fprintf(stderr, "%s: c2 executes while c1's attempt 2 may land\n", sess);
  CHECK_INT(idem_step_next(s2), IDEM_NEXT_ANSWER);
  idem_step_free(s2);
  /* attempt 2 lands */
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{\"refund_id\":\"re_2\"}",
                             20, NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(p);
}

static void test_late_word_of_an_older_attempt(void) {
  late_word_case("lw_unknown", IDEM_OUTCOME_UNKNOWN);
  late_word_case("lw_not_applied", IDEM_OUTCOME_NOT_APPLIED);
}

/* idem recover and idem recover --batch: "not applied" while an attempt
** may still land changes nothing - one in flight, or one that ended
** without a verdict; under settle_ms 0 the ended one is finished. */
static void test_recover_inflight(void) {
  idem_policy *p = policy(REFUND_POLICY), *pl = policy(LOCAL_POLICY);
  idem_guard *g = open_guard(p), *gl = open_guard(pl);
  idem_call c = {sizeof c, "rc1",        "c1", "refund_payment",
                 ARGS,     strlen(ARGS), NULL, 0};
  idem_settlement v[2];
  idem_step *s = NULL;
  idem_record *r;
  const char *env;
  size_t len;
  long long t1, t3, t3u;

  t1 = left_unknown(g, &c, 0); /* rc1: may still land */
  c.session = "rc2";
  left_unknown(g, &c, 1); /* rc2: its attempt ended, no verdict */
  left_unknown(gl, &c, 1); /* the same, its effects ended with it */
  c.session = "rc3";
  t3u = left_unknown(g, &c, 1);
  t3 = left_unknown(gl, &c, 1);

  /* recover + NOT_APPLIED on the action in flight: stays in doubt */
  CHECK_INT(idem_guard_recover(g, "rc1", "c1", &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER);
  CHECK(idem_step_answer(s) == IDEM_ANSWER_IN_PROGRESS ||
        idem_step_answer(s) == IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HASNT(env, "did not take effect");
  HASNT(env, "safe to call");
  idem_step_free(s);
  s = NULL;
  if ((r = record(g, "rc1", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor != NULL);
    CHECK_INT(r->resolution, IDEM_RESOLVED_NONE);
    t1 = r->token;
  }
  idem_record_free(r);
  /* ... on the one whose attempt ended without a verdict: the same */
  CHECK_INT(idem_guard_recover(g, "rc2", "c1", &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HASNT(env, "safe to call");
  idem_step_free(s);
  s = NULL;
  if ((r = record(g, "rc2", "c1")) != NULL)
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
  idem_record_free(r);
  /* ... and under settle_ms 0 it has finished: not applied (the control) */
  CHECK_INT(idem_guard_recover(gl, "rc2", "c1", &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_FAILED);
  idem_step_free(s);
  s = NULL;
  if ((r = record(gl, "rc2", "c1")) != NULL)
    CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
  idem_record_free(r);

  /* settle_many: NOT_APPLIED on the one in flight is IDEM_STALE and
  ** changes nothing; on the ended one it settles */
  memset(v, 0, sizeof v);
  v[0].size = v[1].size = sizeof v[0];
  v[0].session = "rc1";
  v[0].call_id = "c1";
  v[0].token = t1;
  v[0].outcome = IDEM_OUTCOME_NOT_APPLIED;
  v[1].session = "rc3";
  v[1].call_id = "c1";
  v[1].token = t3u;
  v[1].outcome = IDEM_OUTCOME_NOT_APPLIED;
  v[0].rc = v[1].rc = -1;
  CHECK_INT(idem_guard_settle_many(g, v, 2), IDEM_OK);
  CHECK_INT(v[0].rc, IDEM_STALE);
  CHECK_INT(v[1].rc, IDEM_STALE); /* ended without a verdict */
  if ((r = record(g, "rc3", "c1")) != NULL)
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
  idem_record_free(r);
  v[1].token = t3;
  v[1].rc = -1;
  CHECK_INT(idem_guard_settle_many(gl, &v[1], 1), IDEM_OK);
  CHECK_INT(v[1].rc, IDEM_OK); /* settle_ms 0: it has finished */
  if ((r = record(g, "rc1", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK_INT(r->token, t1);
    CHECK(r->executor != NULL);
    CHECK_INT(r->resolution, IDEM_RESOLVED_NONE);
  }
  idem_record_free(r);
  if ((r = record(gl, "rc3", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
    CHECK_INT(r->resolution, IDEM_RESOLVED_RECONCILED);
  }
  idem_record_free(r);
  /* a rejection reads as not applied: the same */
  CHECK_INT(idem_guard_settle(g, "rc1", "c1", t1, IDEM_OUTCOME_REJECTED, NULL,
                              0),
            IDEM_STALE);
  /* applied settles it, in flight or not */
  CHECK_INT(idem_guard_settle(g, "rc1", "c1", t1, IDEM_OUTCOME_APPLIED,
                              "{\"refund_id\":\"re_1\"}", 20),
            IDEM_OK);
  if ((r = record(g, "rc1", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK(r->executor == NULL);
  }
  idem_record_free(r);
  idem_guard_close(g);
  idem_guard_close(gl);
  idem_policy_free(p);
  idem_policy_free(pl);
}

/* The fence: an identical call under a new call id checks the earlier
** action; "not applied" while the earlier attempt may land answers
** outcome_unknown naming it, and runs nothing. */
static void test_fence_inflight(void) {
  idem_policy *p = policy(REFUND_POLICY), *pl = policy(LOCAL_POLICY);
  idem_guard *g = open_guard(p), *gl = open_guard(pl);
  idem_call c1 = {sizeof c1, "fe1",        "c1", "refund_payment",
                  ARGS,      strlen(ARGS), NULL, 0};
  idem_call c2 = {sizeof c2, "fe1",        "c2", "refund_payment",
                  ARGS,      strlen(ARGS), NULL, 0};
  idem_step *s = NULL;
  idem_record *r;
  const char *env;
  char key1[300] = "";
  size_t len;

  left_unknown(g, &c1, 0);
  if ((r = record(g, "fe1", "c1")) != NULL)
    snprintf(key1, sizeof key1, "%s", r->key);
  idem_record_free(r);
  CHECK_INT(idem_guard_begin(g, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_STR(idem_step_check_key(s), key1); /* the earlier action's */
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER); /* nothing runs */
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HAS(env, "\"duplicate_of\":\"c1\"");
  HASNT(env, "safe to call");
  idem_step_free(s);
  s = NULL;
  if ((r = record(g, "fe1", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_IN_DOUBT);
    CHECK(r->executor != NULL);
  }
  idem_record_free(r);
  /* c2 never ran: recorded not_applied, fenced by c1, so that its replay
  ** meets the fence again as of its first issue */
  if (idem_guard_record(g, "fe1", "c2", &r) == IDEM_OK && r) {
    CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
    CHECK_INT(r->attempts, 0);
    CHECK_STR(r->duplicate_of, "c1");
  } else
    CHECK(!"c2 has a record");
  idem_record_free(r);
  r = NULL;

  /* the earlier attempt ended without a verdict: the same, it may land */
  c1.session = c2.session = "fe2u";
  left_unknown(g, &c1, 1);
  CHECK_INT(idem_guard_begin(g, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER); /* nothing runs */
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HAS(env, "\"duplicate_of\":\"c1\"");
  HASNT(env, "safe to call");
  idem_step_free(s);
  s = NULL;

  /* the control: the earlier attempt ended under settle_ms 0 - not
  ** applied, c2 runs */
  c1.session = c2.session = "fe2";
  left_unknown(gl, &c1, 1);
  CHECK_INT(idem_guard_begin(gl, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK(strstr(idem_step_key(s), ":c2:") != NULL);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  if ((r = record(gl, "fe2", "c1")) != NULL)
    CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
  idem_record_free(r);
  idem_guard_close(g);
  idem_guard_close(gl);
  idem_policy_free(p);
  idem_policy_free(pl);
}

/* test_dead_executor_dedupe's executor: begin the call, and die with
** its attempt started and no answer. */
static int die_mid_call(const char *url) {
  idem_policy *p = late_policy(3000, 2, 1, -1, 1);
  idem_call c = {sizeof c, "ded", "c1", "refund_payment", ARGS, strlen(ARGS),
                 NULL, 0};
  idem_guard *g = NULL;
  idem_step *s = NULL;
  if (idem_guard_open(url, p, &g) != IDEM_OK ||
      idem_guard_begin(g, &c, &s) != IDEM_OK ||
      idem_step_next(s) != IDEM_NEXT_EXECUTE)
    _exit(1);
  _exit(0);
}

/* ---- the fence compares a field's text ---------------------------------- */

/* With "fence": ["order_id"], an in-doubt refund of order 1001 re-issued
** as "1001" is the same order: the tool formats both into one request
** (SPEC §6.4: a fence field's scalar is compared by its text).  The
** fingerprint and the key stay exact. */
static const char *FENCE_TEXT_POLICY =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":0,\"backoff_ms\":1,\"wait_ms\":300,\"settle_ms\":0,"
    "\"coalesce_ms\":0,\"fence\":[\"order_id\"],"
    "\"status\":{\"tool\":\"get_refund_status\","
    "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
    "\"get_refund_status\":{\"class\":\"read_only\"}}}";

/* The fence key of record (session, call_id), into out ("" when none). */
static void fence_of(idem_guard *g, const char *session, const char *call_id,
                     char out[65]) {
  idem_record *r = record(g, session, call_id);
  snprintf(out, 65, "%s", r && r->fence_key ? r->fence_key : "");
  idem_record_free(r);
}

/* Run args as (session, call_id) to its end, the tool applying it. */
static void run_applied(idem_guard *g, const char *session,
                        const char *call_id, const char *args) {
  idem_call c = {sizeof c, session, call_id, "refund_payment", args,
                 strlen(args), NULL, 0};
  idem_step *s = NULL;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  idem_step_free(s);
}

static void test_fence_by_text(void) {
  static const struct {
    const char *a, *b;
    int same;
  } pair[] = {
      {"{\"order_id\":1001}", "{\"order_id\":\"1001\"}", 1},
      {"{\"order_id\":1001.0}", "{\"order_id\":\"1001\"}", 1},
      {"{\"order_id\":1e3}", "{\"order_id\":\"1000\"}", 1},
      {"{\"order_id\":1e21}", "{\"order_id\":\"1e+21\"}", 1},
      {"{\"order_id\":true}", "{\"order_id\":\"true\"}", 1},
      {"{\"order_id\":false}", "{\"order_id\":\"false\"}", 1},
      {"{\"order_id\":null}", "{\"order_id\":\"null\"}", 1},
      {"{\"amount_cents\":1}", "{\"order_id\":null}", 1}, /* absent: null */
      {"{\"order_id\":\"1001.0\"}", "{\"order_id\":1001}", 0},
      {"{\"order_id\":\" 1001\"}", "{\"order_id\":1001}", 0},
      {"{\"order_id\":true}", "{\"order_id\":\"True\"}", 0},
      {"{\"order_id\":{\"id\":1}}", "{\"order_id\":\"{\\\"id\\\":1}\"}", 0},
      {"{\"order_id\":[1001]}", "{\"order_id\":\"[1001]\"}", 0},
      {"{\"order_id\":[1001]}", "{\"order_id\":1001}", 0},
  };
  idem_policy *p = policy(FENCE_TEXT_POLICY);
  idem_guard *g = open_guard(p);
  idem_call c1 = {sizeof c1, "ft1", "c1", "refund_payment",
                  "{\"order_id\":1001,\"amount_cents\":6000}", 0, NULL, 0};
  idem_call c2 = {sizeof c2, "ft1", "c2", "refund_payment",
                  "{\"order_id\":\"1001\",\"amount_cents\":6000}", 0, NULL, 0};
  char f1[65], f2[65], sess[32];
  idem_record *r1, *r2;
  idem_step *s = NULL;
  const char *env;
  size_t i, len;
  c1.args_len = strlen(c1.args);
  c2.args_len = strlen(c2.args);

  /* order 1001 in doubt; its re-issue as "1001" is held, not run */
  left_unknown(g, &c1, 0);
  CHECK_INT(idem_guard_begin(g, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK); /* not EXECUTE */
  CHECK(idem_step_check_key(s) && strstr(idem_step_check_key(s), ":c1:"));
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  env = idem_step_envelope(s, &len);
  HAS(env, "\"duplicate_of\":\"c1\"");
  idem_step_free(s);
  s = NULL;
  /* the fingerprint and the key stay exact: one fence, two fingerprints */
  r1 = record(g, "ft1", "c1");
  r2 = record(g, "ft1", "c2");
  if (r1 && r2) {
    CHECK(strcmp(r1->fingerprint, r2->fingerprint) != 0);
    CHECK(strcmp(r1->key, r2->key) != 0);
    CHECK_STR(r1->fence_key, r2->fence_key);
  }
  idem_record_free(r1);
  idem_record_free(r2);
  /* so the call id c1 reused with "1001" is a conflict */
  c1.args = c2.args;
  c1.args_len = c2.args_len;
  CHECK_INT(idem_guard_begin(g, &c1, &s), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_CONFLICT);
  idem_step_free(s);
  s = NULL;

  /* which values are one order, and which are not */
  for (i = 0; i < sizeof pair / sizeof *pair; i++) {
    snprintf(sess, sizeof sess, "ftp%zu", i);
    run_applied(g, sess, "a", pair[i].a);
    run_applied(g, sess, "b", pair[i].b);
    fence_of(g, sess, "a", f1);
    fence_of(g, sess, "b", f2);
    CHECK(f1[0] && f2[0]);
    if ((strcmp(f1, f2) == 0) != pair[i].same) {
      fprintf(stderr, "fence: %s and %s should be %s\n", pair[i].a, pair[i].b,
              pair[i].same ? "one" : "two");
      check_failed++;
    } else
      check_passed++;
  }
  idem_guard_close(g);
  idem_policy_free(p);
}

/* An action recorded by an earlier idem, whose fence key took a value as
** its canonical JSON (order 2002 as 2002, not "2002"), and still in doubt:
** it fences a re-issue made after the upgrade (as 2002 or as "2002"), and
** the call that went ahead once it was found not applied fences its own
** replay.  The log is
** written as the earlier idem left it with the sqlite3 shell. */
static void test_fence_v0(void) {
  /* SHA-256 of "fl"\n"refund_payment"\n"order_id"=2002\n (the earlier
  ** key), of the same with "2002" (today's), and of order "ord_1" (a
  ** string: the same key then and now) */
  static const char V0[] =
      "78b59faa72a79e2df7ad71a0290572b6c7e1469150b9bd607f577b1c4ef7b0c2";
  static const char V1[] =
      "7b4844181de4f4611da38f7069905748f8cf14e8815d9b1ad4546cc34a87e520";
  static const char STR[] =
      "7e7c10c1f0dd68d560250ba6c8df496bb416c50af9502af66f14e2e3f3094d1f";
  static const char A[] = "{\"order_id\":2002,\"amount_cents\":6000}";
  idem_policy *p = policy(FENCE_TEXT_POLICY);
  idem_call c1 = {sizeof c1, "fl", "c1", "refund_payment", A, sizeof A - 1,
                  NULL, 0};
  idem_call c2 = c1;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_record *r;
  char url[4200], cmd[8600], f[65];
  const char *env, *fk = f;
  size_t len;
  c2.call_id = "c2";
  snprintf(url, sizeof url, "sqlite:%s/fence_v0.db", dir);
  CHECK_INT(idem_guard_open(url, p, &g), IDEM_OK);
  left_unknown(g, &c1, 1);
  fence_of(g, "fl", "c1", f);
  CHECK_STR(fk, V1);
  run_applied(g, "fl", "c3", "{\"order_id\":\"ord_1\"}");
  fence_of(g, "fl", "c3", f);
  CHECK_STR(fk, STR);
  idem_guard_close(g);
  g = NULL;
  if (system("command -v sqlite3 >/dev/null 2>&1") != 0) {
    fprintf(stderr, "test_fence_v0: no sqlite3 shell; the log of an earlier "
                    "idem is not tried\n");
    idem_policy_free(p);
    return;
  }
  snprintf(cmd, sizeof cmd,
           "sqlite3 '%s/fence_v0.db' \"UPDATE attempts SET fence_key = '%s' "
           "WHERE call_id = 'c1'\"",
           dir, V0);
  CHECK_INT(system(cmd), 0);
  CHECK_INT(idem_guard_open(url, p, &g), IDEM_OK);
  fence_of(g, "fl", "c1", f);
  CHECK_STR(fk, V0);
  /* a re-issue as "2002" after the upgrade is held by c1 too */
  c2.call_id = "c2s";
  c2.args = "{\"order_id\":\"2002\",\"amount_cents\":6000}";
  c2.args_len = strlen(c2.args);
  CHECK_INT(idem_guard_begin(g, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK(idem_step_check_key(s) && strstr(idem_step_check_key(s), ":c1:"));
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_UNKNOWN, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_OUTCOME_UNKNOWN);
  idem_step_free(s);
  s = NULL;
  c2 = c1;
  c2.call_id = "c2";
  /* the re-issue as it was is held by c1 and checks it */
  CHECK_INT(idem_guard_begin(g, &c2, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK(idem_step_check_key(s) && strstr(idem_step_check_key(s), ":c1:"));
  /* not applied, and nothing of c1 can land (settle_ms 0, it ended): c1
  ** is released and c2 goes ahead */
  CHECK_INT(idem_step_resolve(s, IDEM_OUTCOME_NOT_APPLIED, NULL, 0), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, "{\"re\":2}", 8, NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  idem_step_free(s);
  s = NULL;
  if ((r = record(g, "fl", "c1")) != NULL)
    CHECK_INT(r->state, IDEM_STATE_NOT_APPLIED);
  idem_record_free(r);
  /* c1 replayed: c2 carried it out, so it is answered already_applied
  ** naming c2, and nothing runs */
  CHECK_INT(idem_guard_begin(g, &c1, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_ALREADY_APPLIED);
  env = idem_step_envelope(s, &len);
  HAS(env, "\"duplicate_of\":\"c2\"");
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* The delivered time of sess_u/call_id. */
static long long told_at(idem_guard *g, const char *call_id) {
  idem_record *r = NULL;
  long long t = -1;
  if (idem_guard_record(g, "sess_u", call_id, &r) == IDEM_OK) t = r->delivered;
  idem_record_free(r);
  return t;
}

/* A step of sess_u/call_id in model turn `turn`, to its first move. */
static idem_step *begin_turn(idem_guard *g, const char *call_id,
                             const char *turn) {
  idem_call c = {sizeof c, "sess_u", call_id,      "refund_payment",
                 ARGS,     strlen(ARGS), turn, 0};
  idem_step *s = NULL;
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  return s;
}

/* "Told" undone (SPEC §10): an answer whose write failed is no delivery.
** The outcome then fences the model's re-issue again - already_applied,
** nothing run - and so does a deduplicated answer that did not reach the
** model; once an answer is told, a later turn's call is a new decision. */
static void test_undelivered(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_step *s = begin_turn(g, "u1", "t1");
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED,
                             "{\"refund_id\":\"re_u\"}", 20, NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(told_at(g, "u1"), 0);
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  CHECK(told_at(g, "u1") > 0);
  /* the write failed: undone, and undoing twice is harmless */
  CHECK_INT(idem_step_undelivered(s), IDEM_OK);
  CHECK_INT(told_at(g, "u1"), 0);
  CHECK_INT(idem_step_undelivered(s), IDEM_OK);
  idem_step_free(s);
  /* the re-issue of a later turn is fenced: u1 was never told */
  s = begin_turn(g, "u2", "t2");
  CHECK_INT(idem_step_next(s), IDEM_NEXT_ANSWER);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_ALREADY_APPLIED);
  CHECK_INT(told_at(g, "u2"), 0); /* nothing told before it is delivered */
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  CHECK(told_at(g, "u1") > 0 && told_at(g, "u2") > 0);
  CHECK_INT(idem_step_undelivered(s), IDEM_OK);
  CHECK_INT(told_at(g, "u1"), 0);
  CHECK_INT(told_at(g, "u2"), 0);
  idem_step_free(s);
  /* so the next re-issue is fenced too; told this time */
  s = begin_turn(g, "u3", "t3");
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_ALREADY_APPLIED);
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  idem_step_free(s);
  CHECK(told_at(g, "u1") > 0);
  /* a replay of a told outcome has nothing of its own to undo */
  s = begin_turn(g, "u1", "t1");
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(idem_step_delivered(s), IDEM_OK);
  CHECK_INT(idem_step_undelivered(s), IDEM_OK);
  CHECK(told_at(g, "u1") > 0);
  idem_step_free(s);
  /* told: a later turn's call is a new decision */
  s = begin_turn(g, "u4", "t4");
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  idem_step_free(s);
  CHECK_INT(idem_step_undelivered(NULL), IDEM_MISUSE);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* A record's retention counts from its settlement, not its creation: an
** action that ran longer than retention_s, and ones settled late (a late
** result, idem_guard_settle, an operator's verdict), are all kept for
** retention_s after that; gc then keeps them, and their calls replay. */
static void test_retention_from_settlement(void) {
  idem_policy *p = policy(
      "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
      "\"timeout_ms\":300,\"retries\":0,\"retention_s\":1}}}");
  idem_guard *g = open_guard(p);
  static const char *const ids[4] = {"long", "late", "settled", "resolved"};
  static const char *const args[4] = {"{\"order_id\":\"o_0\"}",
                                      "{\"order_id\":\"o_1\"}",
                                      "{\"order_id\":\"o_2\"}",
                                      "{\"order_id\":\"o_3\"}"};
  idem_call c = {sizeof c, "ret", NULL, "refund_payment", NULL, 0, NULL, 0};
  idem_step *s[4] = {NULL, NULL, NULL, NULL};
  long long token = 0;
  size_t removed = 99;
  int i;
  for (i = 0; i < 4; i++) {
    c.call_id = ids[i];
    c.args = args[i];
    c.args_len = strlen(args[i]);
    CHECK_INT(idem_guard_begin(g, &c, &s[i]), IDEM_OK);
    CHECK_INT(idem_step_next(s[i]), IDEM_NEXT_EXECUTE);
    if (i == 0) continue;
    /* timed out: in doubt, answered outcome_unknown */
    CHECK_INT(idem_step_finish(s[i], IDEM_OUTCOME_UNKNOWN, NULL, 0, "timeout"),
              IDEM_OK);
    CHECK_INT(idem_step_answer(s[i]), IDEM_ANSWER_OUTCOME_UNKNOWN);
    if (i == 2) token = idem_step_token(s[i]);
  }
  sleep_ms(1500); /* longer than the retention */
  CHECK_INT(idem_step_finish(s[0], IDEM_OUTCOME_APPLIED, "{\"re\":0}", 8,
                             NULL),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s[0]), IDEM_ANSWER_SUCCEEDED);
  CHECK_INT(idem_step_finish(s[1], IDEM_OUTCOME_APPLIED, "{\"re\":1}", 8,
                             NULL),
            IDEM_OK);
  CHECK_INT(idem_guard_settle(g, "ret", "settled", token,
                              IDEM_OUTCOME_APPLIED, "{\"re\":2}", 8),
            IDEM_OK);
  CHECK_INT(idem_guard_resolve(g, "ret", "resolved", IDEM_OUTCOME_APPLIED,
                               "{\"re\":3}", 8, NULL, "ops"),
            IDEM_OK);
  for (i = 0; i < 4; i++) idem_step_free(s[i]);
  CHECK_INT(idem_guard_gc(g, &removed), IDEM_OK);
  CHECK_INT((long long)removed, 0);
  for (i = 0; i < 4; i++) {
    idem_step *t = NULL;
    size_t len;
    c.call_id = ids[i];
    c.args = args[i];
    c.args_len = strlen(args[i]);
    CHECK_INT(idem_guard_begin(g, &c, &t), IDEM_OK);
    CHECK_INT(idem_step_next(t), IDEM_NEXT_ANSWER);
    CHECK_INT(idem_step_answer(t), IDEM_ANSWER_SUCCEEDED);
    HAS(idem_step_envelope(t, &len), "\"replayed\":true");
    idem_step_free(t);
  }
  /* a retention after the last settlement, they go */
  sleep_ms(1200);
  CHECK_INT(idem_guard_gc(g, &removed), IDEM_OK);
  CHECK_INT((long long)removed, 4);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* The attempt's result is recorded as late by its runner (the front end
** was held up - a log that could not be reached - past the deadline) before
** the front end's own finish: the front end's finish loses the race and
** answers the record's outcome - its own call's, not a replay - and the
** attempt counts once. */
static void test_late_before_finish(void) {
  idem_policy *p = policy(NOCHECK_POLICY);
  idem_guard *g = open_guard(p), *runner = NULL;
  idem_call c = {sizeof c, "lbf", "c1", "refund_payment", ARGS, strlen(ARGS),
                 NULL, 0};
  idem_step *s = NULL;
  idem_record *r;
  size_t len;
  char url[4200];
  snprintf(url, sizeof url, "%s", idem_guard_log(g));
  CHECK_INT(idem_guard_open(url, p, &runner), IDEM_OK);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_guard_late(runner, "lbf", "c1", idem_step_token(s),
                            IDEM_OUTCOME_APPLIED, "{\"re\":1}", 8, NULL, 1),
            IDEM_OK);
  if ((r = record(g, "lbf", "c1")) != NULL) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->attempts, 1);
  }
  idem_record_free(r);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_UNKNOWN, NULL, 0,
                             "no answer within 300 ms"),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  HAS(idem_step_envelope(s, &len), "\"replayed\":false,\"attempts\":1,");
  idem_step_free(s);
  s = NULL;
  /* asked again: now it is a replay */
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_answer(s), IDEM_ANSWER_SUCCEEDED);
  HAS(idem_step_envelope(s, &len), "\"replayed\":true,\"attempts\":1,");
  idem_step_free(s);
  idem_guard_close(runner);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* ---- the decision rules: one turn, one release, one decision ---------------- */

/* REFUND_POLICY whose effects end with the executor (settle_ms 0: a dead
** executor's attempt cannot land later), the fence on the order. */
static const char *RULES_POLICY =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":300,"
    "\"retries\":0,\"backoff_ms\":1,\"wait_ms\":300,\"settle_ms\":0,"
    "\"fence\":[\"order_id\"],"
    "\"status\":{\"tool\":\"get_refund_status\","
    "\"arguments\":{\"order_id\":\"{order_id}\"}}},"
    "\"get_refund_status\":{\"class\":\"read_only\"}}}";

/* A harness that begins (session, call_id) of turn (NULL: none) with args
** and dies before recording an outcome: this program again, as a process
** of its own.  Its record is left pending under a dead owner. */
static void begin_and_die(idem_guard *g, const char *policy_text,
                          const char *session, const char *call_id,
                          const char *turn, const char *args) {
  char url[4200], self[4200];
  char *argv[] = {self,           "--begin-and-die", url,
                  (char *)policy_text, (char *)session, (char *)call_id,
                  (char *)(turn ? turn : ""), (char *)args, NULL};
  int status = -1;
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  pid_t pid = -1;
  snprintf(url, sizeof url, "%s", idem_guard_log(g));
  self[n > 0 ? n : 0] = '\0';
  CHECK(posix_spawn(&pid, self, NULL, NULL, argv, environ) == 0);
  CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
        WEXITSTATUS(status) == 0);
}

static int begin_and_die_main(char **argv) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_call c = {sizeof c, argv[3], argv[4], "refund_payment", argv[6],
                 strlen(argv[6]), *argv[5] ? argv[5] : NULL, 0};
  if (idem_policy_parse(argv[2], strlen(argv[2]), "test", &p) != IDEM_OK ||
      idem_guard_open(argv[1], p, &g) != IDEM_OK ||
      idem_guard_begin(g, &c, &s) != IDEM_OK ||
      idem_step_next(s) != IDEM_NEXT_EXECUTE)
    _exit(1);
  _exit(0);
}

/* c1 applied but never told (the harness died after the outcome commit);
** in turn 2 the model's c2 is answered already_applied c1, and c3 of the
** same turn with the same arguments is the same decision: already_applied
** c1 too, nothing runs again. */
static void test_turn_after_already_applied(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_call c = {sizeof c, "ra", "c1", "refund_payment", ARGS, strlen(ARGS),
                 "ra_turn1", 0};
  idem_step *s = NULL;
  char *e, *res = NULL, *err = NULL;

  provider_reset(MODE_OK, 0);
  CHECK_INT(idem_guard_begin(g, &c, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(refund_run(NULL, idem_step_key(s), ARGS, strlen(ARGS), &res,
                       &err),
            IDEM_OUTCOME_APPLIED);
  CHECK_INT(idem_step_finish(s, IDEM_OUTCOME_APPLIED, res, strlen(res), NULL),
            IDEM_OK);
  idem_free(res);
  idem_step_free(s); /* never told */
  e = call_in(g, "ra", "c2", "refund_payment", ARGS, 1, "ra_turn2",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  e = call_in(g, "ra", "c3", "refund_payment", ARGS, 1, "ra_turn2",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c1\"");
  HAS(e, "re_1");
  free(e);
  CHECK_INT(applied(), 1);
  CHECK_INT(calls(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* c1 is found not applied and released; its repeat c2 goes ahead; later,
** in another turn, a separate decision c3 (another amount) is carried out.
** c1 replayed is answered already_applied c2 with c2's result - not c3. */
static void test_release_names_its_repeat(void) {
  idem_policy *p = policy(RULES_POLICY);
  idem_guard *g = open_guard(p);
  const char *other = "{\"order_id\":\"ord_1\",\"amount_cents\":7000}";
  char *e;

  provider_reset(MODE_OK, 0);
  begin_and_die(g, RULES_POLICY, "rb", "c1", "rb_turn1", ARGS);
  e = call_in(g, "rb", "c2", "refund_payment", ARGS, 1, "rb_turn2",
              "succeeded"); /* c1: checked, not applied, released */
  HAS(e, "re_1");
  free(e);
  e = call_in(g, "rb", "c3", "refund_payment", other, 1, "rb_turn3",
              "succeeded");
  HAS(e, "re_2");
  free(e);
  e = call_in(g, "rb", "c1", "refund_payment", ARGS, 1, "rb_turn1",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c2\"");
  HAS(e, "re_1");
  free(e);
  CHECK_INT(applied(), 2);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Turn 1: c1 carried out and told.  Turn 2: c2, a new decision, rejected
** by the provider, the harness dead before the outcome commit.  A late c3
** of turn 1 checks c2, finds it not applied, releases it - and coalesces
** with c1, so it does not go ahead.  The resumed c2 is its own decision:
** it runs (and is rejected again), it is not answered already_applied c1. */
static void test_release_only_to_a_repeat(void) {
  idem_policy *p = policy(RULES_POLICY);
  idem_guard *g = open_guard(p);
  char *e;

  provider_reset(MODE_OK, 0);
  e = call_in(g, "rc", "c1", "refund_payment", ARGS, 1, "rc_turn1",
              "succeeded");
  free(e);
  provider_reset(MODE_REJECT, 0);
  begin_and_die(g, RULES_POLICY, "rc", "c2", "rc_turn2", ARGS);
  e = call_in(g, "rc", "c3", "refund_payment", ARGS, 1, "rc_turn1",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c1\"");
  free(e);
  e = call_in(g, "rc", "c2", "refund_payment", ARGS, 1, "rc_turn2", "failed");
  HAS(e, "card expired");
  free(e);
  CHECK_INT(calls(), 1); /* c2's own decision, run */
  CHECK_INT(applied(), 0);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Turn 1: c3 is in flight when turn 2's identical c61 is made: held back
** by it (in_progress, recorded not applied, naming c3).  c3 then ends
** without an effect (outcome: the provider refused, or rejected it) and
** is told.  A late c71 of turn 2 goes ahead: it carries out the decision
** c61 re-issued, c3's (refund 1).  A late c78 of turn 1 is c3's decision:
** it is answered already_applied naming c71 and runs nothing - c3's turn
** finds the calls c3 held back and the turns that carried them out, as a
** replay of c3 would (walk seed 580; before, c78 ran: 2 refunds). */
static void handed_on_by(const char *session, int outcome) {
  idem_policy *p = policy(RULES_POLICY);
  idem_guard *g = open_guard(p);
  idem_call c3 = {sizeof c3, session, "c3", "refund_payment", ARGS,
                  strlen(ARGS), "turn1", 0};
  idem_step *s3 = NULL;
  idem_record *r = NULL;
  char *e;

  provider_reset(MODE_OK, 0);
  CHECK_INT(idem_guard_begin(g, &c3, &s3), IDEM_OK);
  CHECK_INT(idem_step_next(s3), IDEM_NEXT_EXECUTE); /* held in flight */
  e = call_in(g, session, "c61", "refund_payment", ARGS, 1, "turn2",
              "in_progress");
  HAS(e, "\"duplicate_of\":\"c3\"");
  free(e);
  CHECK_INT(idem_step_finish(s3, outcome, NULL, 0, "refused"), IDEM_OK);
  CHECK_INT(idem_step_answer(s3), IDEM_ANSWER_FAILED);
  CHECK_INT(idem_step_delivered(s3), IDEM_OK);
  idem_step_free(s3);
  sleep_ms(3);
  e = call_in(g, session, "c71", "refund_payment", ARGS, 1, "turn2",
              "succeeded");
  free(e);
  CHECK_INT(applied(), 1);
  sleep_ms(3);
  e = call_in(g, session, "c78", "refund_payment", ARGS, 1, "turn1",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c71\"");
  free(e);
  CHECK_INT(applied(), 1);
  CHECK_INT(calls(), 1);
  CHECK_INT(idem_guard_record(g, session, "c78", &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, IDEM_STATE_DEDUPLICATED);
    CHECK_STR(r->duplicate_of, "c71");
  }
  idem_record_free(r);
  idem_guard_close(g);
  idem_policy_free(p);
}

static void test_turn_finds_the_carrier(void) {
  handed_on_by("rd", IDEM_OUTCOME_NOT_APPLIED);
  handed_on_by("re", IDEM_OUTCOME_REJECTED);
}

/* Turn 2: c26 carried out and told.  Turn 3: c32, a new decision, in
** flight when a late c21 of turn 2 is made (another amount, the same
** order): held back by c32, though turn 2's decision was c26's.  c32 is
** rejected.  A late c48 of turn 3 is c32's decision, which ended without
** an effect: it runs - c21's turn is not c32's kin, for its first call
** (c26) was not held back by c32 (walk seed 141). */
static void test_kin_turn_decided_before(void) {
  idem_policy *p = policy(RULES_POLICY);
  idem_guard *g = open_guard(p);
  const char *other = "{\"order_id\":\"ord_1\",\"amount_cents\":7000}";
  idem_call c32 = {sizeof c32, "rf", "c32", "refund_payment", ARGS,
                   strlen(ARGS), "turn3", 0};
  idem_step *s32 = NULL;
  char *e;

  provider_reset(MODE_OK, 0);
  e = call_in(g, "rf", "c26", "refund_payment", ARGS, 1, "turn2",
              "succeeded");
  free(e);
  sleep_ms(3);
  CHECK_INT(idem_guard_begin(g, &c32, &s32), IDEM_OK);
  CHECK_INT(idem_step_next(s32), IDEM_NEXT_EXECUTE); /* held in flight */
  e = call_in(g, "rf", "c21", "refund_payment", other, 1, "turn2",
              "in_progress");
  HAS(e, "\"duplicate_of\":\"c32\"");
  free(e);
  CHECK_INT(idem_step_finish(s32, IDEM_OUTCOME_REJECTED, NULL, 0, "no"),
            IDEM_OK);
  CHECK_INT(idem_step_answer(s32), IDEM_ANSWER_FAILED);
  CHECK_INT(idem_step_delivered(s32), IDEM_OK);
  idem_step_free(s32);
  sleep_ms(3);
  e = call_in(g, "rf", "c48", "refund_payment", other, 1, "turn3",
              "succeeded");
  free(e);
  CHECK_INT(applied(), 2);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* Turn 1: c4 carried out and told.  Turn 2: c27, its harness dead before
** the outcome commit.  A late c28 of turn 1 checks c27, finds it not
** applied, releases it - and coalesces with c4.  c27's replay runs it
** again (its own decision; the provider refuses: not applied, told), and
** so does a replay after that: c27's name for c28 is history, c4 is not
** its decision.  A new c33 of turn 2 is c27's decision, which no call
** carried out: it runs (walk seed 546; before, both were answered
** already_applied naming c4). */
static void test_released_then_ran_itself(void) {
  idem_policy *p = policy(RULES_POLICY);
  idem_guard *g = open_guard(p);
  const char *other = "{\"order_id\":\"ord_1\",\"amount_cents\":7000}";
  char *e;

  provider_reset(MODE_OK, 0);
  e = call_in(g, "rg", "c4", "refund_payment", ARGS, 1, "turn1", "succeeded");
  free(e);
  sleep_ms(3);
  begin_and_die(g, RULES_POLICY, "rg", "c27", "turn2", ARGS);
  e = call_in(g, "rg", "c28", "refund_payment", other, 1, "turn1",
              "already_applied");
  HAS(e, "\"duplicate_of\":\"c4\"");
  free(e);
  provider_reset(MODE_FAIL_BEFORE, 0);
  e = call_in(g, "rg", "c27", "refund_payment", ARGS, 1, "turn2", "failed");
  free(e);
  e = call_in(g, "rg", "c27", "refund_payment", ARGS, 1, "turn2", "failed");
  HASNT(e, "c4");
  free(e);
  CHECK_INT(calls(), 2); /* c27 ran, and ran again */
  provider_reset(MODE_OK, 0);
  sleep_ms(3);
  e = call_in(g, "rg", "c33", "refund_payment", other, 1, "turn2",
              "succeeded");
  free(e);
  CHECK_INT(applied(), 1);
  idem_guard_close(g);
  idem_policy_free(p);
}

/* ---- clock steps -------------------------------------------------------- */

/* Guard one refund that names no turn (the coalescing window decides). */
static char *call_unnamed(idem_guard *g, const char *session,
                          const char *call_id, const char *want_status) {
  return call_in(g, session, call_id, "refund_payment", ARGS, 1, NULL,
                 want_status);
}

/* The wall clock steps back an hour (an NTP step, a VM resume) between a
** refund that was told and a new decision made 2 s later: the new one is
** carried out - the told refund, an hour in the "future" now, is not of its
** turn, and its delivery is not after the new call was made.  A burst
** after the step still coalesces.  And a wait for an action in flight
** lasts wait_ms whatever the wall clock does meanwhile. */
static void test_clock_step(void) {
  idem_policy *p = policy(REFUND_POLICY);
  idem_guard *g = open_guard(p);
  idem_call c1 = {sizeof c1, "ck2",        "c1", "refund_payment",
                  ARGS,      strlen(ARGS), NULL, 0};
  idem_call c2 = {sizeof c2, "ck2",        "c2", "refund_payment",
                  ARGS,      strlen(ARGS), NULL, 0};
  idem_step *s1 = NULL, *s2 = NULL;
  long long until;
  char *e;

  provider_reset(MODE_OK, 0);
  clock_step_ms = 0;
  e = call_unnamed(g, "ck1", "c1", "succeeded");
  free(e);
  CHECK_INT(applied(), 1);
  clock_step_ms = -3600000 + 2000; /* back an hour, then 2 s pass */
  e = call_unnamed(g, "ck1", "c2", "succeeded");
  HASNT(e, "this turn");
  free(e);
  CHECK_INT(applied(), 2);
  /* the same refund again at once: one turn with c2, coalesced */
  e = call_unnamed(g, "ck1", "c3", "already_applied");
  HAS(e, "\"duplicate_of\":\"c2\"");
  free(e);
  CHECK_INT(applied(), 2);

  /* c1 in flight; c2 waits for it (wait_ms 2000) while the clock steps
  ** back an hour: the wait still ends after about 2 s, in_progress */
  clock_step_ms = 0;
  CHECK_INT(idem_guard_begin(g, &c1, &s1), IDEM_OK);
  CHECK_INT(idem_step_next(s1), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_guard_begin(g, &c2, &s2), IDEM_OK);
  CHECK_INT(idem_step_next(s2), IDEM_NEXT_WAIT);
  clock_step_ms = -3600000;
  until = mono_ms() + 10000;
  while (idem_step_next(s2) == IDEM_NEXT_WAIT && mono_ms() < until) {
    sleep_ms(25);
    CHECK_INT(idem_step_poll(s2), IDEM_OK);
  }
  CHECK_INT(idem_step_next(s2), IDEM_NEXT_ANSWER);
  CHECK_INT(idem_step_answer(s2), IDEM_ANSWER_IN_PROGRESS);
  CHECK(mono_ms() < until - 5000);
  idem_step_free(s2);
  CHECK_INT(idem_step_finish(s1, IDEM_OUTCOME_APPLIED, "{}", 2, NULL), IDEM_OK);
  idem_step_free(s1);
  clock_step_ms = 0;
  idem_guard_close(g);
  idem_policy_free(p);
}

int main(int argc, char **argv) {
  if (argc == 3 && strcmp(argv[1], "--die-mid-call") == 0)
    return die_mid_call(argv[2]);
  if (argc == 8 && strcmp(argv[1], "--begin-and-die") == 0)
    return begin_and_die_main(argv + 1);
  if (argc == 3 && strcmp(argv[2], "rules") == 0) {
    dir = argv[1];
    test_turn_after_already_applied();
    test_release_names_its_repeat();
    test_release_only_to_a_repeat();
    test_turn_finds_the_carrier();
    test_kin_turn_decided_before();
    test_released_then_ran_itself();
    return check_done();
  }
  if (argc == 3 && strcmp(argv[2], "clock") == 0) {
    dir = argv[1];
    test_clock_step();
    return check_done();
  }
  if (argc != 2) {
    fprintf(stderr, "usage: test_guard DIR [clock|rules]\n");
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
  test_late_landing();
  test_late_settle_zero();
  test_late_settle_small();
  test_two_phase_inflight();
  test_ended_not_finished();
  test_own_check();
  test_dead_executor_dedupe();
  test_resolve_api();
  test_late_word_of_an_older_attempt();
  test_recover_inflight();
  test_fence_inflight();
  test_bad_log();
  test_fence_by_text();
  test_fence_v0();
  test_undelivered();
  test_retention_from_settlement();
  test_late_before_finish();
  return check_done();
}

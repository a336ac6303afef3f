/*
** bench_replay.c - the C side of bindings/python/bench.py, built as a
** small shared module (idem_bench_replay) that bench.py loads next to the
** binding, so that both sides replay the same records of the same log in
** the same process, round after round, under the same conditions.
**
** idem_bench_replay_c(g, calls, n) replays the n calls through
** idem_guard_call with nothing around them and returns the mean
** microseconds per replay, or -1 when one of them was not a replay of a
** succeeded call (the tool ran, or the answer was something else).
**
** idem_bench_steps_32(g, prefix, per) is the C half of bench_async.py: 32
** threads each making `per` guarded calls of distinct refunds (the
** arguments of `idem bench`'s guard_32) through the step API, as the
** binding's asyncio path drives them - begin, the tool applied at once,
** attempt_ended, finish, delivered - and returns the calls per second, or
** -1 when a call failed.  Beside guard_32 (idem_guard_call, which commits
** the delivery with the outcome) it is what the step API itself allows.
*/
#define _POSIX_C_SOURCE 200809L
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "idem.h"

#if defined(__GNUC__)
#define BENCH_API __attribute__((visibility("default")))
#else
#define BENCH_API
#endif

BENCH_API double idem_bench_replay_c(idem_guard *g, const idem_call *calls,
                                     int n);
BENCH_API double idem_bench_steps_32(idem_guard *g, const char *prefix,
                                     int per);

static int must_not_run(void *ctx, const char *key, const char *args,
                        size_t len, char **result, char **error) {
  (void)key;
  (void)args;
  (void)len;
  (void)result;
  (void)error;
  ++*(int *)ctx;
  return IDEM_OUTCOME_UNKNOWN;
}

static double mono(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double idem_bench_replay_c(idem_guard *g, const idem_call *calls, int n) {
  int ran = 0, bad = 0, i;
  idem_tool t = {sizeof t, must_not_run, NULL, NULL};
  double t0;
  t.ctx = &ran;
  if (n < 1) return -1;
  t0 = mono();
  for (i = 0; i < n; i++) {
    char *env = NULL;
    size_t len;
    if (idem_guard_call(g, &calls[i], &t, &env, &len) != IDEM_OK ||
        strncmp(env, "{\"status\":\"succeeded\"", 21) != 0)
      bad++;
    idem_free(env);
  }
  t0 = (mono() - t0) * 1e6 / n;
  return ran || bad ? -1 : t0;
}

typedef struct steps_session {
  idem_guard *g;
  const char *prefix;
  int id, per, failed;
} steps_session;

static void *steps_main(void *arg) {
  steps_session *ss = arg;
  static const char result[] = "{\"refund_id\":\"re_1\"}";
  char session[96], call[32], args[256];
  int i, k;
  snprintf(session, sizeof session, "%sbench_s%d", ss->prefix, ss->id);
  for (i = 0; i < ss->per; i++) {
    idem_call c;
    idem_step *s = NULL;
    memset(&c, 0, sizeof c);
    c.size = sizeof c;
    snprintf(call, sizeof call, "call_%d", i);
    k = snprintf(args, sizeof args,
                 "{\"order_id\":\"ord_%s_%s\",\"amount_cents\":6000,"
                 "\"currency\":\"usd\",\"reason\":\"late delivery\"}",
                 session, call);
    c.session = session;
    c.call_id = call;
    c.tool = "refund_payment";
    c.args = args;
    c.args_len = k > 0 ? (size_t)k : 0;
    if (idem_guard_begin(ss->g, &c, &s) != IDEM_OK ||
        idem_step_next(s) != IDEM_NEXT_EXECUTE ||
        idem_step_attempt_ended(s) != IDEM_OK ||
        idem_step_finish(s, IDEM_OUTCOME_APPLIED, result, strlen(result),
                         NULL) != IDEM_OK ||
        idem_step_next(s) != IDEM_NEXT_ANSWER ||
        idem_step_delivered(s) != IDEM_OK ||
        idem_step_answer(s) != IDEM_ANSWER_SUCCEEDED)
      ss->failed++;
    idem_step_free(s);
  }
  return NULL;
}

double idem_bench_steps_32(idem_guard *g, const char *prefix, int per) {
  pthread_t th[32];
  steps_session ss[32];
  int i, failed = 0;
  double t0 = mono();
  for (i = 0; i < 32; i++) {
    ss[i].g = g;
    ss[i].prefix = prefix;
    ss[i].id = i;
    ss[i].per = per;
    ss[i].failed = 0;
    pthread_create(&th[i], NULL, steps_main, &ss[i]);
  }
  for (i = 0; i < 32; i++) {
    pthread_join(th[i], NULL);
    failed += ss[i].failed;
  }
  t0 = mono() - t0;
  return failed ? -1 : 32.0 * per / t0;
}

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
** arguments of `idem bench`'s guard_32) through the blocking step API -
** begin, the tool applied at once, attempt_ended, finish, delivered - and
** returns the calls per second, or -1 when a call failed.  Beside
** guard_32 (idem_guard_call, which commits the delivery with the outcome)
** it is what the step API itself allows.
**
** idem_bench_queue_32(g, prefix, per) makes the same calls from one thread
** through the completion queue, as an event loop does (poll(2) on the
** queue's pipe; begin, then finish with IDEM_QUEUE_ENDED and
** IDEM_QUEUE_DELIVER): what the queue allows a binding with no cost of
** its own, the ceiling of asyncio's (and Node's) figure.
*/
#define _POSIX_C_SOURCE 200809L
#include <poll.h>
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
BENCH_API double idem_bench_queue_32(idem_guard *g, const char *prefix,
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

static const char result[] = "{\"refund_id\":\"re_1\"}";

/* The i-th call of session `session`: c points into call and args. */
static idem_call bench_call(const char *session, int i, char call[32],
                            char args[256]) {
  idem_call c;
  int k;
  memset(&c, 0, sizeof c);
  c.size = sizeof c;
  snprintf(call, 32, "call_%d", i);
  k = snprintf(args, 256,
               "{\"order_id\":\"ord_%s_%s\",\"amount_cents\":6000,"
               "\"currency\":\"usd\",\"reason\":\"late delivery\"}",
               session, call);
  c.session = session;
  c.call_id = call;
  c.tool = "refund_payment";
  c.args = args;
  c.args_len = k > 0 ? (size_t)k : 0;
  return c;
}

static void *steps_main(void *arg) {
  steps_session *ss = arg;
  char session[96], call[32], args[256];
  int i;
  snprintf(session, sizeof session, "%sbench_s%d", ss->prefix, ss->id);
  for (i = 0; i < ss->per; i++) {
    idem_call c = bench_call(session, i, call, args);
    idem_step *s = NULL;
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

typedef struct queue_session {
  char session[96], call[32], args[256];
  int next_i; /* the next call to begin */
} queue_session;

double idem_bench_queue_32(idem_guard *g, const char *prefix, int per) {
  static queue_session qs[32]; /* one run at a time */
  idem_completion c[64];
  idem_queue *q = NULL;
  int i, done = 0, failed = 0;
  double t0 = mono();
  if (idem_queue_open(g, &q) != IDEM_OK) return -1;
  for (i = 0; i < 32; i++) {
    idem_call k;
    snprintf(qs[i].session, sizeof qs[i].session, "%sbench_s%d", prefix, i);
    k = bench_call(qs[i].session, 0, qs[i].call, qs[i].args);
    qs[i].next_i = 1;
    if (idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, &qs[i]) != IDEM_OK)
      failed++;
  }
  while (done < 32 * per && !failed) {
    struct pollfd p = {idem_queue_fd(q), POLLIN, 0};
    size_t n = 0, j;
    if (poll(&p, 1, 10000) <= 0) {
      failed++;
      break;
    }
    c[0].size = sizeof c[0];
    idem_queue_pop(q, c, 64, &n);
    for (j = 0; j < n; j++) {
      queue_session *x = c[j].user;
      if (c[j].rc != IDEM_OK) {
        failed++;
        idem_step_free(c[j].step);
      } else if (c[j].next == IDEM_NEXT_EXECUTE) {
        if (idem_queue_finish(q, c[j].step, IDEM_OUTCOME_APPLIED, result,
                              sizeof result - 1, NULL,
                              IDEM_QUEUE_ENDED | IDEM_QUEUE_DELIVER,
                              x) != IDEM_OK)
          failed++;
      } else {
        failed += c[j].answer != IDEM_ANSWER_SUCCEEDED;
        idem_step_free(c[j].step);
        done++;
        if (x->next_i < per) {
          idem_call k = bench_call(x->session, x->next_i++, x->call, x->args);
          if (idem_queue_begin(q, &k, IDEM_QUEUE_DELIVER, x) != IDEM_OK)
            failed++;
        }
      }
    }
  }
  idem_queue_close(q);
  t0 = mono() - t0;
  return failed ? -1 : 32.0 * per / t0;
}

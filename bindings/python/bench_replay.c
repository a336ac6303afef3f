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
*/
#define _POSIX_C_SOURCE 200809L
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

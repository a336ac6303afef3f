/*
** metrics.c - this process's counters (idem_metrics_read, SPEC §9).
**
** What every guard of the process has done since it started: answers by
** kind, replays, fences, downstream attempts, late results, status checks
** by outcome, operators' verdicts, and the time from a call's begin to its
** answer.  They live in the process, not in the log: a replay writes
** nothing, and the log is shared by processes that each count their own.
**
** Each counter is a C11 atomic, added to with relaxed order: a guard's hot
** path pays one uncontended add per counter it moves, and no lock.  A read
** takes the counters one by one while others count, so a read is not one
** instant's picture - each counter is exact, and two of them may differ
** by the calls in flight between their loads (as Prometheus expects of
** counters scraped while they move).  The latency histogram keeps a count
** per bucket, and one for answers later than every bound (one add per
** answer); the read makes them cumulative, and their total is the count,
** so the buckets never say more than it.
*/
#include <stdatomic.h>
#include <string.h>

#include "idemInt.h"

#define N_ANSWERS 9
#define N_OUTCOMES 5

/* The buckets' upper bounds, in microseconds. */
static const long long bound_us[IDEM_LATENCY_BUCKETS] = {
    100,    250,    500,     1000,    2500,    5000,    10000,   25000,
    50000,  100000, 250000,  500000,  1000000, 2500000, 5000000, 10000000};

static atomic_llong answers[N_ANSWERS], replays, fenced, checks[N_OUTCOMES];
static atomic_llong counter[IDEM__M_N];
/* per bucket: answered within bound_us[i] and not within bound_us[i - 1];
** [IDEM_LATENCY_BUCKETS]: later than every bound */
static atomic_llong bucket[IDEM_LATENCY_BUCKETS + 1];
static atomic_llong lat_sum;

#define ADD(c, n) atomic_fetch_add_explicit(&(c), (n), memory_order_relaxed)
#define LOAD(c) atomic_load_explicit(&(c), memory_order_relaxed)

void idem__metric_add(int which) {
  if (which >= 0 && which < IDEM__M_N) ADD(counter[which], 1);
}

void idem__metric_check(int outcome) {
  if (outcome >= 0 && outcome < N_OUTCOMES) ADD(checks[outcome], 1);
}

void idem__metric_answer(int answer, int replayed, int was_fenced,
                         long long us) {
  int i = 0;
  if (answer >= 0 && answer < N_ANSWERS) ADD(answers[answer], 1);
  if (replayed) ADD(replays, 1);
  if (was_fenced) ADD(fenced, 1);
  if (us < 0) us = 0;
  while (i < IDEM_LATENCY_BUCKETS && us > bound_us[i]) i++;
  ADD(bucket[i], 1);
  ADD(lat_sum, us);
}

long long idem_latency_bound_us(int i) {
  return i >= 0 && i < IDEM_LATENCY_BUCKETS ? bound_us[i] : -1;
}

int idem_metrics_read(idem_metrics *out) {
  idem_metrics m;
  long long below = 0;
  int i;
  memset(&m, 0, sizeof m);
  m.size = sizeof m;
  for (i = 0; i < N_ANSWERS; i++) m.answers[i] = LOAD(answers[i]);
  for (i = 0; i < N_OUTCOMES; i++) m.checks[i] = LOAD(checks[i]);
  m.replays = LOAD(replays);
  m.fenced = LOAD(fenced);
  m.coalesced = LOAD(counter[IDEM__M_COALESCED]);
  m.attempts = LOAD(counter[IDEM__M_ATTEMPTS]);
  m.late = LOAD(counter[IDEM__M_LATE]);
  m.resolved = LOAD(counter[IDEM__M_RESOLVED]);
  for (i = 0; i < IDEM_LATENCY_BUCKETS; i++) {
    below += LOAD(bucket[i]);
    m.latency_le[i] = below;
  }
  m.latency_count = below + LOAD(bucket[IDEM_LATENCY_BUCKETS]);
  m.latency_sum_us = LOAD(lat_sum);
  return idem__abi_out(out, &m, sizeof m, IDEM__ABI_MIN(idem_metrics));
}

/*
** bench_store.c - the embedded store on one disk, in process (SPEC §12).
**
**   bench_store DIR [CALLS]
**
** Prints one JSON object per figure, measured in DIR (a fresh log, removed
** at the end):
**   fdatasync      write 4 KiB at offset 0 + fdatasync, 200 times: median
**   call_1         begin + change (pending -> succeeded, the guard's fast
**                  path) in one thread: median and mean, and their ratio to
**                  the fdatasync median (SPEC: at most 1.25)
** The two are measured interleaved, in ten rounds of 20 syncs and CALLS/10
** calls, so that a disk whose latency drifts (a shared machine) affects
** both alike.
**   call_32        32 threads doing the same: calls/s, and the ratio to the
**                  one-thread rate (SPEC: at least 5)
**   get            get() of an existing record: median and mean ns (SPEC:
**                  under 20 us)
** Not a test: numbers depend on the machine; nothing is asserted.
*/
#define _XOPEN_SOURCE 700
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "idemInt.h"

static double now_us(void) {
  struct timespec t;
  clock_gettime(CLOCK_MONOTONIC, &t);
  return (double)t.tv_sec * 1e6 + (double)t.tv_nsec / 1e3;
}

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

static double median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static double mean(const double *v, size_t n) {
  double s = 0;
  size_t i;
  for (i = 0; i < n; i++) s += v[i];
  return n ? s / (double)n : 0;
}

static double g_begin_us; /* when the last begin returned */

static const char FP[] =
    "3f1c0a9be2d4c6113f1c0a9be2d4c6113f1c0a9be2d4c6113f1c0a9be2d4c611";

/* One guarded call's store traffic: the write-ahead record, then success. */
static int call(idem__store *st, const char *session, int i, long long now) {
  char callid[32], key[96];
  idem_record rec;
  idem__change ch;
  int what = 0, rc;
  snprintf(callid, sizeof callid, "toolu_%d", i);
  snprintf(key, sizeof key, "%s:%s:3f1c0a9be2d4c611", session, callid);
  memset(&rec, 0, sizeof rec);
  rec.session = (char *)session;
  rec.call_id = callid;
  rec.tool = (char *)"refund_payment";
  rec.fingerprint = (char *)FP;
  rec.key = key;
  rec.args = (char *)"{\"amount_cents\":6000,\"order_id\":\"o_1\"}";
  rec.cls = IDEM_CLASS_GUARDED;
  rec.owner = (char *)"bench:1:1";
  rec.lease_until = now + 30000;
  rec.created = now;
  rec.expires = now + 604800000LL;
  /* the fence key differs per call: the common case, nothing fences */
  rec.fence_key = key;
  if ((rc = st->vt->begin(st, &rec, 0, 0, &what, NULL)) != IDEM_OK) return rc;
  g_begin_us = now_us();
  if (what != IDEM__BEGIN_INSERTED) return IDEM_ERROR;
  memset(&ch, 0, sizeof ch);
  ch.session = session;
  ch.call_id = callid;
  ch.from = 1u << IDEM_STATE_PENDING;
  ch.expect_token = 1;
  ch.state = IDEM_STATE_SUCCEEDED;
  ch.attempts_add = 1;
  ch.result = "{\"refund_id\":\"re_1\",\"amount_cents\":6000}";
  ch.resolution = IDEM_RESOLVED_EXECUTED;
  ch.delivered = -1;
  return st->vt->change(st, &ch, NULL);
}

typedef struct worker {
  idem__store *st;
  int id, n, errors;
} worker;

static void *worker_main(void *arg) {
  worker *w = arg;
  char session[32];
  int i;
  snprintf(session, sizeof session, "bench-t%d", w->id);
  for (i = 0; i < w->n; i++)
    if (call(w->st, session, i, 1700000000000LL) != IDEM_OK) w->errors++;
  return NULL;
}

int main(int argc, char **argv) {
  enum { SYNCS = 200, ROUNDS = 10, THREADS = 32 };
  char path[4096], dbpath[4096];
  static char page[4096];
  double *t, *tb, *tc, ts[SYNCS], fsync_med, med, avg, t0, elapsed, rate1,
      rate32;
  int calls = argc > 2 ? atoi(argv[2]) : 2000, i, fd, round, errors = 0;
  idem__store *st = NULL;
  pthread_t th[THREADS];
  static worker w[THREADS];
  if (argc < 2 || calls < 10) {
    fprintf(stderr, "usage: bench_store DIR [CALLS]\n");
    return 2;
  }
  t = malloc(sizeof *t * (size_t)(calls > 100000 ? calls : 100000));
  tb = malloc(sizeof *tb * (size_t)calls);
  tc = malloc(sizeof *tc * (size_t)calls);
  if (!t || !tb || !tc) return 1;

  /* the disk and one session, interleaved */
  snprintf(path, sizeof path, "%s/bench_store.fsync", argv[1]);
  fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
  if (fd < 0) {
    perror(path);
    return 1;
  }
  memset(page, 'x', sizeof page);
  snprintf(dbpath, sizeof dbpath, "%s/bench_store.db", argv[1]);
  unlink(dbpath);
  if (idem__store_open(dbpath, &st) != IDEM_OK) {
    fprintf(stderr, "bench_store: %s\n", st ? st->vt->errmsg(st) : "no memory");
    return 1;
  }
  for (i = 0; i < 300; i++) /* warm up: the WAL reaches its working size */
    errors += call(st, "warm", i, 1700000000000LL) != IDEM_OK;
  for (round = 0; round < ROUNDS; round++) {
    for (i = round * (SYNCS / ROUNDS); i < (round + 1) * (SYNCS / ROUNDS);
         i++) {
      t0 = now_us();
      if (pwrite(fd, page, sizeof page, 0) != (ssize_t)sizeof page ||
          fdatasync(fd) != 0) {
        perror("fdatasync");
        return 1;
      }
      ts[i] = now_us() - t0;
    }
    for (i = round * (calls / ROUNDS); i < (round + 1) * (calls / ROUNDS);
         i++) {
      t0 = now_us();
      errors += call(st, "bench-1", i, 1700000000000LL) != IDEM_OK;
      t[i] = now_us() - t0;
      tb[i] = g_begin_us - t0;
    }
  }
  close(fd);
  unlink(path);
  calls = ROUNDS * (calls / ROUNDS);
  avg = mean(ts, SYNCS);
  fsync_med = median(ts, SYNCS);
  printf("{\"figure\":\"fdatasync\",\"dir\":\"%s\",\"median_us\":%.1f,"
         "\"mean_us\":%.1f}\n",
         argv[1], fsync_med, avg);
  for (i = 0; i < calls; i++) tc[i] = t[i] - tb[i];
  avg = mean(t, (size_t)calls);
  med = median(t, (size_t)calls);
  rate1 = 1e6 / avg;
  printf("{\"figure\":\"call_1\",\"calls\":%d,\"median_us\":%.1f,"
         "\"mean_us\":%.1f,\"median_to_fdatasync\":%.2f,"
         "\"mean_to_fdatasync\":%.2f,\"calls_per_s\":%.0f,"
         "\"begin_median_us\":%.1f,\"change_median_us\":%.1f}\n",
         calls, med, avg, med / fsync_med, avg / fsync_med, rate1,
         median(tb, (size_t)calls), median(tc, (size_t)calls));

  /* 32 sessions */
  {
    long long b0 = idem__sqlite_count(st, IDEM__SQLITE_COUNT_BATCHES), b1;
    t0 = now_us();
    for (i = 0; i < THREADS; i++) {
      w[i].st = st;
      w[i].id = i;
      w[i].n = calls;
      w[i].errors = 0;
      pthread_create(&th[i], NULL, worker_main, &w[i]);
    }
    for (i = 0; i < THREADS; i++) {
      pthread_join(th[i], NULL);
      errors += w[i].errors;
    }
    elapsed = now_us() - t0;
    b1 = idem__sqlite_count(st, IDEM__SQLITE_COUNT_BATCHES);
    rate32 = (double)THREADS * calls / (elapsed / 1e6);
    printf("{\"figure\":\"call_32\",\"threads\":%d,\"calls\":%d,"
           "\"calls_per_s\":%.0f,\"ratio_to_1\":%.2f,"
           "\"requests_per_batch\":%.1f}\n",
           THREADS, THREADS * calls, rate32, rate32 / rate1,
           2.0 * THREADS * calls / (double)(b1 - b0));
  }

  /* replays: get() of existing records */
  {
    int n = 100000;
    char callid[32];
    idem_record *r;
    for (i = 0; i < n; i++) {
      snprintf(callid, sizeof callid, "toolu_%d", (i * 7919) % calls);
      t0 = now_us();
      r = NULL;
      errors += st->vt->get(st, "bench-1", callid, &r) != IDEM_OK;
      idem_record_free(r);
      t[i] = now_us() - t0;
    }
    avg = mean(t, (size_t)n);
    med = median(t, (size_t)n);
    printf("{\"figure\":\"get\",\"calls\":%d,\"median_ns\":%.0f,"
           "\"mean_ns\":%.0f}\n",
           n, med * 1000, avg * 1000);
  }
  st->vt->close(st);
  unlink(dbpath);
  free(t);
  free(tb);
  free(tc);
  if (errors) fprintf(stderr, "bench_store: %d calls failed\n", errors);
  return errors ? 1 : 0;
}

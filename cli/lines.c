/*
** lines.c - `--lines` modes: one JSON text per input line, one answer per
** output line, on every core.
**
** The input is read in large blocks.  Each block is cut at its last newline
** (the tail waits for the next block) and the complete lines are split into
** chunks (slices) at newline boundaries, eight per worker.  The workers -
** the calling thread and cli_workers() - 1 threads started once, each with
** its own state (an idem_canon handle) - take the chunks one after the
** other and turn each into output and error lists; then the calling thread
** writes the chunks in order.  So the output is exactly
** what a sequential loop would print: line N's answer is output line N,
** and each error (with its absolute line number) appears on stderr after
** the output of the lines before it.
**
** A regular file is mapped rather than read (no copy through the kernel),
** and its blocks overlap: the calling thread writes one block's answers
** while the workers run the next (two batches of slices alternate).  A
** pipe is read, block after block; a line longer than the size limit is
** then never held whole: the reader skips to its newline and reports it.
*/
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define BLOCK ((size_t)2 << 20)
#define MAX_WORKERS 16
#define CHUNKS_PER_WORKER 8 /* a block's chunks: enough to even out */
#define MAX_CHUNKS (MAX_WORKERS * CHUNKS_PER_WORKER)

typedef struct line_err {
  size_t line;   /* within the slice, from 0 */
  size_t out_at; /* output bytes of the slice before it */
  char *msg;
} line_err;

typedef struct slice {
  const char *data;
  size_t len;
  size_t lines; /* counted while processing */
  cli_outbuf out;
  line_err *errs;
  size_t nerr, cap_err;
  int nomem;
} slice;

int cli_workers(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  const char *env = getenv("IDEM_THREADS");
  if (env && *env) n = strtol(env, NULL, 10);
  if (n < 1) n = 1;
  if (n > MAX_WORKERS) n = MAX_WORKERS;
  return (int)n;
}

static void add_err(slice *s, size_t line, const char *msg) {
  line_err *e;
  if (s->nerr == s->cap_err) {
    size_t cap = s->cap_err ? s->cap_err * 2 : 16;
    line_err *v = realloc(s->errs, cap * sizeof *v);
    if (!v) {
      s->nomem = 1;
      return;
    }
    s->errs = v;
    s->cap_err = cap;
  }
  e = &s->errs[s->nerr++];
  e->line = line;
  e->out_at = s->out.len;
  e->msg = strdup(msg);
  if (!e->msg) s->nomem = 1;
}

static void run_slice(slice *s, cli_line_fn fn, void *state) {
  const char *p = s->data, *end = s->data + s->len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    const char *msg = fn(state, p, len, &s->out);
    if (msg) {
      add_err(s, s->lines, msg);
      if (cli_outbuf_put(&s->out, "\n", 1)) s->nomem = 1;
    }
    s->lines++;
    p += len + (nl != NULL);
  }
}

/* Write slice s (its lines numbered from base + 1); the count of errors. */
static size_t flush_slice(slice *s, size_t base) {
  size_t at = 0, i;
  for (i = 0; i < s->nerr; i++) {
    line_err *e = &s->errs[i];
    fwrite(s->out.p + at, 1, e->out_at - at, stdout);
    at = e->out_at;
    fflush(stdout);
    cli_err("line %zu: %s", base + e->line + 1, e->msg);
    free(e->msg);
  }
  if (s->out.len > at) fwrite(s->out.p + at, 1, s->out.len - at, stdout);
  return s->nerr;
}

/*
** One block's lines: cut into chunks (slices) at newline boundaries, which
** the workers take one after the other until none is left, so a worker
** that gets the cheap lines takes more of them and nobody waits for the
** slowest (equal cuts left the faster worker idle for ~20% of a block).
** Worker 0 is the calling thread; workers 1..n are a pool of threads
** started once for the whole input (a thread per block cost a clone, a
** new stack and a cold cache each time); each worker has its own state.
*/
typedef struct batch {
  slice sl[MAX_CHUNKS];
  int n;           /* chunks */
  atomic_int next; /* the next chunk to take */
  cli_line_fn fn;
} batch;

typedef struct pool pool;
typedef struct worker {
  pool *pl;
  void *state;
  pthread_t th;
} worker;

struct pool {
  pthread_mutex_t mu;
  pthread_cond_t go, done; /* a batch started / the helpers are done */
  batch *b;                /* the batch being worked on */
  unsigned gen;            /* batches started so far */
  int busy;                /* helpers not yet done with b */
  int stop;
  int nw; /* workers: the caller and the started threads */
  worker wk[MAX_WORKERS];
};

static void run_batch(batch *b, void *state) {
  int i;
  while ((i = atomic_fetch_add(&b->next, 1)) < b->n)
    run_slice(&b->sl[i], b->fn, state);
}

static void *run_helper(void *arg) {
  worker *w = arg;
  pool *pl = w->pl;
  unsigned seen = 0;
  pthread_mutex_lock(&pl->mu);
  for (;;) {
    batch *b;
    while (pl->gen == seen && !pl->stop) pthread_cond_wait(&pl->go, &pl->mu);
    if (pl->stop) break;
    seen = pl->gen;
    b = pl->b;
    pthread_mutex_unlock(&pl->mu);
    run_batch(b, w->state);
    pthread_mutex_lock(&pl->mu);
    if (--pl->busy == 0) pthread_cond_signal(&pl->done);
  }
  pthread_mutex_unlock(&pl->mu);
  return NULL;
}

/* Start the helper threads (states[1..n-1]); a thread that cannot be
** started leaves its share to the others. */
static void pool_start(pool *pl, void **states, int n) {
  int k;
  pthread_mutex_init(&pl->mu, NULL);
  pthread_cond_init(&pl->go, NULL);
  pthread_cond_init(&pl->done, NULL);
  pl->wk[0].state = states[0];
  pl->nw = 1;
  for (k = 1; k < n; k++) {
    worker *w = &pl->wk[pl->nw];
    w->pl = pl;
    w->state = states[k];
    if (pthread_create(&w->th, NULL, run_helper, w) == 0) pl->nw++;
  }
}

static void pool_stop(pool *pl) {
  int k;
  pthread_mutex_lock(&pl->mu);
  pl->stop = 1;
  pthread_cond_broadcast(&pl->go);
  pthread_mutex_unlock(&pl->mu);
  for (k = 1; k < pl->nw; k++) pthread_join(pl->wk[k].th, NULL);
  pthread_cond_destroy(&pl->done);
  pthread_cond_destroy(&pl->go);
  pthread_mutex_destroy(&pl->mu);
}

/* Reserve room for about n bytes of answers at once: growing by doubling
** moved a block's buffers two or three times each (each an mremap and a
** TLB shootdown).  Failure is not an error here: cli_outbuf_put tries
** again and reports it. */
static void outbuf_reserve(cli_outbuf *o, size_t n) {
  if (o->alloc < n && n > o->len) (void)cli_outbuf_reserve(o, n - o->len);
}

/* Cut the complete lines [data, data+len) into chunks and set the helpers
** on them; the caller is worker 0 (batch_run). */
static void batch_start(pool *pl, batch *b, const char *data, size_t len) {
  size_t off = 0;
  int k, want = pl->nw * CHUNKS_PER_WORKER;
  b->n = 0;
  for (k = 0; k < want && off < len; k++) {
    size_t cut = off + (len - off) / (size_t)(want - k);
    const char *nl;
    if (k == want - 1 || cut >= len)
      cut = len;
    else if ((nl = memchr(data + cut, '\n', len - cut)) != NULL)
      cut = (size_t)(nl - data) + 1;
    else
      cut = len;
    b->sl[k].data = data + off;
    b->sl[k].len = cut - off;
    b->sl[k].lines = 0;
    b->sl[k].out.len = 0;
    b->sl[k].nerr = 0;
    outbuf_reserve(&b->sl[k].out, (cut - off) + (cut - off) / 8 + 4096);
    off = cut;
    b->n++;
  }
  atomic_store(&b->next, 0);
  pthread_mutex_lock(&pl->mu);
  pl->b = b;
  pl->gen++;
  pl->busy = pl->nw - 1;
  pthread_cond_broadcast(&pl->go);
  pthread_mutex_unlock(&pl->mu);
}

/* Work on a started batch as worker 0 until its chunks are taken, then
** wait for the helpers to finish theirs. */
static void batch_run(pool *pl, batch *b) {
  run_batch(b, pl->wk[0].state);
  pthread_mutex_lock(&pl->mu);
  while (pl->busy) pthread_cond_wait(&pl->done, &pl->mu);
  pthread_mutex_unlock(&pl->mu);
}

/* Write a finished batch (its lines numbered from base + 1); returns the
** number of lines, adds the rejected ones to *rejected. */
static size_t batch_flush(batch *b, size_t base, size_t *rejected, int *nomem) {
  size_t lines = 0;
  int k;
  for (k = 0; k < b->n; k++) {
    *rejected += flush_slice(&b->sl[k], base + lines);
    lines += b->sl[k].lines;
    if (b->sl[k].nomem) *nomem = 1;
  }
  b->n = 0;
  return lines;
}

int cli_map_lines(int fd, size_t max, cli_line_fn fn, void **states,
                  int nstates) {
  size_t cap = BLOCK > max + 65536 ? BLOCK : max + 65536, have = 0;
  size_t base = 0, rejected = 0;
  batch *bt = calloc(2, sizeof *bt);
  char *buf = NULL;
  pool pl;
  int eof = 0, nomem = 0, rc = EXIT_OK, k, j;
  if (nstates > MAX_WORKERS) nstates = MAX_WORKERS;
  if (!bt) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  bt[0].fn = bt[1].fn = fn;
  for (j = 0; j < 2; j++)
    for (k = 0; k < MAX_CHUNKS; k++)
      cli_outbuf_init(&bt[j].sl[k].out, SIZE_MAX);
  memset(&pl, 0, sizeof pl);
  pool_start(&pl, states, nstates);
  {
    struct stat st;
    char *map;
    /* Not MAP_POPULATE: that maps every page up front in this one thread
    ** before any worker starts; faulted in as the workers read, the pages
    ** come 16 at a time (fault-around) on every core. */
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) !=
            MAP_FAILED) {
      size_t size = (size_t)st.st_size, pos = 0;
      int cur = 0;
      madvise(map, size, MADV_SEQUENTIAL);
      /* Two batches: while the other workers start on one block, this
      ** thread writes the answers of the block before, then joins them
      ** (so writing costs little wall time but the last block's). */
      while (pos < size && !nomem) {
        size_t end = size - pos > cap ? pos + cap : size, cut = end;
        if (end < size) { /* cut after the block's last newline */
          while (cut > pos && map[cut - 1] != '\n') cut--;
          if (cut == pos) { /* one line longer than a block */
            char *nl = memchr(map + pos, '\n', size - pos);
            cut = nl ? (size_t)(nl - map) + 1 : size;
          }
        }
        batch_start(&pl, &bt[cur], map + pos, cut - pos);
        base += batch_flush(&bt[!cur], base, &rejected, &nomem);
        batch_run(&pl, &bt[cur]);
        cur = !cur;
        pos = cut;
      }
      base += batch_flush(&bt[!cur], base, &rejected, &nomem);
      munmap(map, size);
      if (nomem) {
        cli_err("out of memory");
        rc = EXIT_FAIL;
      }
      goto done;
    }
  }
  if (!(buf = malloc(cap))) {
    cli_err("out of memory");
    rc = EXIT_FAIL;
    goto done;
  }
  while (!eof || have) {
    size_t cut;
    char *nl;
    while (!eof && have < cap) {
      ssize_t r = read(fd, buf + have, cap - have);
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) {
        cli_err("reading standard input: %s", strerror(errno));
        rc = EXIT_FAIL;
        goto done;
      }
      if (r == 0) eof = 1;
      have += (size_t)r;
    }
    if (have == 0) break;
    /* complete lines: up to the last newline (all of it at the end) */
    for (cut = have; cut > 0 && buf[cut - 1] != '\n'; cut--)
      ;
    if (eof) cut = have;
    if (cut == 0) {
      /* a block without a newline: one line longer than any text may be */
      fflush(stdout);
      cli_err("line %zu: text larger than the limit of %zu bytes at byte %zu",
              base + 1, max, max);
      fputc('\n', stdout);
      rejected++;
      base++;
      for (;;) { /* skip to its end */
        ssize_t r = read(fd, buf, cap);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
          eof = 1;
          have = 0;
          break;
        }
        if ((nl = memchr(buf, '\n', (size_t)r)) != NULL) {
          have = (size_t)r - (size_t)(nl + 1 - buf);
          memmove(buf, nl + 1, have);
          break;
        }
      }
      continue;
    }
    batch_start(&pl, &bt[0], buf, cut);
    batch_run(&pl, &bt[0]);
    base += batch_flush(&bt[0], base, &rejected, &nomem);
    memmove(buf, buf + cut, have - cut);
    have -= cut;
    if (nomem) {
      cli_err("out of memory");
      rc = EXIT_FAIL;
      goto done;
    }
  }
done:
  pool_stop(&pl);
  for (j = 0; j < 2; j++)
    for (k = 0; k < MAX_CHUNKS; k++) {
      cli_outbuf_free(&bt[j].sl[k].out);
      free(bt[j].sl[k].errs);
    }
  free(bt);
  free(buf);
  if (cli_flush() != EXIT_OK) return EXIT_FAIL;
  if (rc) return rc;
  return rejected ? EXIT_DATA : EXIT_OK;
}

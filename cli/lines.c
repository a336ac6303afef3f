/*
** lines.c - `--lines` modes: one JSON text per input line, one answer per
** output line, on every core.
**
** The input is read in large blocks.  Each block is cut at its last newline
** (the tail waits for the next block) and the complete lines are split into
** one slice per worker, at newline boundaries.  The workers - the calling
** thread and cli_workers() - 1 others, each with its own state (an
** idem_canon handle) - turn their slices into output and error lists; then
** the calling thread writes the slices in order.  So the output is exactly
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
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"

#define BLOCK ((size_t)8 << 20)
#define MAX_WORKERS 16

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
  cli_line_fn fn;
  void *state;
} slice;

int cli_workers(void) {
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  const char *env = getenv("IDEM_THREADS");
  if (env && *env) n = strtol(env, NULL, 10);
  if (n < 1) n = 1;
  if (n > MAX_WORKERS) n = MAX_WORKERS;
  return (int)n;
}

int cli_outbuf_put(cli_outbuf *o, const void *p, size_t n) {
  if (o->len + n > o->cap) {
    size_t cap = o->cap ? o->cap : 65536;
    char *q;
    while (cap < o->len + n) cap *= 2;
    if (!(q = realloc(o->p, cap))) return -1;
    o->p = q;
    o->cap = cap;
  }
  memcpy(o->p + o->len, p, n);
  o->len += n;
  return 0;
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

static void *run_slice(void *arg) {
  slice *s = arg;
  const char *p = s->data, *end = s->data + s->len;
  while (p < end) {
    const char *nl = memchr(p, '\n', (size_t)(end - p));
    size_t len = nl ? (size_t)(nl - p) : (size_t)(end - p);
    const char *msg = s->fn(s->state, p, len, &s->out);
    if (msg) {
      add_err(s, s->lines, msg);
      if (cli_outbuf_put(&s->out, "\n", 1)) s->nomem = 1;
    }
    s->lines++;
    p += len + (nl != NULL);
  }
  return NULL;
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

/* One block's lines on the workers: its slices and their threads. */
typedef struct batch {
  slice sl[MAX_WORKERS];
  pthread_t th[MAX_WORKERS];
  int started[MAX_WORKERS];
  int n;
} batch;

/*
** Cut the complete lines [data, data+len) into nw slices at newline
** boundaries and start a thread for each; slice 0 runs here instead when
** here is set (nobody else needs this thread meanwhile).
*/
static void batch_start(batch *b, const char *data, size_t len, int nw,
                        int here) {
  size_t off = 0;
  int k;
  b->n = 0;
  for (k = 0; k < nw && off < len; k++) {
    size_t want = (len - off) / (size_t)(nw - k), cut = off + want;
    const char *nl;
    if (k == nw - 1 || cut >= len)
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
    off = cut;
    b->n++;
  }
  for (k = here ? 1 : 0; k < b->n; k++)
    b->started[k] = pthread_create(&b->th[k], NULL, run_slice, &b->sl[k]) == 0;
  if (here && b->n) {
    run_slice(&b->sl[0]);
    b->started[0] = -1; /* done already */
  }
}

/* Wait for a started batch; a slice that got no thread (started 0) runs
** here. */
static void batch_wait(batch *b) {
  int k;
  for (k = 0; k < b->n; k++) {
    if (b->started[k] == 1)
      pthread_join(b->th[k], NULL);
    else if (b->started[k] == 0)
      run_slice(&b->sl[k]);
  }
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
  char *buf = malloc(cap);
  int eof = 0, nomem = 0, rc = EXIT_OK, k, j;
  if (nstates > MAX_WORKERS) nstates = MAX_WORKERS;
  if (!bt || !buf) {
    free(bt);
    free(buf);
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  for (j = 0; j < 2; j++)
    for (k = 0; k < nstates; k++) {
      bt[j].sl[k].fn = fn;
      bt[j].sl[k].state = states[k];
    }
  {
    struct stat st;
    char *map;
    if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 &&
        (map = mmap(NULL, (size_t)st.st_size, PROT_READ,
                    MAP_PRIVATE | MAP_POPULATE, fd, 0)) != MAP_FAILED) {
      size_t size = (size_t)st.st_size, pos = 0;
      int cur = 0;
      madvise(map, size, MADV_SEQUENTIAL);
      /* Two batches: while the workers run one block, this thread writes
      ** the answers of the block before (so writing costs no wall time
      ** but the last block's); it joins in when nothing waits to be
      ** written. */
      while (pos < size && !nomem) {
        size_t end = size - pos > cap ? pos + cap : size, cut = end;
        if (end < size) { /* cut after the block's last newline */
          while (cut > pos && map[cut - 1] != '\n') cut--;
          if (cut == pos) { /* one line longer than a block */
            char *nl = memchr(map + pos, '\n', size - pos);
            cut = nl ? (size_t)(nl - map) + 1 : size;
          }
        }
        batch_start(&bt[cur], map + pos, cut - pos, nstates, bt[!cur].n == 0);
        base += batch_flush(&bt[!cur], base, &rejected, &nomem);
        batch_wait(&bt[cur]);
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
    batch_start(&bt[0], buf, cut, nstates, 1);
    batch_wait(&bt[0]);
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
  for (j = 0; j < 2; j++)
    for (k = 0; k < MAX_WORKERS; k++) {
      free(bt[j].sl[k].out.p);
      free(bt[j].sl[k].errs);
    }
  free(bt);
  free(buf);
  if (cli_flush() != EXIT_OK) return EXIT_FAIL;
  if (rc) return rc;
  return rejected ? EXIT_DATA : EXIT_OK;
}

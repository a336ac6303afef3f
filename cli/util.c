/*
** util.c - option values, input reading and error printing for the verbs.
*/
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli.h"

void cli_err(const char *fmt, ...) {
  va_list ap;
  fputs("idem: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
}

int cli_usage(const char *verb, const char *fmt, ...) {
  va_list ap;
  fputs("idem: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  cli_print_usage(stderr, verb);
  return EXIT_USAGE;
}

void cli_print_usage(FILE *f, const char *verb) {
  const cli_verb *v;
  for (v = cli_verbs; v->name; v++)
    if (strcmp(v->name, verb) == 0) {
      fputs(v->usage, f);
      return;
    }
}

int cli_parse_size(const char *opt, const char *s, size_t lo, size_t hi,
                   size_t *out) {
  char *end;
  unsigned long long v;
  if (!s || !*s || *s == '-' || *s == '+') goto bad;
  errno = 0;
  v = strtoull(s, &end, 10);
  if (errno || *end || v < lo || v > hi) goto bad;
  *out = (size_t)v;
  return 0;
bad:
  cli_err("%s needs a whole number from %zu to %zu, not '%s'", opt, lo, hi,
          s ? s : "");
  return -1;
}

int cli_read_all(const char *path, size_t max, char **out, size_t *len,
                 int *truncated) {
  int fd = 0, err = 0;
  size_t cap = 65536, n = 0;
  char *buf;
  *out = NULL;
  *len = 0;
  *truncated = 0;
  if (path && strcmp(path, "-") != 0) {
    fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return errno;
  }
  buf = malloc(cap);
  if (!buf) {
    err = ENOMEM;
    goto done;
  }
  for (;;) {
    ssize_t r;
    if (n == cap) {
      char *nb;
      if (cap > max) { /* already holds max+1 bytes or more */
        *truncated = 1;
        break;
      }
      cap *= 2;
      nb = realloc(buf, cap);
      if (!nb) {
        err = ENOMEM;
        goto done;
      }
      buf = nb;
    }
    r = read(fd, buf + n, cap - n);
    if (r < 0) {
      if (errno == EINTR) continue;
      err = errno;
      goto done;
    }
    if (r == 0) break;
    n += (size_t)r;
  }
  if (n > max) *truncated = 1;
done:
  if (fd > 0) close(fd);
  if (err) {
    free(buf);
    return err;
  }
  *out = buf;
  *len = n;
  return 0;
}

int cli_lines_open(cli_lines *r, int fd, size_t max) {
  memset(r, 0, sizeof *r);
  r->fd = fd;
  r->max = max;
  r->cap = max < (1u << 20) ? (1u << 20) : max + (1u << 16);
  if (r->cap < (1u << 22)) r->cap = 1u << 22;
  r->buf = malloc(r->cap);
  return r->buf ? 0 : ENOMEM;
}

void cli_lines_close(cli_lines *r) {
  free(r->buf);
  r->buf = NULL;
}

/* Refill: keep the unread tail, read more behind it.  0 at end of input. */
static ssize_t refill(cli_lines *r) {
  ssize_t n;
  if (r->start > 0) {
    memmove(r->buf, r->buf + r->start, r->end - r->start);
    r->end -= r->start;
    r->start = 0;
  }
  do n = read(r->fd, r->buf + r->end, r->cap - r->end);
  while (n < 0 && errno == EINTR);
  if (n > 0) r->end += (size_t)n;
  if (n == 0) r->eof = 1;
  return n;
}

int cli_lines_next(cli_lines *r, const char **line, size_t *len,
                   int *too_long) {
  *too_long = 0;
  for (;;) {
    char *nl = memchr(r->buf + r->start, '\n', r->end - r->start);
    if (nl) {
      *line = r->buf + r->start;
      *len = (size_t)(nl - *line);
      r->start = (size_t)(nl - r->buf) + 1;
      r->lineno++;
      return 1;
    }
    if (r->eof) {
      if (r->start == r->end) return 0;
      *line = r->buf + r->start;
      *len = r->end - r->start;
      r->start = r->end;
      r->lineno++;
      return 1;
    }
    if (r->end - r->start > r->max) {
      /* Longer than any acceptable text: drop it up to its newline. */
      r->lineno++;
      *too_long = 1;
      *line = r->buf;
      *len = 0;
      for (;;) {
        r->start = r->end = 0;
        if (refill(r) < 0) return -1;
        nl = memchr(r->buf, '\n', r->end);
        if (nl) {
          r->start = (size_t)(nl - r->buf) + 1;
          return 1;
        }
        if (r->eof) {
          r->start = r->end;
          return 1;
        }
      }
    }
    if (refill(r) < 0) return -1;
  }
}

int cli_canon_limits(idem_canon *c, size_t depth, size_t bytes) {
  if (idem_canon_limit(c, IDEM_LIMIT_DEPTH, depth) != IDEM_OK ||
      idem_canon_limit(c, IDEM_LIMIT_BYTES, bytes) != IDEM_OK) {
    cli_err("cannot set the limits (depth %zu, bytes %zu)", depth, bytes);
    return -1;
  }
  return 0;
}

int cli_flush(void) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    cli_err("writing standard output: %s", strerror(errno));
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

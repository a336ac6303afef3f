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

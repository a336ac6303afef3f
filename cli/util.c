/*
** util.c - option values, input reading and error printing for the verbs.
*/
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run/run.h"

void cli_err(const char *fmt, ...) {
  va_list ap;
  fputs("idem: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
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

ssize_t cli_write_pipe(int fd, const void *p, size_t n) {
  sigset_t pipe_set, old, pending;
  struct timespec zero = {0, 0};
  ssize_t w;
  int e;
  sigemptyset(&pipe_set);
  sigaddset(&pipe_set, SIGPIPE);
  pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
  w = write(fd, p, n);
  e = errno;
  if (w < 0 && e == EPIPE && !sigismember(&old, SIGPIPE) &&
      sigpending(&pending) == 0 && sigismember(&pending, SIGPIPE))
    sigtimedwait(&pipe_set, NULL, &zero);
  pthread_sigmask(SIG_SETMASK, &old, NULL);
  errno = e;
  return w;
}

int cli_write_all(int fd, const void *p, size_t n) {
  const char *c = p;
  while (n) {
    ssize_t w = cli_write_pipe(fd, c, n);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return -1;
    c += w;
    n -= (size_t)w;
  }
  return 0;
}

int cli_reader_gone(int fd) {
  struct pollfd pf = {fd, POLLOUT, 0};
  int n;
  do n = poll(&pf, 1, 0);
  while (n < 0 && errno == EINTR);
  return n > 0 && (pf.revents & (POLLERR | POLLHUP | POLLNVAL));
}

int cli_flush(void) {
  if (fflush(stdout) != 0 || ferror(stdout)) {
    cli_err("writing standard output: %s", strerror(errno));
    return EXIT_FAIL;
  }
  return EXIT_OK;
}

/* ---- text for a terminal (cli.h has the rules) ------------------------------ */

/* Is code point c one that must not reach a terminal as it is: a C1
** control, or a bidi control that reorders what is shown around it? */
static int hidden_cp(unsigned long c) {
  return (c >= 0x80 && c <= 0x9F) || c == 0x200E || c == 0x200F ||
         (c >= 0x202A && c <= 0x202E) || (c >= 0x2066 && c <= 0x2069);
}

int cli_state_by_name(const char *name) {
  for (int i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
    if (strcmp(idem_state_name(i), name) == 0) return i;
  return 0;
}

void cli_hex(const void *p, size_t n, char *out) {
  static const char digit[] = "0123456789abcdef";
  const unsigned char *b = p;
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = digit[b[i] >> 4];
    out[2 * i + 1] = digit[b[i] & 15];
  }
  out[2 * n] = '\0';
}

/* ---- time ------------------------------------------------------------------- */

long long cli_mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

long long cli_wall_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_REALTIME, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

void cli_when(long long ms, char *buf, size_t n) {
  time_t t = (time_t)(ms / 1000);
  struct tm tm;
  if (ms <= 0) {
    snprintf(buf, n, "-");
    return;
  }
  gmtime_r(&t, &tm);
  strftime(buf, n, "%Y-%m-%dT%H:%M:%SZ", &tm);
}

void cli_sleep_ms(long long ms) {
  struct timespec ts;
  if (ms <= 0) return;
  ts.tv_sec = (time_t)(ms / 1000);
  ts.tv_nsec = (long)(ms % 1000) * 1000000L;
  while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    ;
}

/* ---- output buffers (buf.c has the buffer itself) ------------------------------ */

int cli_outbuf_json(cli_outbuf *o, idem_canon *c, const char *s) {
  const char *q;
  size_t n;
  if (!s) return cli_outbuf_put(o, "null", 4);
  if (idem_canon_string(c, s, strlen(s), &q, &n) != IDEM_OK) return -1;
  return cli_outbuf_put(o, q, n);
}

int cli_utf8_text(const char *p, size_t n) {
  size_t i = 0, k;
  while (i < n) {
    if (p[i] == '\0' || !(k = idem_utf8_char(p + i, n - i))) return 0;
    i += k;
  }
  return 1;
}

/* ---- text as shown ------------------------------------------------------------ */

/* The code point of the valid UTF-8 sequence p of n bytes (n >= 2). */
static unsigned long utf8_cp(const unsigned char *p, size_t n) {
  unsigned long c = p[0] & (0xFFu >> (n + 1));
  for (size_t i = 1; i < n; i++) c = c << 6 | (p[i] & 0x3Fu);
  return c;
}

/* One piece of the shown text at p: a character as it is, or its escape,
** into out (at most 7 bytes, NUL-terminated); returns the bytes of s it
** stands for (at least 1). */
static size_t text_piece(const unsigned char *p, const unsigned char *end,
                         int json, char out[8]) {
  size_t k = idem_utf8_char((const char *)p, (size_t)(end - p));
  if (*p < 0x20 || *p == 0x7F) {
    snprintf(out, 8, json ? "\\u%04x" : "\\x%02x", *p);
  } else if (*p == '\\' && !json) {
    memcpy(out, "\\\\", 3);
  } else if (k == 0) {
    snprintf(out, 8, "\\x%02x", *p);
    k = 1;
  } else if (k > 1 && hidden_cp(utf8_cp(p, k))) {
    snprintf(out, 8, "\\u%04lx", utf8_cp(p, k));
  } else {
    memcpy(out, p, k);
    out[k] = '\0';
  }
  return k;
}

/* Append s shown, up to width columns (SIZE_MAX: all of it); *cols is set
** to the columns written. */
static int text_put(cli_outbuf *o, const char *s, int json, size_t width,
                    size_t *cols) {
  const unsigned char *p = (const unsigned char *)(s ? s : "-");
  const unsigned char *end = p + strlen((const char *)p);
  char piece[8];
  *cols = 0;
  while (p < end) {
    size_t k = text_piece(p, end, json, piece);
    size_t n = strlen(piece), w = (unsigned char)piece[0] < 0x80 ? n : 1;
    if (w > width - *cols) break;
    if (cli_outbuf_put(o, piece, n)) return -1;
    *cols += w;
    p += k;
  }
  return 0;
}

int cli_text(cli_outbuf *o, const char *s, int json) {
  size_t cols;
  return text_put(o, s, json, SIZE_MAX, &cols);
}

int cli_text_cell(cli_outbuf *o, const char *s, size_t width) {
  size_t cols;
  if (text_put(o, s, 0, width, &cols)) return -1;
  for (; cols < width; cols++)
    if (cli_outbuf_put(o, " ", 1)) return -1;
  return 0;
}

/* {"io.idem/base64":"..."}: n bytes that are not text, all of them, in
** base64 (RFC 4648, padded).  n is at most CLI_MAX_OUTPUT and a little:
** the size cannot overflow. */
static char *bytes_json(const unsigned char *p, size_t n) {
  static const char b64[] =
      "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
  static const char head[] = "{\"" CLI_RESULT_BYTES "\":\"";
  char *json = malloc(sizeof head - 1 + (n + 2) / 3 * 4 + 3), *w;
  size_t i;
  if (!json) return NULL;
  memcpy(json, head, sizeof head - 1);
  w = json + sizeof head - 1;
  for (i = 0; i + 3 <= n; i += 3) {
    unsigned long v = (unsigned long)p[i] << 16 | p[i + 1] << 8 | p[i + 2];
    *w++ = b64[v >> 18];
    *w++ = b64[v >> 12 & 63];
    *w++ = b64[v >> 6 & 63];
    *w++ = b64[v & 63];
  }
  if (i < n) {
    unsigned long v = (unsigned long)p[i] << 16 |
                      (i + 1 < n ? (unsigned long)p[i + 1] << 8 : 0);
    *w++ = b64[v >> 18];
    *w++ = b64[v >> 12 & 63];
    *w++ = i + 1 < n ? b64[v >> 6 & 63] : '=';
    *w++ = '=';
  }
  memcpy(w, "\"}", 3);
  return json;
}

/* The result of a command as JSON (cli.h): text is recorded as it always
** was; bytes that are not text, exactly, as a "io.idem/base64" object. */
char *cli_result_json(const char *out, size_t len) {
  idem_canon *c = NULL;
  const char *canon;
  size_t clen;
  char *json = NULL;
  if (!out || len == 0) return NULL;
  if (!cli_utf8_text(out, len))
    return bytes_json((const unsigned char *)out, len);
  if (idem_canon_open(&c) != IDEM_OK) return NULL;
  idem_canon_limit(c, IDEM_LIMIT_BYTES, CLI_MAX_OUTPUT);
  if (idem_canon_json(c, out, len, &canon, &clen) != IDEM_OK) {
    /* not JSON: the text as a JSON string, without its last newline */
    if (out[len - 1] == '\n') len--;
    if (idem_canon_string(c, out, len, &canon, &clen) != IDEM_OK) canon = NULL;
  }
  if (canon && (json = malloc(clen + 1))) {
    memcpy(json, canon, clen);
    json[clen] = '\0';
  }
  idem_canon_close(c);
  return json;
}

/*
** buf.c - the command's growable byte buffer (buf.h).
*/
#include "buf.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

void cli_outbuf_init(cli_outbuf *o, size_t cap) {
  o->p = NULL;
  o->len = o->alloc = 0;
  o->cap = cap;
}

void cli_outbuf_free(cli_outbuf *o) {
  free(o->p);
  cli_outbuf_init(o, o->cap);
}

int cli_outbuf_reserve(cli_outbuf *o, size_t more) {
  size_t want, a;
  char *p;
  if (more > o->cap || o->len > o->cap - more || more >= SIZE_MAX - o->len)
    return -1;
  want = o->len + more + 1; /* and the NUL */
  if (want <= o->alloc) return 0;
  a = o->alloc ? o->alloc : 256;
  while (a < want) a = a > SIZE_MAX / 2 ? want : a * 2;
  if (!(p = realloc(o->p, a))) return -1;
  o->p = p;
  o->alloc = a;
  return 0;
}

int cli_outbuf_put(cli_outbuf *o, const void *p, size_t n) {
  if (cli_outbuf_reserve(o, n)) return -1;
  if (n) memcpy(o->p + o->len, p, n);
  o->len += n;
  o->p[o->len] = '\0';
  return 0;
}

int cli_outbuf_str(cli_outbuf *o, const char *s) {
  return cli_outbuf_put(o, s, strlen(s));
}

void cli_outbuf_consume(cli_outbuf *o, size_t n) {
  if (n >= o->len) {
    o->len = 0;
  } else {
    memmove(o->p, o->p + n, o->len - n);
    o->len -= n;
  }
  if (o->p) o->p[o->len] = '\0';
}

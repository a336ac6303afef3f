/*
** buf.c - growable byte buffers with a hard cap (see idem__buf in idemInt.h).
**
** Growth doubles the allocation so appends are amortized O(1); the cap is a
** promise that no input, however hostile, makes a buffer larger than its
** owner planned for.  Size arithmetic is checked before it is used.
*/
#include <string.h>

#include "idemInt.h"

void idem__buf_init(idem__buf *b, size_t cap) {
  b->p = NULL;
  b->len = 0;
  b->alloc = 0;
  b->cap = cap;
}

void idem__buf_free(idem__buf *b) {
  idem__free(b->p);
  idem__buf_init(b, b->cap);
}

int idem__buf_grow(idem__buf *b, size_t more) {
  size_t need, n;
  char *p;
  if (more > b->cap || b->len > b->cap - more) return IDEM_RANGE;
  need = b->len + more;
  if (need <= b->alloc) return IDEM_OK;
  n = b->alloc ? b->alloc : 256;
  while (n < need) n = n > b->cap / 2 ? b->cap : n * 2;
  if (n > b->cap) n = b->cap;
  p = idem__realloc(b->p, n);
  if (!p) return IDEM_NOMEM;
  b->p = p;
  b->alloc = n;
  return IDEM_OK;
}

int idem__buf_append(idem__buf *b, const void *src, size_t n) {
  int rc = idem__buf_reserve(b, n);
  if (rc != IDEM_OK) return rc;
  if (n) memcpy(b->p + b->len, src, n);
  b->len += n;
  return IDEM_OK;
}

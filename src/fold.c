/*
** fold.c - names compared as a reader sees them: case folded and in
** Unicode normalization form C (libunistring's u8_casefold, the full
** Unicode case folding followed by NFC), so "Refund", "REFUND" and
** "refund", or "café" precomposed and with a combining accent, fold to one
** text.  The policy warns when two of its tool names do (policy.c).
**
** The one file that includes libunistring's headers.  libunistring
** allocates with malloc; the folded text is copied into idem's allocator,
** so its caller frees it like any other (idem__free).  A failed allocation
** on either side is NULL.
*/
#include <stdlib.h>
#include <string.h>

#include <unicase.h>
#include <uninorm.h>

#include "idemInt.h"

char *idem__name_fold(const char *s, size_t *len) {
  size_t n = 0;
  uint8_t *f = u8_casefold((const uint8_t *)s, strlen(s), NULL, UNINORM_NFC,
                           NULL, &n);
  char *out;
  if (!f) return NULL;
  out = idem__strndup((const char *)f, n);
  free(f); /* libunistring's allocation */
  if (out && len) *len = n;
  return out;
}

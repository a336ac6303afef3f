/*
** fuzz_canon.c - libFuzzer target for the canonicalizer.
**
** Any input: no crash, no leak, no sanitizer report.  When the input is
** accepted, the canonical output must canonicalize to the very same bytes
** (canonical form is a fixed point; see below for its one exception), and
** the same
** text as tool arguments must mint a key exactly when it is an object.
** Strings are read sixteen bytes at a time where the CPU allows (SSSE3) and
** byte by byte otherwise: both must give the same answer, or the same error
** at the same offset, on every input.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "canon.h" /* idem__canon_simd */
#include "idem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static idem_canon *c, *c2, *cb;
  const char *out, *out2, *outb;
  size_t len, len2, lenb;
  char *copy;
  int rc, rcb;
  idem_key k;
  idem_call call = {sizeof call, "s", "c", "t", NULL, 0, NULL, 0};
  if (!c) {
    if (idem_canon_open(&c) != IDEM_OK || idem_canon_open(&c2) != IDEM_OK ||
        idem_canon_open(&cb) != IDEM_OK)
      abort();
    idem__canon_simd(cb, 0);
  }
  rc = idem_canon_json(c, (const char *)data, size, &out, &len);
  rcb = idem_canon_json(cb, (const char *)data, size, &outb, &lenb);
  if (rc != rcb) abort();
  if (rc == IDEM_OK && (len != lenb || memcmp(out, outb, len) != 0)) abort();
  if (rc != IDEM_OK && (idem_canon_erroffset(c) != idem_canon_erroffset(cb) ||
                        strcmp(idem_canon_errmsg(c), idem_canon_errmsg(cb))))
    abort();
  if (rc != IDEM_OK) {
    if (idem_canon_errmsg(c)[0] == '\0') abort(); /* every error says why */
    if (idem_canon_erroffset(c) > size) abort();  /* and points inside */
    return 0;
  }
  /* c2 re-reads c's output, which stays valid until c's next call.  The one
  ** allowed refusal: 1e20 prints as 100000000000000000000, an integer
  ** literal beyond 2^53 that the input rules refuse (SPEC §4). */
  rc = idem_canon_json(c2, out, len, &out2, &len2);
  if (rc != IDEM_OK && rc != IDEM_JSON_BIGINT) abort();
  if (rc == IDEM_OK && (len2 != len || memcmp(out, out2, len) != 0)) abort();
  copy = malloc(len ? len : 1);
  if (!copy) abort();
  memcpy(copy, out, len);
  call.args = (const char *)data;
  call.args_len = size;
  rc = idem_key_mint(c, &call, NULL, &k);
  if ((rc == IDEM_OK) != (copy[0] == '{')) abort();
  if (rc == IDEM_OK && (k.args_len != len || memcmp(k.args, copy, len) != 0))
    abort();
  free(copy);
  return 0;
}

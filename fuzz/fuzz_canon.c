/*
** fuzz_canon.c - libFuzzer target for the canonicalizer.
**
** Any input: no crash, no leak, no sanitizer report.  When the input is
** accepted, the canonical output must canonicalize to the very same bytes
** (canonical form is a fixed point; see below for its one exception), and
** the same
** text as tool arguments must mint a key exactly when it is an object.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static idem_canon *c, *c2;
  const char *out, *out2;
  size_t len, len2;
  char *copy;
  int rc;
  idem_key k;
  idem_call call = {"s", "c", "t", NULL, 0};
  if (!c && (idem_canon_open(&c) != IDEM_OK || idem_canon_open(&c2) != IDEM_OK))
    abort();
  rc = idem_canon_json(c, (const char *)data, size, &out, &len);
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

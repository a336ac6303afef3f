/*
** fuzz_key.c - libFuzzer target for call objects as `idem key --lines`
** reads them ({"session","call","tool","args"}), with a key_arg.
**
** Any input: no crash, no leak.  A minted key is either "h:" and 64 hex
** digits or three ':'-separated parts whose last is the fingerprint's first
** 16 digits, and is never longer than key_max_len.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "idem.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static idem_canon *c;
  idem_keyspec spec = {sizeof spec, "idempotency_key", 100};
  idem_key k;
  int rc;
  if (!c && idem_canon_open(&c) != IDEM_OK) abort();
  rc = idem_key_mint_json(c, (const char *)data, size, &spec, &k);
  if (rc != IDEM_OK) {
    if (idem_canon_errmsg(c)[0] == '\0') abort();
    return 0;
  }
  if (k.key_len > 100 || strlen(k.fingerprint) != 64) abort();
  if (k.key[0] == 'h' && k.key[1] == ':') {
    if (k.key_len != 66) abort();
  } else {
    const char *last = strrchr(k.key, ':');
    if (!last || k.key_len - (size_t)(last + 1 - k.key) != 16 ||
        memcmp(last + 1, k.fingerprint, 16) != 0)
      abort();
  }
  if (strstr(k.args, "\"idempotency_key\":") == k.args + 1) abort();
  return 0;
}

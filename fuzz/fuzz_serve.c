/*
** fuzz_serve.c - libFuzzer target for what `idem serve` reads from its
** clients apart from HTTP (cli/serve/parse.c): a listing's cursor, and a
** verdict's body.
**
** The input is tried as both.  Invariants: no crash, no leak; a cursor
** that reads names a record (created > 0, both names) and makes the same
** cursor again; a body that reads has a session, a call id and a verdict,
** and "not applied" has its reason and no result; a body refused says
** why.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "../cli/serve/parse.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Make the cursor of (created, session, call_id) and read it back. */
static void round_trip(idem_canon *c, long long created, const char *session,
                       const char *call_id) {
  serve_cursor back;
  char *hex = serve_cursor_make(c, created, session, call_id);
  if (!hex) return; /* out of memory, or text that is not UTF-8 */
  if (serve_cursor_read(hex, &back) != 0 || back.created != created ||
      strcmp(back.session, session) != 0 ||
      strcmp(back.call_id, call_id) != 0)
    abort();
  json_decref(back.held);
  free(hex);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *text = malloc(size + 1), err[300];
  idem_canon *c = NULL;
  serve_cursor cur;
  serve_verdict v;
  if (!text || idem_canon_open(&c) != IDEM_OK) {
    free(text);
    return 0;
  }
  memcpy(text, data, size);
  text[size] = '\0';
  if (serve_cursor_read(text, &cur) == 0) {
    if (cur.created <= 0 || !cur.session || !cur.call_id) abort();
    round_trip(c, cur.created, cur.session, cur.call_id);
    json_decref(cur.held);
  }
  err[0] = '\0';
  if (serve_verdict_read((const char *)data, size, &v, err, sizeof err) == 0) {
    if (!v.session || !v.call_id || v.held == NULL ||
        (v.outcome != IDEM_OUTCOME_APPLIED &&
         v.outcome != IDEM_OUTCOME_NOT_APPLIED) ||
        (v.outcome == IDEM_OUTCOME_NOT_APPLIED &&
         (!v.reason || !*v.reason || v.result)))
      abort();
    round_trip(c, 1 + (long long)size, v.session, v.call_id);
    serve_verdict_free(&v);
  } else if (!err[0]) {
    abort();
  }
  idem_canon_close(c);
  free(text);
  return 0;
}

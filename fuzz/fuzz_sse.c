/*
** fuzz_sse.c - the SSE reader of `idem mcp`'s HTTP upstream
** (cli/mcp/sse.c).
**
** Properties checked on every input: no crash or leak; every event handed
** over is within the bound, or marked oversized; and the stream read in
** one piece gives exactly the events (and the last event id) it gives
** read in pieces cut at the points the input's first byte chooses - a
** network delivers a stream in any pieces.
*/
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "mcp/mcp.h"

#define MAX 512

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

typedef struct seen {
  cli_outbuf all; /* every event, each as its length and bytes */
  unsigned n;
} seen;

static void on_event(void *ctx, const char *data, size_t n, int oversized) {
  seen *s = ctx;
  unsigned char head[9];
  if (oversized ? data != NULL || n : data == NULL || n > MAX) abort();
  head[0] = (unsigned char)oversized;
  memcpy(head + 1, &n, sizeof n < 8 ? sizeof n : 8);
  if (cli_outbuf_put(&s->all, head, sizeof head) ||
      (n && cli_outbuf_put(&s->all, data, n)))
    abort();
  s->n++;
}

static void read_all(const uint8_t *p, size_t n, size_t step, seen *s,
                     char *id, int *has_id) {
  mcp_sse r;
  size_t i = 0;
  mcp_sse_init(&r, MAX);
  cli_outbuf_init(&s->all, (size_t)-1);
  s->n = 0;
  while (i < n) {
    size_t k = step && n - i > step ? step : n - i;
    if (mcp_sse_feed(&r, (const char *)p + i, k, on_event, s)) abort();
    i += k;
  }
  memcpy(id, r.id, sizeof r.id);
  *has_id = r.has_id;
  mcp_sse_free(&r);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  seen a, b;
  char ida[256], idb[256];
  int ha, hb;
  size_t step;
  if (!size) return 0;
  step = (size_t)(data[0] % 7) + 1;
  data++;
  size--;
  read_all(data, size, 0, &a, ida, &ha);
  read_all(data, size, step, &b, idb, &hb);
  if (a.n != b.n || a.all.len != b.all.len ||
      (a.all.len && memcmp(a.all.p, b.all.p, a.all.len)) || ha != hb ||
      (ha && strcmp(ida, idb)))
    abort();
  cli_outbuf_free(&a.all);
  cli_outbuf_free(&b.all);
  return 0;
}

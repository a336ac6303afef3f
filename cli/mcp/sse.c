/*
** sse.c - reading a text/event-stream (the WHATWG HTML "server-sent
** events" format), as an MCP Streamable HTTP server answers a POST or a
** GET: bytes in, whole events out (mcp.h).
**
** Lines end in CRLF, LF or CR; a blank line ends an event.  "data: x"
** lines join with newlines into the event's data; "id: x" sets the last
** event id (kept across events: it is what a client sends back in
** Last-Event-ID to resume); "event:" and "retry:" are read and left;
** lines starting with ':' are comments (keep-alives).  An event with no
** data is not handed over.  One event's data is bounded: a longer one is
** skipped to its end and handed over once with oversized set, so that its
** reader can fail the request it answered instead of waiting for it.
*/
#include <string.h>

#include "mcp.h"

void mcp_sse_init(mcp_sse *s, size_t max) {
  memset(s, 0, sizeof *s);
  cli_outbuf_init(&s->line, max + 64);
  cli_outbuf_init(&s->data, max);
}

void mcp_sse_free(mcp_sse *s) {
  cli_outbuf_free(&s->line);
  cli_outbuf_free(&s->data);
}

static int field(mcp_sse *s, const char *p, size_t n, mcp_sse_fn fn,
                 void *ctx) {
  const char *colon, *v;
  size_t fl, vl;
  if (n == 0) { /* a blank line: the event ends */
    int big = s->oversized, has = s->has_data;
    s->oversized = s->has_data = 0;
    if (big) {
      s->data.len = 0;
      fn(ctx, NULL, 0, 1);
    } else if (has) {
      fn(ctx, s->data.p ? s->data.p : "", s->data.len, 0);
    }
    s->data.len = 0;
    return 0;
  }
  if (p[0] == ':') return 0; /* a comment */
  colon = memchr(p, ':', n);
  fl = colon ? (size_t)(colon - p) : n;
  v = colon ? colon + 1 : p + n;
  vl = colon ? n - fl - 1 : 0;
  if (vl && v[0] == ' ') {
    v++;
    vl--;
  }
  if (fl == 4 && memcmp(p, "data", 4) == 0) {
    if (s->oversized) return 0;
    if ((s->has_data && cli_outbuf_put(&s->data, "\n", 1)) ||
        cli_outbuf_put(&s->data, v, vl)) {
      if (s->data.len + vl + 1 < s->data.len || /* overflow: not memory */
          s->data.len + vl + 1 > s->data.cap) {
        s->oversized = 1;
        s->data.len = 0;
        return 0;
      }
      return -1;
    }
    s->has_data = 1;
  } else if (fl == 2 && memcmp(p, "id", 2) == 0) {
    if (!memchr(v, '\0', vl) && vl < sizeof s->id) {
      memcpy(s->id, v, vl);
      s->id[vl] = '\0';
      s->has_id = vl > 0;
    }
  }
  return 0;
}

int mcp_sse_feed(mcp_sse *s, const char *p, size_t n, mcp_sse_fn fn,
                 void *ctx) {
  size_t i = 0;
  if (!s->started && n) {
    /* a UTF-8 byte order mark before the first line is dropped */
    static const char bom[] = "\xEF\xBB\xBF";
    while (i < n && s->bom < 3 && p[i] == bom[s->bom]) {
      s->bom++;
      i++;
    }
    if (i == n && s->bom < 3) return 0;
    s->started = 1;
    if (s->bom < 3 && s->bom > 0) { /* not a BOM after all: keep its bytes */
      if (cli_outbuf_put(&s->line, bom, (size_t)s->bom)) return -1;
    }
  }
  while (i < n) {
    char ch = p[i];
    if (s->cr) { /* a CR ended the last line: an LF right after is its */
      s->cr = 0;
      if (ch == '\n') {
        i++;
        continue;
      }
    }
    if (ch == '\n' || ch == '\r') {
      s->cr = ch == '\r';
      if (!s->line_over &&
          field(s, s->line.p ? s->line.p : "", s->line.len, fn, ctx))
        return -1;
      s->line.len = 0;
      s->line_over = 0;
      i++;
      continue;
    }
    {
      const char *e1 = memchr(p + i, '\n', n - i), *e2 = memchr(p + i, '\r', n - i);
      const char *e = !e1 ? e2 : !e2 ? e1 : e1 < e2 ? e1 : e2;
      size_t k = e ? (size_t)(e - (p + i)) : n - i;
      if (!s->line_over && cli_outbuf_put(&s->line, p + i, k)) {
        if (s->line.len + k > s->line.cap) { /* a line past any event's size */
          s->line_over = 1;
          s->line.len = 0;
          if (!s->oversized && s->has_data) s->data.len = 0;
          s->oversized = 1;
        } else {
          return -1;
        }
      }
      i += k;
    }
  }
  return 0;
}

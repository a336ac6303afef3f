/*
** reply.c - the JSON answers of `idem serve` that every route shares: an
** error, and a body written with cli_jsonw handed over.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

void serve_error(serve_reply *out, unsigned status, const char *fmt, ...) {
  char msg[1024];
  idem_canon *c = NULL;
  cli_jsonw w;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (idem_canon_open(&c) != IDEM_OK) c = NULL;
  cli_jsonw_init(&w, c, (size_t)1 << 20);
  cli_jsonw_open(&w);
  cli_jsonw_str(&w, "error", msg);
  cli_jsonw_close(&w);
  w.err |= !c;
  serve_take_json(out, status, &w);
  idem_canon_close(c);
}

void serve_take_json(serve_reply *out, unsigned status, cli_jsonw *w) {
  out->type = "application/json";
  if (w->err) {
    cli_outbuf_free(&w->b);
    out->status = 500;
    out->body = strdup("{\"error\":\"out of memory\"}");
    out->len = out->body ? strlen(out->body) : 0;
    return;
  }
  out->status = status;
  out->body = w->b.p; /* taken */
  out->len = w->b.len;
  memset(&w->b, 0, sizeof w->b);
}

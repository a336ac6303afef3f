/*
** reply.c - the JSON answers of `idem serve` that every route shares: a
** body written with cli_jsonw, handed over; an error.
*/
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "serve.h"

/* The answer when memory ran out on the way to one. */
static void out_of_memory(serve_reply *out) {
  out->type = "application/json";
  out->status = 500;
  out->body = strdup("{\"error\":\"out of memory\"}");
  out->len = out->body ? strlen(out->body) : 0;
}

int serve_json_open(serve_reply *out, cli_jsonw *w, size_t cap) {
  idem_canon *c = NULL;
  if (idem_canon_open(&c) != IDEM_OK) {
    out_of_memory(out);
    return -1;
  }
  cli_jsonw_init(w, c, cap);
  return 0;
}

void serve_json_drop(cli_jsonw *w) {
  cli_outbuf_free(&w->b);
  idem_canon_close(w->c);
  w->c = NULL;
}

void serve_json_done(serve_reply *out, unsigned status, cli_jsonw *w) {
  if (w->err) {
    serve_json_drop(w);
    out_of_memory(out);
    return;
  }
  out->type = "application/json";
  out->status = status;
  out->body = w->b.p; /* taken */
  out->len = w->b.len;
  memset(&w->b, 0, sizeof w->b);
  serve_json_drop(w);
}

void serve_error(serve_reply *out, unsigned status, const char *fmt, ...) {
  char msg[1024];
  cli_jsonw w;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (serve_json_open(out, &w, (size_t)1 << 20) != 0) return;
  cli_jsonw_open(&w);
  cli_jsonw_str(&w, "error", msg);
  cli_jsonw_close(&w);
  serve_json_done(out, status, &w);
}

/*
** parse.c - the cursor of a listing and the body of a verdict, as `idem
** serve` reads them from clients (parse.h).
*/
#include <ctype.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"

char *serve_cursor_make(idem_canon *c, long long created, const char *session,
                        const char *call_id) {
  cli_jsonw w;
  char *hex = NULL;
  /* "c":N,"s":S,"i":C - an object's members without its braces */
  cli_jsonw_init(&w, c, (size_t)1 << 16);
  cli_jsonw_num(&w, "c", created);
  cli_jsonw_str(&w, "s", session);
  cli_jsonw_str(&w, "i", call_id);
  if (!w.err && (hex = malloc(2 * w.b.len + 1)))
    cli_hex(w.b.p, w.b.len, hex);
  cli_outbuf_free(&w.b);
  return hex;
}

static int hex_digit(int ch) {
  if (ch >= '0' && ch <= '9') return ch - '0';
  ch = tolower(ch);
  return ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
}

int serve_cursor_read(const char *hex, serve_cursor *out) {
  size_t n = strlen(hex), i;
  char *text;
  json_t *o, *c, *s, *id;
  memset(out, 0, sizeof *out);
  if (n % 2 || n > 8192 || !(text = malloc(n / 2 + 2))) return -1;
  text[0] = '{';
  for (i = 0; i < n / 2; i++) {
    int hi = hex_digit((unsigned char)hex[2 * i]);
    int lo = hex_digit((unsigned char)hex[2 * i + 1]);
    if (hi < 0 || lo < 0) {
      free(text);
      return -1;
    }
    text[1 + i] = (char)(hi << 4 | lo);
  }
  text[1 + n / 2] = '}';
  o = json_loadb(text, n / 2 + 2, JSON_REJECT_DUPLICATES, NULL);
  free(text);
  c = json_object_get(o, "c");
  s = json_object_get(o, "s");
  id = json_object_get(o, "i");
  if (!json_is_integer(c) || json_integer_value(c) <= 0 ||
      !json_is_string(s) || !json_is_string(id) || json_object_size(o) != 3) {
    json_decref(o);
    return -1;
  }
  out->created = json_integer_value(c);
  out->session = json_string_value(s);
  out->call_id = json_string_value(id);
  out->held = o;
  return 0;
}

static const char *member(json_t *o, const char *k, int *bad) {
  json_t *v = json_object_get(o, k);
  if (v && !json_is_null(v) && !json_is_string(v)) *bad = 1;
  return json_is_string(v) ? json_string_value(v) : NULL;
}

static int refuse(serve_verdict *v, char *err, size_t n, const char *fmt,
                  ...) {
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, n, fmt, ap);
  va_end(ap);
  serve_verdict_free(v);
  return -1;
}

int serve_verdict_read(const char *body, size_t len, serve_verdict *v,
                       char *err, size_t n) {
  json_error_t jerr;
  const char *verdict;
  int bad = 0;
  memset(v, 0, sizeof *v);
  v->held = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
  if (!json_is_object(v->held))
    return refuse(v, err, n, "the body is not a JSON object: %s",
                  v->held ? "another value" : jerr.text);
  v->session = member(v->held, "session", &bad);
  v->call_id = member(v->held, "call_id", &bad);
  verdict = member(v->held, "verdict", &bad);
  v->result = member(v->held, "result", &bad);
  v->reason = member(v->held, "reason", &bad);
  v->by = member(v->held, "by", &bad);
  if (bad)
    return refuse(v, err, n, "session, call_id, verdict, result (JSON "
                             "text), reason and by are strings");
  if (!v->session || !v->call_id)
    return refuse(v, err, n, "session and call_id are required");
  if (!verdict || (strcmp(verdict, "applied") != 0 &&
                   strcmp(verdict, "not_applied") != 0))
    return refuse(v, err, n, "verdict is \"applied\" or \"not_applied\"");
  v->outcome = strcmp(verdict, "applied") == 0 ? IDEM_OUTCOME_APPLIED
                                               : IDEM_OUTCOME_NOT_APPLIED;
  if (v->result && !*v->result) v->result = NULL;
  if (v->outcome == IDEM_OUTCOME_NOT_APPLIED && (!v->reason || !*v->reason))
    return refuse(v, err, n, "not applied needs a reason (what the provider "
                             "said)");
  if (v->outcome == IDEM_OUTCOME_NOT_APPLIED && v->result)
    return refuse(v, err, n, "a result goes with applied");
  if (v->by && !*v->by) v->by = NULL;
  return 0;
}

void serve_verdict_free(serve_verdict *v) {
  json_decref(v->held);
  memset(v, 0, sizeof *v);
}

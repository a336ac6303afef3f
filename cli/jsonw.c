/*
** jsonw.c - JSON objects written member by member into a cli_outbuf: the
** records of `idem ls --json` and `idem show --json`, and the answers of
** `idem serve`.  A failure to grow is remembered (err) and checked once at
** the end, so that a short buffer never becomes bad JSON.
*/
#include <stdio.h>
#include <string.h>

#include "cli.h"

void cli_jsonw_init(cli_jsonw *w, idem_canon *c, size_t cap) {
  cli_outbuf_init(&w->b, cap);
  w->c = c;
  w->first = 1;
  w->err = 0;
}

void cli_jsonw_open(cli_jsonw *w) {
  w->err |= cli_outbuf_put(&w->b, "{", 1);
  w->first = 1;
}

void cli_jsonw_close(cli_jsonw *w) {
  w->err |= cli_outbuf_put(&w->b, "}", 1);
  w->first = 0;
}

void cli_jsonw_key(cli_jsonw *w, const char *k) {
  w->err |= (!w->first && cli_outbuf_put(&w->b, ",", 1)) ||
            cli_outbuf_json(&w->b, w->c, k) || cli_outbuf_put(&w->b, ":", 1);
  w->first = 0;
}

void cli_jsonw_str(cli_jsonw *w, const char *k, const char *v) {
  cli_jsonw_key(w, k);
  /* the log's strings are UTF-8 (the guard refuses others); null if not */
  if (cli_outbuf_json(&w->b, w->c, v)) w->err |= cli_outbuf_str(&w->b, "null");
}

void cli_jsonw_raw(cli_jsonw *w, const char *k, const char *v) {
  cli_jsonw_key(w, k);
  w->err |= cli_outbuf_str(&w->b, v ? v : "null");
}

void cli_jsonw_num(cli_jsonw *w, const char *k, long long v) {
  char num[32];
  snprintf(num, sizeof num, "%lld", v);
  cli_jsonw_raw(w, k, num);
}

void cli_jsonw_record(cli_jsonw *w, const idem_record *r) {
  cli_jsonw_str(w, "session", r->session);
  cli_jsonw_str(w, "call_id", r->call_id);
  cli_jsonw_str(w, "tool", r->tool);
  cli_jsonw_str(w, "state", idem_state_name(r->state));
  cli_jsonw_num(w, "attempts", r->attempts);
  cli_jsonw_str(w, "key", r->key);
  cli_jsonw_str(w, "fingerprint", r->fingerprint);
  cli_jsonw_raw(w, "args", r->args);
  cli_jsonw_raw(w, "result", r->result);
  cli_jsonw_str(w, "error", r->error);
  cli_jsonw_str(w, "resolution", idem_resolution_name(r->resolution));
  cli_jsonw_num(w, "delivered", r->delivered);
  cli_jsonw_str(w, "duplicate_of", r->duplicate_of);
  cli_jsonw_str(w, "turn", r->turn);
  cli_jsonw_str(w, "owner", r->owner);
  cli_jsonw_num(w, "lease_until", r->lease_until);
  cli_jsonw_num(w, "token", r->token);
  cli_jsonw_num(w, "created", r->created);
  cli_jsonw_num(w, "updated", r->updated);
  cli_jsonw_num(w, "expires", r->expires);
  cli_jsonw_str(w, "fence_key", r->fence_key);
  cli_jsonw_str(w, "executor", r->executor);
  cli_jsonw_num(w, "pgid", r->pgid);
  cli_jsonw_num(w, "settle_from", r->settle_from);
  cli_jsonw_str(w, "resolved_by", r->resolved_by);
  cli_jsonw_num(w, "resolved_at", r->resolved_at);
  cli_jsonw_raw(w, "check_with", r->check_with);
  cli_jsonw_str(w, "last_check", r->last_check);
  cli_jsonw_num(w, "checked_at", r->checked_at);
  cli_jsonw_num(w, "checks", r->checks);
}

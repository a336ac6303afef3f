/*
** api.c - the JSON behind the console's page, for scripts too
** (docs/CONSOLE.md, "API"):
**
**   GET  info                  the console: version, log, read_only, csrf;
**                              under idem mcp, its notices on the tools
**   GET  doubt                 the actions in doubt now, oldest first
**   GET  records?session=&call_id=&key=&tool=&state=   a search
**   GET  session?session=S     one session's calls, in order
**   GET  record?session=S&call_id=C                    one action
**   GET  stats                 records per state
**   POST resolve               an operator's verdict (idem resolve)
**
** A listing is one page of at most limit (50; up to 500) records, oldest
** first, and "next", the cursor of the page after it (after=CURSOR), or
** null: a log of any size is read a page at a time, never whole.  The
** cursor names the page's last record (created, session, call_id):
** opaque to clients, and checked when it comes back (parse.c).
*/
#include <jansson.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parse.h"
#include "serve.h"

#define PAGE 50
#define PAGE_MAX 500
/* A listing shows a result up to this size; idem show gives all of it. */
#define LIST_RESULT_MAX ((size_t)64 << 10)

static const char *arg(struct MHD_Connection *c, const char *name) {
  const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
  return v && *v ? v : NULL;
}

/* ---- records ---------------------------------------------------------------- */

/* When the action's settle_ms ends, when the policy says (else -1 and
** null): an attempt that ended without a verdict may land until then. */
static long long settle_ends(serve *s, const idem_record *r) {
  idem_tool_info t;
  if (!s->policy || !r->settle_from) return -1;
  memset(&t, 0, sizeof t);
  t.size = sizeof t;
  if (idem_policy_tool(s->policy, r->tool, &t) != IDEM_OK || t.settle_ms < 0)
    return -1;
  return r->settle_from + t.settle_ms;
}

/* r as one object: its fields, and what the console adds - whether its
** executor still runs, when settle_ms ends, its age.  In a listing
** (cut), a result over LIST_RESULT_MAX is left out and its size given. */
static void put_record(serve *s, cli_jsonw *w, const idem_record *r,
                       long long now, int cut) {
  idem_record shown = *r;
  size_t rlen = r->result ? strlen(r->result) : 0;
  long long ends = settle_ends(s, r);
  int alive = r->executor ? idem_owner_alive(r->executor) : -1;
  if (cut && rlen > LIST_RESULT_MAX) shown.result = NULL;
  cli_jsonw_open(w);
  cli_jsonw_record(w, &shown);
  if (shown.result != r->result)
    cli_jsonw_num(w, "result_bytes", (long long)rlen);
  cli_jsonw_raw(w, "executor_alive", alive < 0 ? "null"
                                     : alive   ? "true"
                                               : "false");
  if (ends < 0)
    cli_jsonw_raw(w, "settle_ends", "null");
  else
    cli_jsonw_num(w, "settle_ends", ends);
  cli_jsonw_num(w, "age_ms", now - r->created);
  cli_jsonw_close(w);
}

/* ---- paging ----------------------------------------------------------------- */

typedef struct page {
  serve *s;
  cli_jsonw *w;
  size_t n, limit;
  long long now;
  char *next; /* the cursor after the page's last record */
  int more;   /* a record past the page was seen */
} page;

static int page_row(void *ctx, const idem_record *r) {
  page *p = ctx;
  if (p->n == p->limit) {
    p->more = 1;
    return 1;
  }
  if (p->n) p->w->err |= cli_outbuf_put(&p->w->b, ",", 1);
  put_record(p->s, p->w, r, p->now, 1);
  if (++p->n == p->limit &&
      !(p->next = serve_cursor_make(p->w->c, r->created, r->session,
                                    r->call_id)))
    p->w->err = 1;
  return 0;
}

/* One page of the records under f, with limit and after from the query. */
static void list(serve *s, struct MHD_Connection *c, idem_filter *f,
                 serve_reply *out) {
  const char *lim = arg(c, "limit"), *after = arg(c, "after");
  serve_cursor cur = {0, NULL, NULL, NULL};
  cli_jsonw w;
  page p;
  char *end;
  long v = PAGE;
  int rc;
  if (lim && ((v = strtol(lim, &end, 10)) < 1 || v > PAGE_MAX || *end)) {
    serve_error(out, 400, "limit is a number from 1 to %d, not '%.40s'",
                PAGE_MAX, lim);
    return;
  }
  if (after && serve_cursor_read(after, &cur) != 0) {
    serve_error(out, 400, "after is not a cursor this console gave");
    return;
  }
  if (serve_json_open(out, &w, (size_t)1 << 30) != 0) {
    json_decref(cur.held);
    return;
  }
  f->after_created = cur.created;
  f->after_session = cur.session;
  f->after_call_id = cur.call_id;
  memset(&p, 0, sizeof p);
  p.s = s;
  p.w = &w;
  p.limit = (size_t)v;
  p.now = cli_wall_ms();
  f->limit = p.limit + 1; /* one more: is there a next page? */
  cli_jsonw_open(&w);
  cli_jsonw_key(&w, "items");
  w.err |= cli_outbuf_put(&w.b, "[", 1);
  rc = idem_guard_list(s->g, f, page_row, &p);
  w.err |= cli_outbuf_put(&w.b, "]", 1);
  w.first = 0;
  cli_jsonw_str(&w, "next", p.more ? p.next : NULL);
  cli_jsonw_num(&w, "now", p.now);
  cli_jsonw_close(&w);
  if (rc != IDEM_OK) {
    serve_json_drop(&w);
    serve_error(out, 500, "reading the log: %s", idem_guard_errmsg(s->g));
  } else {
    serve_json_done(out, 200, &w);
  }
  free(p.next);
  json_decref(cur.held);
}

static void new_filter(idem_filter *f) {
  memset(f, 0, sizeof *f);
  f->size = sizeof *f;
}

static void get_doubt(serve *s, struct MHD_Connection *c, serve_reply *out) {
  idem_filter f;
  new_filter(&f);
  f.recoverable = 1;
  list(s, c, &f, out);
}

static void get_records(serve *s, struct MHD_Connection *c, int session,
                        serve_reply *out) {
  idem_filter f;
  const char *state = arg(c, "state");
  int st;
  new_filter(&f);
  f.session = arg(c, "session");
  if (session && !f.session) {
    serve_error(out, 400, "session=NAME is required");
    return;
  }
  if (!session) {
    f.call_id = arg(c, "call_id");
    f.key = arg(c, "key");
    f.tool = arg(c, "tool");
    if (state && !(st = cli_state_by_name(state))) {
      serve_error(out, 400, "no state '%.40s'", state);
      return;
    }
    if (state) f.states = 1u << st;
  }
  list(s, c, &f, out);
}

/* One action as an object in its own answer ("record", or the whole). */
static void answer_record(serve *s, const idem_record *r, int wrapped,
                          serve_reply *out) {
  cli_jsonw w;
  if (serve_json_open(out, &w, (size_t)1 << 30) != 0) return;
  if (wrapped) {
    cli_jsonw_open(&w);
    cli_jsonw_raw(&w, "ok", "true");
    cli_jsonw_key(&w, "record");
  }
  put_record(s, &w, r, cli_wall_ms(), 0);
  if (wrapped) cli_jsonw_close(&w);
  serve_json_done(out, 200, &w);
}

static void get_record(serve *s, struct MHD_Connection *c, serve_reply *out) {
  const char *session = arg(c, "session"), *call = arg(c, "call_id");
  idem_record *r = NULL;
  int rc;
  if (!session || !call) {
    serve_error(out, 400, "session=NAME and call_id=ID are required");
    return;
  }
  rc = idem_guard_record(s->g, session, call, &r);
  if (rc == IDEM_NOTFOUND)
    serve_error(out, 404, "no record of call %s in session %s", call, session);
  else if (rc)
    serve_error(out, 500, "reading the log: %s", idem_guard_errmsg(s->g));
  else
    answer_record(s, r, 0, out);
  idem_record_free(r);
}

static void get_stats(serve *s, serve_reply *out) {
  idem_stats st;
  cli_jsonw w;
  int i;
  memset(&st, 0, sizeof st);
  st.size = sizeof st;
  if (idem_guard_stats(s->g, &st) != IDEM_OK) {
    serve_error(out, 500, "reading the log: %s", idem_guard_errmsg(s->g));
    return;
  }
  if (serve_json_open(out, &w, 4096) != 0) return;
  cli_jsonw_open(&w);
  cli_jsonw_key(&w, "by_state");
  cli_jsonw_open(&w);
  for (i = IDEM_STATE_PENDING; i <= IDEM_STATE_DEDUPLICATED; i++)
    cli_jsonw_num(&w, idem_state_name(i), st.by_state[i]);
  cli_jsonw_close(&w);
  cli_jsonw_num(&w, "total", st.records);
  cli_jsonw_close(&w);
  serve_json_done(out, 200, &w);
}

static void get_info(serve *s, serve_reply *out) {
  cli_jsonw w;
  if (serve_json_open(out, &w, (size_t)1 << 20) != 0) return;
  cli_jsonw_open(&w);
  cli_jsonw_str(&w, "version", idem_version());
  cli_jsonw_str(&w, "log", s->log);
  cli_jsonw_raw(&w, "read_only", s->read_only ? "true" : "false");
  cli_jsonw_raw(&w, "policy", s->policy ? "true" : "false");
  cli_jsonw_str(&w, "csrf", s->read_only ? NULL : s->csrf);
  cli_jsonw_num(&w, "now", cli_wall_ms());
  serve_notes_json(&w, "tool_notices"); /* idem mcp --console's */
  cli_jsonw_close(&w);
  serve_json_done(out, 200, &w);
  out->set_csrf = !s->read_only;
}

/* ---- the verdict ------------------------------------------------------------ */

/* A verdict refused because the action is no longer in doubt: say what it
** is now, and who settled it when an operator did. */
static void refuse_settled(serve *s, const char *session, const char *call,
                           serve_reply *out) {
  idem_record *r = NULL;
  char when[40];
  if (idem_guard_record(s->g, session, call, &r) != IDEM_OK) {
    serve_error(out, 409, "call %s of session %s is no longer in doubt", call,
                session);
    return;
  }
  if (r->resolved_by) {
    cli_when(r->resolved_at, when, sizeof when);
    serve_error(out, 409,
                "call %s of session %s is no longer in doubt: it is %s, "
                "resolved by %s at %s",
                call, session, idem_state_name(r->state), r->resolved_by, when);
  } else {
    serve_error(out, 409,
                "call %s of session %s is no longer in doubt: it is %s "
                "(%s)",
                call, session, idem_state_name(r->state),
                idem_resolution_name(r->resolution));
  }
  idem_record_free(r);
}

static void post_resolve(serve *s, struct MHD_Connection *c, const char *body,
                         size_t len, serve_reply *out) {
  const union MHD_ConnectionInfo *peer;
  char who[300], host[64] = "?", err[300];
  serve_verdict v;
  idem_record *r = NULL;
  int rc;
  if (serve_verdict_read(body, len, &v, err, sizeof err) != 0) {
    serve_error(out, 400, "%s", err);
    return;
  }
  if (!v.by) {
    peer = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (peer && peer->client_addr)
      getnameinfo(peer->client_addr,
                  peer->client_addr->sa_family == AF_INET6
                      ? sizeof(struct sockaddr_in6)
                      : sizeof(struct sockaddr_in),
                  host, sizeof host, NULL, 0, NI_NUMERICHOST);
    snprintf(who, sizeof who, "idem serve (%s)", host);
  } else {
    snprintf(who, sizeof who, "%.200s (idem serve)", v.by);
  }
  rc = idem_guard_resolve(s->g, v.session, v.call_id, v.outcome, v.result,
                          v.result ? strlen(v.result) : 0, v.reason, who);
  if (rc == IDEM_INVALID)
    serve_error(out, 400, "result is not JSON text; nothing was changed");
  else if (rc == IDEM_NOTFOUND)
    serve_error(out, 404, "no record of call %s in session %s", v.call_id,
                v.session);
  else if (rc == IDEM_STALE)
    refuse_settled(s, v.session, v.call_id, out);
  else if (rc)
    serve_error(out, 500, "%s", idem_guard_errmsg(s->g));
  else if (idem_guard_record(s->g, v.session, v.call_id, &r) != IDEM_OK)
    serve_error(out, 500, "resolved, but the record could not be read back: "
                          "%s",
                idem_guard_errmsg(s->g));
  else
    answer_record(s, r, 1, out);
  idem_record_free(r);
  serve_verdict_free(&v);
}

void serve_api(serve *s, struct MHD_Connection *c, const char *method,
               const char *path, const char *body, size_t len,
               serve_reply *out) {
  if (strcmp(method, "POST") == 0) {
    post_resolve(s, c, body, len, out); /* the one write route */
    return;
  }
  if (strcmp(path, "info") == 0)
    get_info(s, out);
  else if (strcmp(path, "doubt") == 0)
    get_doubt(s, c, out);
  else if (strcmp(path, "records") == 0)
    get_records(s, c, 0, out);
  else if (strcmp(path, "session") == 0)
    get_records(s, c, 1, out);
  else if (strcmp(path, "record") == 0)
    get_record(s, c, out);
  else if (strcmp(path, "stats") == 0)
    get_stats(s, out);
  else
    serve_error(out, 404, "no route /api/%.100s", path);
}

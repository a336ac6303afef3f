/*
** upstream.c - `idem mcp -- URL`: the server is a remote MCP server,
** reached over MCP's Streamable HTTP transport (SPEC §10b).
**
** Shape.  The gateway's loop (gateway.c) speaks lines of JSON-RPC to its
** server, whatever the server is.  Here one thread runs a libcurl multi
** handle: every message the loop sends (up_send) becomes one POST, and
** everything the server answers - a JSON body, or each event of an SSE
** stream - comes back to the loop as one line (up_take), tagged with the
** gateway id of the request whose stream carried it, so that a message
** the server sends about a request (progress, a log line) can reach the
** client that made it.  A message goes with its sender (gw_who): its
** credential when clients' credentials pass through, the MCP session it
** belongs to.
**
** Sessions.  A 2025-06-18 / 2025-11-25 server gives a session id in its
** answer to initialize (Mcp-Session-Id); the sender's later messages carry
** it.  Each session at idem (an HTTP client's, or the one stdio client's)
** has its own upstream session, keyed by the idem session id.  A 404 to a
** message with a session id means the server forgot it: the saved
** initialize is sent again, then notifications/initialized, then the
** message, once.  At the end each upstream session is DELETEd.  A
** 2026-07-28 request (no handshake, _meta per request) passes as it is.
**
** What HTTP proves (SPEC §10b, §6a).  A connection refused (nothing was
** sent), or a 4xx other than 408/409/429 (the server read the request and
** said no before anything ran), is a verdict that nothing ran: the
** request is answered with error -32600, which the guard takes as
** "rejected".  A reset, a timeout, a 5xx, a 408/409/429, or a stream that
** ends without the answer is an end without a verdict: error -32603,
** outcome unknown.  The made-up error's data holds what HTTP said under
** UP_HTTP_KEY, with this run's nonce, so that an HTTP front can hand a
** 401 and its WWW-Authenticate back unchanged.
**
** A tools/call's SSE stream that ends before its answer is resumed with a
** GET carrying Last-Event-ID when the server gave event ids (up to
** RESUMES times), before it counts as ended without a verdict.  A
** transfer is never cut at a call's deadline or when the client leaves:
** in the 2026-07-28 revision closing the stream cancels the request, and
** the late answer is what settles the action.  It is bounded by
** UP_MAX_MS all the same.
*/
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

#include "cli.h"
#include "curlfn.h"
#include "mcp.h"
#include "up.h"

#define UP_MAX_MS (15L * 60 * 1000) /* one transfer at most */
#define CONNECT_MS 10000L
#define RESUMES 3
#define ERR_BODY ((size_t)64 << 10) /* of a failed answer, kept for the client */

enum { X_POST = 1, X_RESUME, X_GET };

typedef struct usess {
  struct xfer *get; /* its GET stream for the server's own messages */
  char *key;        /* the idem session ("" for none) */
  char *sid;        /* the server's Mcp-Session-Id, or NULL */
  char *init;       /* the initialize last sent for it, to send again */
  char *proto;      /* the protocol version the server chose */
  struct usess *next;
} usess;

typedef struct xfer {
  struct upstream *u;
  CURL *h;
  struct curl_slist *hdrs;
  int kind;
  long long gid;    /* the request's id (the gateway's), 0: not a request */
  int initialize;   /* an initialize: learn the session from its answer */
  char *body;
  size_t len;
  char *key, *auth, *proto, *method, *name;
  int reinit_done;
  /* the answer */
  long status;
  int started;      /* the status and headers are known */
  int is_sse, is_json;
  mcp_sse sse;
  cli_outbuf raw;
  char *sess_hdr, *www_auth, *ctype;
  int got_answer, resumes, too_big, events;
  struct xfer *next;
} xfer;

typedef struct qmsg {
  struct qmsg *next;
  gw_who *who;
  size_t len;
  char *sid_end; /* X: a session to end (no message) */
  char body[];
} qmsg;

struct upstream {
  up_opts o;
  char **headers;
  pthread_t th;
  pthread_mutex_t mu;
  CURLM *m;
  /* in, under mu */
  qmsg *in, *in_tail;
  int closing, grace_ms;
  /* out, under mu */
  up_msg *out, *out_tail;
  int eof;
  /* the thread's own */
  int stopping; /* closing, as this thread last read it */
  usess *sessions;
  xfer *xs;
  int running;
};

gw_who *gw_who_ref(gw_who *w) {
  if (w) __atomic_add_fetch(&w->refs, 1, __ATOMIC_RELAXED);
  return w;
}

void gw_who_unref(gw_who *w) {
  if (!w || __atomic_sub_fetch(&w->refs, 1, __ATOMIC_ACQ_REL)) return;
  free(w->sid);
  free(w->scope);
  free(w->auth);
  free(w->proto);
  free(w->id);
  free(w);
}

static char *dup0(const char *s) {
  char *d = s ? strdup(s) : NULL;
  if (s && !d) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  return d;
}

/* A JSON-RPC id that is one of the gateway's (a whole number), or 0.  The
** message reader takes numbers as doubles. */
static long long gateway_id(const json_t *id) {
  double d = json_number_value(id);
  if (!json_is_number(id) || d < 1 || d >= 9e15 || d != (double)(long long)d)
    return 0;
  return (long long)d;
}

/* ---- to the loop -------------------------------------------------------------- */

/* One message (JSON text: its raw newlines, whitespace only, made blanks)
** to the loop. */
static void deliver(upstream *u, long long rel, const char *key,
                    const char *p, size_t n) {
  up_msg *m = malloc(sizeof *m + n + 1);
  unsigned char b = 1;
  if (!m) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  m->next = NULL;
  m->rel = rel;
  snprintf(m->sid, sizeof m->sid, "%s", key ? key : "");
  m->len = n;
  for (size_t i = 0; i < n; i++)
    m->line[i] = p[i] == '\n' || p[i] == '\r' ? ' ' : p[i];
  m->line[n] = '\0';
  pthread_mutex_lock(&u->mu);
  if (u->out_tail)
    u->out_tail->next = m;
  else
    u->out = m;
  u->out_tail = m;
  pthread_mutex_unlock(&u->mu);
  if (write(u->o.wake_fd, &b, 1) < 0) { /* full: the loop wakes anyway */
  }
}

/* Answer request x in words, for the loop: code -32600 (nothing ran) or
** -32603 (an end without a verdict), with what HTTP said. */
static void made_up(xfer *x, int code, const char *why) {
  upstream *u = x->u;
  json_t *data, *hdrs, *e;
  char *text;
  if (!x->gid || x->got_answer) return;
  x->got_answer = 1;
  hdrs = json_object();
  if (x->www_auth)
    json_object_set_new(hdrs, "www-authenticate", json_string(x->www_auth));
  if (x->ctype) json_object_set_new(hdrs, "content-type", json_string(x->ctype));
  data = json_object();
  json_object_set_new(data, "status", json_integer((json_int_t)x->status));
  json_object_set_new(data, "headers", hdrs);
  json_object_set_new(data, "gateway", json_string(u->o.nonce));
  if (x->raw.len && !x->is_sse)
    json_object_set_new(data, "body", json_stringn(x->raw.p, x->raw.len));
  e = json_pack("{sssIs{sisss{so}}}", "jsonrpc", "2.0", "id",
                (json_int_t)x->gid, "error", "code", code, "message", why,
                "data", UP_HTTP_KEY, data);
  text = e ? json_dumps(e, JSON_COMPACT) : NULL;
  if (!text) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  deliver(u, x->gid, x->key, text, strlen(text));
  free(text);
  json_decref(e);
}

/* ---- sessions ------------------------------------------------------------------- */

static usess *session(upstream *u, const char *key) {
  usess *s;
  for (s = u->sessions; s; s = s->next)
    if (!strcmp(s->key, key)) return s;
  if (!(s = calloc(1, sizeof *s))) exit(EXIT_FAIL);
  s->key = dup0(key);
  s->next = u->sessions;
  u->sessions = s;
  return s;
}

/* ---- one transfer ----------------------------------------------------------------- */

static void on_event(void *ctx, const char *data, size_t n, int oversized) {
  xfer *x = ctx;
  size_t i = 0;
  while (data && i < n && strchr(" \t\r\n", data[i])) i++;
  if (data && i == n) return; /* no message: a priming event (its id kept) */
  if (oversized) {
    if (x->gid) {
      /* it may be the answer: the call ended without a readable one */
      x->too_big = 1;
    }
    cli_err("the upstream sent an event of more than %zu bytes; dropped",
            x->u->o.max_message);
    return;
  }
  {
    mcp_msg m;
    char err[200];
    if (mcp_msg_parse(data, n, &m, err, sizeof err) == 0) {
      if (m.kind == MCP_RESPONSE && x->gid && gateway_id(m.id) == x->gid) {
        x->got_answer = 1;
        if (x->initialize) {
          const char *v = json_string_value(json_object_get(
              json_object_get(m.root, "result"), "protocolVersion"));
          if (v) {
            usess *s = session(x->u, x->key);
            free(s->proto);
            s->proto = dup0(v);
          }
        }
      }
      mcp_msg_free(&m);
    }
  }
  x->events++;
  deliver(x->u, x->gid, x->key, data, n);
}

static void started(xfer *x) {
  char *ct = NULL;
  if (x->started) return;
  x->started = 1;
  curl_easy_getinfo(x->h, CURLINFO_RESPONSE_CODE, &x->status);
  curl_easy_getinfo(x->h, CURLINFO_CONTENT_TYPE, &ct);
  if (x->status >= 200 && x->status < 300 && ct) {
    if (!strncasecmp(ct, "text/event-stream", 17)) x->is_sse = 1;
    else if (!strncasecmp(ct, "application/json", 16)) x->is_json = 1;
  }
}

static size_t on_body(char *p, size_t size, size_t n, void *ctx) {
  xfer *x = ctx;
  size_t len = size * n;
  started(x);
  if (x->is_sse) {
    if (mcp_sse_feed(&x->sse, p, len, on_event, x)) return 0;
  } else if (!x->too_big) {
    size_t cap = x->is_json ? x->u->o.max_message : ERR_BODY;
    if (x->raw.len + len > cap) {
      x->too_big = 1;
      x->raw.len = 0;
    } else if (cli_outbuf_put(&x->raw, p, len)) {
      return 0;
    }
  }
  return len;
}

static char *header_value(const char *p, size_t n, const char *name) {
  size_t k = strlen(name);
  const char *v, *e = p + n;
  if (n <= k || strncasecmp(p, name, k) || p[k] != ':') return NULL;
  for (v = p + k + 1; v < e && (*v == ' ' || *v == '\t'); v++) {
  }
  while (e > v && (e[-1] == '\r' || e[-1] == '\n' || e[-1] == ' ')) e--;
  return strndup(v, (size_t)(e - v));
}

static size_t on_header(char *p, size_t size, size_t n, void *ctx) {
  xfer *x = ctx;
  size_t len = size * n;
  char *v;
  if (len > 5 && !strncmp(p, "HTTP/", 5)) { /* a new answer (after 100) */
    free(x->sess_hdr);
    free(x->www_auth);
    free(x->ctype);
    x->sess_hdr = x->www_auth = x->ctype = NULL;
  } else if ((v = header_value(p, len, "mcp-session-id"))) {
    free(x->sess_hdr);
    x->sess_hdr = v;
  } else if ((v = header_value(p, len, "www-authenticate"))) {
    free(x->www_auth);
    x->www_auth = v;
  } else if ((v = header_value(p, len, "content-type"))) {
    free(x->ctype);
    x->ctype = v;
  }
  return len;
}

static struct curl_slist *add_header(struct curl_slist *l, const char *name,
                                     const char *value) {
  char line[8192];
  struct curl_slist *n;
  if (!value) return l;
  snprintf(line, sizeof line, "%s: %s", name, value);
  if (!(n = curl_slist_append(l, line))) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  return n;
}

/* A header value safe to send: printable ASCII only (a tool name may be
** any Unicode; such a name is simply not mirrored in Mcp-Name). */
static int header_safe(const char *s) {
  for (; *s; s++)
    if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e) return 0;
  return 1;
}

static void start(upstream *u, xfer *x) {
  usess *s = session(u, x->key);
  const char *proto = x->proto ? x->proto : s->proto;
  free(x->sess_hdr);
  free(x->www_auth);
  free(x->ctype);
  x->sess_hdr = x->www_auth = x->ctype = NULL;
  x->started = x->is_sse = x->is_json = x->too_big = 0;
  x->status = 0;
  x->raw.len = 0;
  if (x->kind == X_POST) { /* a resumed or reopened stream keeps its last id */
    mcp_sse_free(&x->sse);
    mcp_sse_init(&x->sse, u->o.max_message);
  } else {
    x->sse.line.len = x->sse.data.len = 0;
    x->sse.has_data = x->sse.oversized = x->sse.line_over = x->sse.cr = 0;
  }
  if (!(x->h = curl_easy_init())) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  curl_slist_free_all(x->hdrs);
  x->hdrs = NULL;
  for (int i = 0; i < u->o.nheaders; i++)
    if (!(x->hdrs = curl_slist_append(x->hdrs, u->headers[i]))) {
      cli_err("out of memory");
      exit(EXIT_FAIL);
    }
  if (!u->o.own_auth && x->auth) x->hdrs = add_header(x->hdrs, "Authorization", x->auth);
  if (s->sid) x->hdrs = add_header(x->hdrs, "Mcp-Session-Id", s->sid);
  if (proto && header_safe(proto))
    x->hdrs = add_header(x->hdrs, "MCP-Protocol-Version", proto);
  x->hdrs = add_header(x->hdrs, "Accept", "application/json, text/event-stream");
  if (x->kind == X_POST) {
    x->hdrs = add_header(x->hdrs, "Content-Type", "application/json");
    if (x->method && header_safe(x->method))
      x->hdrs = add_header(x->hdrs, "Mcp-Method", x->method);
    if (x->name && header_safe(x->name))
      x->hdrs = add_header(x->hdrs, "Mcp-Name", x->name);
    curl_easy_setopt(x->h, CURLOPT_POSTFIELDS, x->body);
    curl_easy_setopt(x->h, CURLOPT_POSTFIELDSIZE_LARGE, (curl_off_t)x->len);
  } else {
    char id[300];
    snprintf(id, sizeof id, "%s", x->sse.id);
    x->hdrs = add_header(x->hdrs, "Last-Event-ID", x->sse.has_id ? id : NULL);
    curl_easy_setopt(x->h, CURLOPT_HTTPGET, 1L);
  }
  if (!x->hdrs) {
    cli_err("out of memory");
    exit(EXIT_FAIL);
  }
  curl_easy_setopt(x->h, CURLOPT_URL, u->o.url);
  curl_easy_setopt(x->h, CURLOPT_HTTPHEADER, x->hdrs);
  curl_easy_setopt(x->h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(x->h, CURLOPT_WRITEDATA, x);
  curl_easy_setopt(x->h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(x->h, CURLOPT_HEADERDATA, x);
  curl_easy_setopt(x->h, CURLOPT_PRIVATE, x);
  curl_easy_setopt(x->h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(x->h, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_MS);
  curl_easy_setopt(x->h, CURLOPT_TIMEOUT_MS, UP_MAX_MS);
  curl_easy_setopt(x->h, CURLOPT_FOLLOWLOCATION, 0L);
  curl_easy_setopt(x->h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(x->h, CURLOPT_TCP_NODELAY, 1L);
  curl_multi_add_handle(u->m, x->h);
  u->running++;
}

static void xfer_free(xfer *x) {
  usess *s;
  for (s = x->u->sessions; s; s = s->next)
    if (s->get == x) s->get = NULL;
  mcp_sse_free(&x->sse);
  cli_outbuf_free(&x->raw);
  curl_slist_free_all(x->hdrs);
  free(x->body);
  free(x->key);
  free(x->auth);
  free(x->proto);
  free(x->method);
  free(x->name);
  free(x->sess_hdr);
  free(x->www_auth);
  free(x->ctype);
  free(x);
}

/* A short request of the upstream client's own, synchronously: the saved
** initialize again (and notifications/initialized) for a forgotten
** session, or a DELETE.  The thread waits for it: both are rare. */
static long own_request(upstream *u, usess *s, const char *method,
                        const char *body, const char *auth, char **sid_out) {
  xfer y;
  CURL *h = curl_easy_init();
  long status = 0;
  memset(&y, 0, sizeof y);
  y.u = u;
  cli_outbuf_init(&y.raw, ERR_BODY);
  mcp_sse_init(&y.sse, u->o.max_message);
  if (!h) return 0;
  y.h = h;
  for (int i = 0; i < u->o.nheaders; i++)
    y.hdrs = curl_slist_append(y.hdrs, u->headers[i]);
  if (!u->o.own_auth && auth) y.hdrs = add_header(y.hdrs, "Authorization", auth);
  if (s->sid && !sid_out) y.hdrs = add_header(y.hdrs, "Mcp-Session-Id", s->sid);
  if (s->proto && header_safe(s->proto))
    y.hdrs = add_header(y.hdrs, "MCP-Protocol-Version", s->proto);
  y.hdrs = add_header(y.hdrs, "Accept", "application/json, text/event-stream");
  if (body) {
    y.hdrs = add_header(y.hdrs, "Content-Type", "application/json");
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
  } else {
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
  }
  curl_easy_setopt(h, CURLOPT_URL, u->o.url);
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, y.hdrs);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &y);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &y);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, CONNECT_MS);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  if (curl_easy_perform(h) == CURLE_OK)
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  if (sid_out) {
    *sid_out = y.sess_hdr;
    y.sess_hdr = NULL;
  }
  curl_easy_cleanup(h);
  y.body = NULL;
  mcp_sse_free(&y.sse);
  cli_outbuf_free(&y.raw);
  curl_slist_free_all(y.hdrs);
  free(y.sess_hdr);
  free(y.www_auth);
  free(y.ctype);
  return status;
}

/* The server forgot session s (a 404): initialize it again, as it was. */
static int reinitialize(upstream *u, usess *s, const char *auth) {
  char *sid = NULL;
  json_t *init;
  char *body;
  long st;
  if (!s->init) return -1;
  /* the same initialize under an id of the upstream client's own: its
  ** answer is read here and not passed on */
  init = json_loads(s->init, 0, NULL);
  if (!init || json_object_set_new(init, "id", json_string("idem-reinitialize")))
    return -1;
  body = json_dumps(init, JSON_COMPACT);
  json_decref(init);
  if (!body) return -1;
  free(s->sid);
  s->sid = NULL;
  st = own_request(u, s, NULL, body, auth, &sid);
  free(body);
  if (st < 200 || st >= 300) {
    free(sid);
    return -1;
  }
  s->sid = sid;
  own_request(u, s, NULL,
              "{\"jsonrpc\":\"2.0\",\"method\":\"notifications/initialized\"}",
              auth, NULL);
  cli_err("the upstream forgot an MCP session (404); it was initialized again");
  return 0;
}

static void xfer_free(xfer *x);

/* The session's GET stream: what the server says outside any request
** (a list that changed, a resource updated) reaches the session's client. */
static void open_stream(upstream *u, usess *s, const char *auth,
                        const char *proto) {
  xfer *g;
  if (s->get || u->stopping) return;
  if (!(g = calloc(1, sizeof *g))) exit(EXIT_FAIL);
  g->u = u;
  g->kind = X_GET;
  g->key = dup0(s->key);
  g->auth = dup0(auth);
  g->proto = dup0(proto);
  cli_outbuf_init(&g->raw, (size_t)-1);
  mcp_sse_init(&g->sse, u->o.max_message);
  g->next = u->xs;
  u->xs = g;
  s->get = g;
  start(u, g);
}

/* Stop a transfer in flight (a session's GET stream at its end). */
static void cancel(upstream *u, xfer *x) {
  xfer **pp = &u->xs;
  if (x->h) {
    curl_multi_remove_handle(u->m, x->h);
    curl_easy_cleanup(x->h);
    u->running--;
  }
  while (*pp && *pp != x) pp = &(*pp)->next;
  if (*pp) *pp = x->next;
  xfer_free(x);
}

/* A transfer ended (res: how libcurl ended it). */
static void finished(upstream *u, xfer *x, CURLcode res) {
  usess *s = session(u, x->key);
  started(x);
  curl_multi_remove_handle(u->m, x->h);
  curl_easy_cleanup(x->h);
  x->h = NULL;
  u->running--;
  if (x->sess_hdr && x->initialize && x->status >= 200 && x->status < 300) {
    free(s->sid);
    s->sid = x->sess_hdr;
    x->sess_hdr = NULL;
    open_stream(u, s, x->auth, x->proto);
  }
  if (x->kind == X_GET) {
    /* the session's own stream: opened again while it carries messages
    ** (a server may end it to make the client reconnect); a server that
    ** has none (405), or one that ends it at once, is let be */
    if (s->get == x) s->get = NULL;
    if (res == CURLE_OK && x->status == 200 && x->events && !u->stopping &&
        s->sid) {
      x->events = 0;
      s->get = x;
      start(u, x);
      return;
    }
    goto done;
  }
  if (res == CURLE_OK && x->status == 404 && s->sid && !x->reinit_done &&
      x->kind == X_POST && !x->initialize) {
    x->reinit_done = 1;
    if (reinitialize(u, s, x->auth) == 0) {
      start(u, x);
      return;
    }
  }
  if (res == CURLE_OK && x->is_json && x->status >= 200 && x->status < 300) {
    if (x->too_big) {
      cli_err("the upstream's answer was larger than the limit (idem mcp "
              "--max-message); dropped");
      made_up(x, -32603,
              "idem: the upstream's answer was larger than the limit (idem "
              "mcp --max-message)");
    } else if (x->raw.len) {
      on_event(x, x->raw.p, x->raw.len, 0);
    }
  }
  if (res == CURLE_OK && x->is_sse) {
    /* a last event without its blank line */
    if (mcp_sse_feed(&x->sse, "\n\n", 2, on_event, x)) exit(EXIT_FAIL);
  }
  if (!x->gid || x->got_answer) goto done;
  if (x->too_big) {
    made_up(x, -32603,
            "idem: the upstream's answer was larger than the limit (idem mcp "
            "--max-message)");
    goto done;
  }
  if (x->is_sse && x->sse.has_id && x->resumes < RESUMES && !u->stopping) {
    /* the stream dropped before the answer: resume it where it was */
    x->resumes++;
    x->kind = X_RESUME;
    start(u, x);
    return;
  }
  if (res == CURLE_COULDNT_CONNECT || res == CURLE_COULDNT_RESOLVE_HOST ||
      res == CURLE_COULDNT_RESOLVE_PROXY) {
    char why[300];
    snprintf(why, sizeof why,
             "idem: the upstream could not be reached (%s); nothing was sent",
             curl_easy_strerror(res));
    made_up(x, -32600, why);
  } else if (res == CURLE_OK && x->status >= 400 && x->status < 500 &&
             x->status != 408 && x->status != 409 && x->status != 429 &&
             x->kind == X_POST) {
    char why[200];
    snprintf(why, sizeof why,
             "idem: the upstream answered HTTP %ld: it did not take the "
             "request",
             x->status);
    made_up(x, -32600, why);
  } else {
    char why[300];
    if (res != CURLE_OK)
      snprintf(why, sizeof why,
               "idem: the connection to the upstream failed after the "
               "request was sent (%s): the outcome is unknown",
               curl_easy_strerror(res));
    else if (x->status >= 300 || x->status < 200)
      snprintf(why, sizeof why,
               "idem: the upstream answered HTTP %ld: the outcome is unknown",
               x->status);
    else
      snprintf(why, sizeof why,
               "idem: the upstream's answer ended without the result: the "
               "outcome is unknown");
    made_up(x, -32603, why);
  }
done:
  if (x->status >= 400 && !x->gid && x->kind == X_POST)
    cli_err("the upstream answered HTTP %ld to %s %s", x->status,
            x->method ? "a message" : "a response", x->method ? x->method : "");
  {
    xfer **pp = &u->xs;
    while (*pp != x) pp = &(*pp)->next;
    *pp = x->next;
  }
  xfer_free(x);
}

/* Turn a queued message into a transfer. */
static void begin(upstream *u, qmsg *q) {
  xfer *x = calloc(1, sizeof *x);
  mcp_msg m;
  char err[200];
  if (!x) exit(EXIT_FAIL);
  x->u = u;
  x->kind = X_POST;
  x->body = malloc(q->len + 1);
  if (!x->body) exit(EXIT_FAIL);
  memcpy(x->body, q->body, q->len);
  x->body[q->len] = '\0';
  x->len = q->len;
  x->key = dup0(q->who && q->who->sid ? q->who->sid : "");
  x->auth = dup0(q->who ? q->who->auth : NULL);
  x->proto = dup0(q->who ? q->who->proto : NULL);
  cli_outbuf_init(&x->raw, (size_t)-1); /* start() makes its SSE reader */
  if (mcp_msg_parse(x->body, x->len, &m, err, sizeof err) == 0) {
    if (m.method) x->method = dup0(m.method);
    if (m.kind == MCP_REQUEST) x->gid = gateway_id(m.id);
    if (m.kind == MCP_REQUEST && m.method && !strcmp(m.method, "initialize")) {
      usess *s = session(u, x->key);
      x->initialize = 1;
      free(s->init);
      s->init = dup0(x->body);
      free(s->sid); /* a new initialize starts a new session */
      s->sid = NULL;
    }
    {
      const json_t *nm = json_object_get(m.params, "name");
      if (m.method && (!strcmp(m.method, "tools/call") ||
                       !strcmp(m.method, "prompts/get")) &&
          json_is_string(nm))
        x->name = dup0(json_string_value(nm));
      else if ((nm = json_object_get(m.params, "uri")) && json_is_string(nm))
        x->name = dup0(json_string_value(nm));
    }
    mcp_msg_free(&m);
  }
  x->next = u->xs;
  u->xs = x;
  start(u, x);
}

static void end_session(upstream *u, const char *key) {
  usess **pp = &u->sessions;
  for (; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->key, key)) {
      usess *s = *pp;
      if (s->get) cancel(u, s->get);
      if (s->sid) own_request(u, s, "DELETE", NULL, NULL, NULL);
      *pp = s->next;
      free(s->key);
      free(s->sid);
      free(s->init);
      free(s->proto);
      free(s);
      return;
    }
}

static void *run(void *arg) {
  upstream *u = arg;
  long long close_by = 0;
  for (;;) {
    qmsg *q;
    int closing, still;
    CURLMsg *msg;
    pthread_mutex_lock(&u->mu);
    q = u->in;
    u->in = u->in_tail = NULL;
    closing = u->stopping = u->closing; /* the thread's own copy */
    if (closing && !close_by) close_by = cli_mono_ms() + u->grace_ms;
    pthread_mutex_unlock(&u->mu);
    while (q) {
      qmsg *nx = q->next;
      if (q->sid_end)
        end_session(u, q->sid_end);
      else
        begin(u, q);
      gw_who_unref(q->who);
      free(q->sid_end);
      free(q);
      q = nx;
    }
    curl_multi_perform(u->m, &still);
    while ((msg = curl_multi_info_read(u->m, &still)))
      if (msg->msg == CURLMSG_DONE) {
        xfer *x = NULL;
        curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, (char **)&x);
        finished(u, x, msg->data.result);
      }
    if (closing)
      for (usess *s = u->sessions; s; s = s->next)
        if (s->get) cancel(u, s->get);
    if (closing && (!u->xs || cli_mono_ms() >= close_by)) break;
    curl_multi_poll(u->m, NULL, 0, closing ? 50 : 1000, NULL);
  }
  /* what is still in flight: answered as ended without a verdict */
  while (u->xs) {
    xfer *x = u->xs;
    made_up(x, -32603,
            "idem: the gateway stopped before the upstream answered: the "
            "outcome is unknown");
    if (x->h) {
      curl_multi_remove_handle(u->m, x->h);
      curl_easy_cleanup(x->h);
    }
    u->xs = x->next;
    xfer_free(x);
  }
  while (u->sessions) end_session(u, u->sessions->key);
  pthread_mutex_lock(&u->mu);
  u->eof = 1;
  pthread_mutex_unlock(&u->mu);
  {
    unsigned char b = 1;
    if (write(u->o.wake_fd, &b, 1) < 0) {
    }
  }
  return NULL;
}

/* ---- the loop's side ------------------------------------------------------------ */

upstream *up_start(const up_opts *o, char *err, size_t errn) {
  const char *why = cli_curl_need();
  upstream *u;
  if (why) {
    snprintf(err, errn, "an HTTP upstream needs %s", why);
    return NULL;
  }
  if (!(u = calloc(1, sizeof *u))) {
    snprintf(err, errn, "out of memory");
    return NULL;
  }
  u->o = *o;
  u->headers = o->headers;
  pthread_mutex_init(&u->mu, NULL);
  if (!(u->m = curl_multi_init()) || pthread_create(&u->th, NULL, run, u)) {
    snprintf(err, errn, "cannot start the upstream client");
    if (u->m) curl_multi_cleanup(u->m);
    pthread_mutex_destroy(&u->mu);
    free(u);
    return NULL;
  }
  return u;
}

static void enqueue(upstream *u, qmsg *q) {
  pthread_mutex_lock(&u->mu);
  if (u->closing) {
    pthread_mutex_unlock(&u->mu);
    gw_who_unref(q->who);
    free(q->sid_end);
    free(q);
    return;
  }
  if (u->in_tail)
    u->in_tail->next = q;
  else
    u->in = q;
  u->in_tail = q;
  pthread_mutex_unlock(&u->mu);
  curl_multi_wakeup(u->m);
}

void up_send(upstream *u, const char *msg, size_t len, gw_who *who) {
  qmsg *q = calloc(1, sizeof *q + len + 1);
  if (!q) exit(EXIT_FAIL);
  memcpy(q->body, msg, len);
  q->len = len;
  q->who = gw_who_ref(who);
  enqueue(u, q);
}

void up_session_end(upstream *u, const char *sid) {
  qmsg *q = calloc(1, sizeof *q + 1);
  if (!q || !(q->sid_end = strdup(sid))) exit(EXIT_FAIL);
  enqueue(u, q);
}

up_msg *up_take(upstream *u, int *eof) {
  up_msg *m;
  pthread_mutex_lock(&u->mu);
  m = u->out;
  u->out = u->out_tail = NULL;
  *eof = u->eof && !m;
  pthread_mutex_unlock(&u->mu);
  return m;
}

void up_close(upstream *u, int grace_ms) {
  pthread_mutex_lock(&u->mu);
  if (!u->closing) {
    u->closing = 1;
    u->grace_ms = grace_ms;
  }
  pthread_mutex_unlock(&u->mu);
  curl_multi_wakeup(u->m);
}

void up_free(upstream *u) {
  int eof;
  up_msg *m;
  if (!u) return;
  up_close(u, 0);
  pthread_join(u->th, NULL);
  while ((m = up_take(u, &eof))) {
    while (m) {
      up_msg *nx = m->next;
      free(m);
      m = nx;
    }
  }
  while (u->in) {
    qmsg *q = u->in;
    u->in = q->next;
    gw_who_unref(q->who);
    free(q->sid_end);
    free(q);
  }
  curl_multi_cleanup(u->m);
  pthread_mutex_destroy(&u->mu);
  free(u);
}

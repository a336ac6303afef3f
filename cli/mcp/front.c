/*
** front.c - `idem mcp --listen HOST:PORT`: the gateway serves MCP's
** Streamable HTTP transport at /mcp to any number of clients at once
** (SPEC §10b).
**
** Shape.  libmicrohttpd serves, a thread per connection (bounded by
** --max-connections).  A POST's body is one JSON-RPC message; it is checked
** here, made one line (its raw newlines are whitespace), given an id of
** the front's own (clients' ids collide: every client starts at 1) and
** handed to the gateway's loop (front_take) with who sent it (gw_who: its
** session at idem, a digest of its credential, the credential itself when
** credentials pass upstream).  The connection's thread then waits for the
** loop's answer (front_to_client), which gets the client's id back.  A
** message the server sends about the request first (progress, a log
** line) turns the answer into an SSE stream, ended by the answer; without
** one the answer is plain JSON.  A GET opens a session's stream for the
** server's other messages; DELETE ends a session.
**
** Sessions.  An initialize without Mcp-Session-Id opens a session at idem:
** a random id, bound to the digest of the credential that opened it.  A
** request naming a session that is not there, or that another credential
** opened, gets 404 and is not passed on.  A request without a session (the
** 2026-07-28 revision has none) is a session of its own: its JSON-RPC id
** names nothing beyond it.
**
** Told.  The loop asks whether a request's client is still there
** (front_alive: its socket not hung up) before it records an answer told,
** and holds the call (front_pin) until libmicrohttpd says the answer was
** written whole (front_told): a client that left mid-call was not told
** (SPEC §10), and its call goes on to its outcome (closing the stream is
** no cancellation of the action: in 2026-07-28 it cancels the request,
** and the gateway keeps its own upstream request to the end).
**
** A request must arrive whole within --request-timeout of its start (30 s
** by default), whatever it
** trickles (a watchdog shuts the socket of one that does not), and a body
** over the bound is read and dropped before its 413 (an answer sent while
** the client still sends reaches it as a reset), unless the client waits
** for leave to send (Expect: 100-continue).
**
** The wall, before anything is passed on: Host must name this address
** (DNS rebinding), an Origin when sent must be an allowed one, a body is
** bounded, JSON, one message (no batch), with a MCP-Protocol-Version this
** gateway knows, and with IDEM_MCP_TOKEN set it must carry that bearer
** token.  Authorization (SPEC §10b): a client's credential passes upstream
** unchanged unless idem holds its own (--header 'Authorization: ...'), and
** the upstream's 401 with its WWW-Authenticate comes back unchanged.  An
** OAuth upstream's 401 names metadata whose resource is the upstream's own
** URL, which a client that connected here must refuse: unless idem stands
** at that URL (--public-url; the metadata is then passed through byte for
** byte), the client is told so in words instead.
*/
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <openssl/evp.h>

#include "cli.h"
#include "curlfn.h"
#include "front.h"
#include "mcp.h"
#include "serve/serve.h"

#define BUCKETS 256
#define WAIT_MS 200 /* how often a waiting thread looks at its socket */
#define WELL_KNOWN_MAX ((size_t)1 << 20)
#define DRAIN_MAX ((size_t)64 << 20) /* read past a refused body, then close */
#define IDLE_S 30 /* a kept-alive connection may wait this for its next request */

static const char *const versions[] = {"2024-11-05", "2025-03-26", "2025-06-18",
                                       "2025-11-25", "2026-07-28"};

typedef struct fev { /* one message for a client, in order */
  struct fev *next;
  int final;
  size_t len;
  char text[];
} fev;

typedef struct fsess {
  char id[40];
  char caller[33];
  struct freq *get; /* its open GET stream */
  struct fsess *next;
} fsess;

/* A request of a client's that waits for the loop, or a GET stream. */
typedef struct freq {
  long long frid;
  front *f;
  int fd;            /* the client's socket */
  char *orig_id;     /* the client's own id, raw JSON */
  size_t orig_len;
  char sid[40];      /* its session ("" none) */
  int get;           /* a session's GET stream */
  int initialize;    /* opened a session: drop it unless the answer is a result */
  fev *q, *q_tail;   /* what it has still to send */
  int answered;      /* the answer is queued (or sent) */
  int gone;          /* the client left before its answer */
  int done;          /* libmicrohttpd finished: 1 written whole, -1 not */
  int pinned;        /* the loop waits for done */
  pthread_cond_t cv;
  /* the SSE stream being written */
  cli_outbuf out;
  int ended;
  struct freq *next; /* in its bucket */
} freq;

/* One connection, for the watchdog: a client that trickles its request
** (a byte now and then restarts libmicrohttpd's idle clock) is cut off
** --request-timeout after the request began, so it cannot hold a thread and a
** connection slot for ever. */
typedef struct fconn {
  int fd;
  long long since; /* the request being read began (ms), or 0: answering */
  struct fconn *prev, *next;
} fconn;

/* One connection's request, as libmicrohttpd hands it over in pieces. */
typedef struct hreq {
  cli_outbuf body;
  int refused;
  size_t drained;  /* bytes of a refused body read and dropped */
  int too_big;     /* answer 413 once the body is read (or DRAIN_MAX) */
  fconn *conn;
  freq *r;
} hreq;

struct front {
  front_opts o;
  serve_names nm;
  char url[340];
  struct MHD_Daemon *d;
  pthread_mutex_t mu;
  freq *reqs[BUCKETS];
  fsess *sessions;
  long long next_frid;
  front_in *in, *in_tail;
  int said_oauth;
  fconn *conns;
  pthread_t watchdog;
  int watching, stopping;
  pthread_cond_t stop_cv;
};

/* ---- small things ------------------------------------------------------------------ */

static void oom(void) {
  cli_err("out of memory");
  exit(EXIT_FAIL);
}

static char *dupn(const char *p, size_t n) {
  char *q = malloc(n + 1);
  if (!q) oom();
  memcpy(q, p, n);
  q[n] = '\0';
  return q;
}

static void random_hex(char *out, size_t bytes) {
  unsigned char r[32];
  FILE *f = fopen("/dev/urandom", "rb");
  if (bytes > sizeof r) bytes = sizeof r;
  if (!f || fread(r, 1, bytes, f) != bytes) {
    cli_err("no random bytes for a session id");
    exit(EXIT_FAIL);
  }
  fclose(f);
  for (size_t i = 0; i < bytes; i++) sprintf(out + 2 * i, "%02x", r[i]);
}

/* The first 16 bytes of SHA-256(s), in hex (33 bytes with the NUL). */
static void digest(const char *s, char *out) {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned n = 0;
  EVP_Digest(s, strlen(s), md, &n, EVP_sha256(), NULL);
  for (unsigned i = 0; i < 16; i++) sprintf(out + 2 * i, "%02x", md[i]);
}

static int same_secret(const char *a, const char *b) {
  size_t n = strlen(a), m = strlen(b);
  unsigned char d = n != m;
  for (size_t i = 0; i < n; i++) d |= (unsigned char)(a[i] ^ b[i % (m ? m : 1)]);
  return d == 0;
}

static const char *header(struct MHD_Connection *c, const char *name) {
  return MHD_lookup_connection_value(c, MHD_HEADER_KIND, name);
}

/* Does header name, when sent, hold a NUL (which would cut it short for
** every check that reads it as a string)?  libmicrohttpd 0.9.75 itself
** keeps a value only up to a NUL, so the checks see what comes before it
** and nothing after it counts; a version that keeps the length is caught
** here. */
static int header_has_nul(struct MHD_Connection *c, const char *name) {
  const char *v = NULL;
  size_t n = 0;
  if (MHD_lookup_connection_value_n(c, MHD_HEADER_KIND, name, strlen(name), &v,
                                    &n) != MHD_YES || !v)
    return 0;
  return strlen(v) != n;
}

static void wake(front *f) {
  unsigned char b = 1;
  if (write(f->o.wake_fd, &b, 1) < 0) { /* full: the loop wakes anyway */
  }
}

static void push_in(front *f, front_in *m) {
  pthread_mutex_lock(&f->mu);
  if (f->in_tail)
    f->in_tail->next = m;
  else
    f->in = m;
  f->in_tail = m;
  pthread_mutex_unlock(&f->mu);
  wake(f);
}

static front_in *new_in(int kind, const char *line, size_t len) {
  front_in *m = calloc(1, sizeof *m + len + 1);
  if (!m) oom();
  m->kind = kind;
  if (line) memcpy(m->line, line, len);
  m->len = len;
  return m;
}

/* Is the client on fd gone (hung up, reset)? */
static int hung_up(int fd) {
  struct pollfd p = {fd, POLLRDHUP, 0};
  if (fd < 0) return 0;
  return poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR));
}

/* ---- answers ----------------------------------------------------------------------- */

static enum MHD_Result reply(struct MHD_Connection *c, unsigned status,
                             const char *type, const char *body, size_t len,
                             const char *sid) {
  struct MHD_Response *r =
      MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
  enum MHD_Result ok;
  if (!r) return MHD_NO;
  if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
  if (sid) MHD_add_response_header(r, "Mcp-Session-Id", sid);
  ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

/* A JSON-RPC error as the HTTP answer (id: raw JSON or NULL). */
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status,
                                   const char *id, size_t idlen, int code,
                                   const char *fmt, ...) {
  char msg[700];
  cli_outbuf b;
  va_list ap;
  enum MHD_Result ok;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  cli_outbuf_init(&b, (size_t)-1);
  if (mcp_put_error(&b, id, idlen, code, msg)) oom();
  ok = reply(c, status, "application/json", b.p, b.len, NULL);
  cli_outbuf_free(&b);
  return ok;
}

/* ---- requests waiting for the loop ------------------------------------------------- */

static freq *find_locked(front *f, long long frid) {
  freq *r;
  for (r = f->reqs[frid % BUCKETS]; r; r = r->next)
    if (r->frid == frid) return r;
  return NULL;
}

static freq *new_req(front *f, int fd) {
  freq *r = calloc(1, sizeof *r);
  if (!r) oom();
  r->f = f;
  r->fd = fd;
  pthread_cond_init(&r->cv, NULL);
  cli_outbuf_init(&r->out, (size_t)-1);
  pthread_mutex_lock(&f->mu);
  r->frid = ++f->next_frid;
  r->next = f->reqs[r->frid % BUCKETS];
  f->reqs[r->frid % BUCKETS] = r;
  pthread_mutex_unlock(&f->mu);
  return r;
}

static void free_req_locked(front *f, freq *r) {
  freq **pp = &f->reqs[r->frid % BUCKETS];
  while (*pp && *pp != r) pp = &(*pp)->next;
  if (*pp) *pp = r->next;
  while (r->q) {
    fev *e = r->q;
    r->q = e->next;
    free(e);
  }
  for (fsess *s = f->sessions; s; s = s->next)
    if (s->get == r) s->get = NULL;
  pthread_cond_destroy(&r->cv);
  cli_outbuf_free(&r->out);
  free(r->orig_id);
  free(r);
}

static void queue_ev_locked(freq *r, const char *p, size_t n, int final) {
  fev *e = malloc(sizeof *e + n + 1);
  if (!e) oom();
  e->next = NULL;
  e->final = final;
  e->len = n;
  memcpy(e->text, p, n);
  e->text[n] = '\0';
  if (r->q_tail)
    r->q_tail->next = e;
  else
    r->q = e;
  r->q_tail = e;
  if (final) r->answered = 1;
  pthread_cond_signal(&r->cv);
}

/* Wait for the next message of r; NULL when its client left first (then
** r->gone).  Called with f->mu held. */
static fev *next_ev_locked(front *f, freq *r) {
  while (!r->q) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_nsec += (long)WAIT_MS * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
      ts.tv_sec++;
      ts.tv_nsec -= 1000000000L;
    }
    pthread_cond_timedwait(&r->cv, &f->mu, &ts);
    if (r->q) break;
    if (r->ended || hung_up(r->fd)) {
      r->gone = 1;
      return NULL;
    }
  }
  {
    fev *e = r->q;
    r->q = e->next;
    if (!r->q) r->q_tail = NULL;
    return e;
  }
}

/* libmicrohttpd pulls an SSE stream's bytes here, from its thread. */
static ssize_t sse_read(void *cls, uint64_t pos, char *buf, size_t max) {
  freq *r = cls;
  front *f = r->f;
  size_t k;
  (void)pos;
  pthread_mutex_lock(&f->mu);
  if (!r->out.len) {
    fev *e;
    if (r->ended) {
      pthread_mutex_unlock(&f->mu);
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    if (!(e = next_ev_locked(f, r))) {
      pthread_mutex_unlock(&f->mu);
      if (!r->get) {
        front_in *m = new_in(FI_GONE, NULL, 0);
        m->frid = r->frid;
        push_in(f, m);
      }
      return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    if (cli_outbuf_str(&r->out, "event: message\ndata: ") ||
        cli_outbuf_put(&r->out, e->text, e->len) ||
        cli_outbuf_str(&r->out, "\n\n"))
      oom();
    if (e->final) r->ended = 1;
    free(e);
  }
  k = r->out.len < max ? r->out.len : max;
  memcpy(buf, r->out.p, k);
  cli_outbuf_consume(&r->out, k);
  pthread_mutex_unlock(&f->mu);
  return (ssize_t)k;
}


/* ---- the loop's side ---------------------------------------------------------------- */

front_in *front_take(front *f) {
  front_in *m;
  pthread_mutex_lock(&f->mu);
  m = f->in;
  f->in = f->in_tail = NULL;
  pthread_mutex_unlock(&f->mu);
  return m;
}

void front_in_free(front_in *m) {
  gw_who_unref(m->who);
  free(m);
}

/* The id of a line the loop wrote to a client: the front's own number. */
static long long frid_of(const char *line, size_t len, size_t *vs, size_t *ve) {
  char num[24];
  size_t n;
  if (mcp_member(line, len, "id", vs, ve) != 1) return 0;
  n = *ve - *vs;
  if (!n || n >= sizeof num) return 0;
  memcpy(num, line + *vs, n);
  num[n] = '\0';
  for (size_t i = 0; i < n; i++)
    if (num[i] < '0' || num[i] > '9') return 0;
  return strtoll(num, NULL, 10);
}

void front_to_client(front *f, const char *line, size_t len) {
  size_t vs, ve;
  long long frid;
  freq *r;
  while (len && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
  frid = frid_of(line, len, &vs, &ve);
  pthread_mutex_lock(&f->mu);
  if ((r = find_locked(f, frid)) && !r->gone && !r->answered && !r->get) {
    cli_outbuf b;
    cli_outbuf_init(&b, (size_t)-1);
    if (cli_outbuf_put(&b, line, vs) ||
        cli_outbuf_put(&b, r->orig_id, r->orig_len) ||
        cli_outbuf_put(&b, line + ve, len - ve))
      oom();
    queue_ev_locked(r, b.p, b.len, 1);
    cli_outbuf_free(&b);
  }
  pthread_mutex_unlock(&f->mu);
}

int front_server_msg(front *f, long long frid, const char *sid,
                     const char *line, size_t len) {
  freq *r = NULL;
  pthread_mutex_lock(&f->mu);
  if (frid) r = find_locked(f, frid);
  if (r && (r->gone || r->answered || r->get)) r = NULL;
  if (!r && sid)
    for (fsess *s = f->sessions; s; s = s->next)
      if (!strcmp(s->id, sid)) r = s->get;
  if (r) queue_ev_locked(r, line, len, 0);
  pthread_mutex_unlock(&f->mu);
  return r ? 0 : -1;
}

int front_alive(front *f, long long frid) {
  freq *r;
  int alive;
  pthread_mutex_lock(&f->mu);
  r = find_locked(f, frid);
  alive = r && !r->gone && !r->done && !r->answered && !hung_up(r->fd);
  pthread_mutex_unlock(&f->mu);
  return alive;
}

void front_pin(front *f, long long frid) {
  freq *r;
  pthread_mutex_lock(&f->mu);
  if ((r = find_locked(f, frid))) r->pinned = 1;
  pthread_mutex_unlock(&f->mu);
}

int front_told(front *f, long long frid, int at_end) {
  freq *r;
  int told;
  pthread_mutex_lock(&f->mu);
  r = find_locked(f, frid);
  told = !r ? -1 : r->done ? r->done : at_end ? -1 : 0;
  if (r && told) free_req_locked(f, r);
  pthread_mutex_unlock(&f->mu);
  return told;
}

/* ---- sessions ---------------------------------------------------------------------- */

static fsess *find_session_locked(front *f, const char *id) {
  for (fsess *s = f->sessions; s; s = s->next)
    if (!strcmp(s->id, id)) return s;
  return NULL;
}

static void drop_session(front *f, const char *id) {
  fsess **pp;
  pthread_mutex_lock(&f->mu);
  for (pp = &f->sessions; *pp; pp = &(*pp)->next)
    if (!strcmp((*pp)->id, id)) {
      fsess *s = *pp;
      if (s->get) {
        s->get->ended = 1;
        pthread_cond_signal(&s->get->cv);
      }
      *pp = s->next;
      free(s);
      break;
    }
  pthread_mutex_unlock(&f->mu);
  {
    front_in *m = new_in(FI_END_SESSION, id, strlen(id));
    push_in(f, m);
  }
}

/* ---- the wall ---------------------------------------------------------------------- */

static int loopback_origin(const char *o) {
  static const char *const pre[] = {"http://localhost", "http://127.0.0.1",
                                    "http://[::1]", "https://localhost",
                                    "https://127.0.0.1", "https://[::1]"};
  for (size_t i = 0; i < sizeof pre / sizeof *pre; i++) {
    size_t n = strlen(pre[i]);
    if (!strncmp(o, pre[i], n) && (o[n] == '\0' || o[n] == ':')) return 1;
  }
  return 0;
}

static int origin_ok(front *f, const char *o) {
  if (!o) return 1;
  if (!f->nm.any_host && loopback_origin(o)) return 1;
  for (int i = 0; i < f->o.norigins; i++)
    if (!strcmp(o, f->o.origins[i])) return 1;
  if (f->o.public_url) {
    const char *p = strstr(f->o.public_url, "://");
    const char *e = p ? strchr(p + 3, '/') : NULL;
    size_t n = e ? (size_t)(e - f->o.public_url) : strlen(f->o.public_url);
    if (strlen(o) == n && !strncmp(o, f->o.public_url, n)) return 1;
  }
  return 0;
}

static int host_ok(front *f, const char *h) {
  if (serve_host_ok(&f->nm, h)) return 1;
  if (h && f->o.public_url) {
    const char *p = strstr(f->o.public_url, "://");
    const char *e;
    size_t n;
    if (!p) return 0;
    p += 3;
    e = strchr(p, '/');
    n = e ? (size_t)(e - p) : strlen(p);
    return strlen(h) == n && !strncasecmp(h, p, n);
  }
  return 0;
}

/* ---- /.well-known/ with --public-url: the upstream's own, byte for byte ---------- */

typedef struct wk {
  cli_outbuf body;
  char ctype[200];
} wk;

static size_t wk_body(char *p, size_t size, size_t n, void *ctx) {
  wk *w = ctx;
  return cli_outbuf_put(&w->body, p, size * n) ? 0 : size * n;
}

static size_t wk_header(char *p, size_t size, size_t n, void *ctx) {
  wk *w = ctx;
  size_t len = size * n;
  if (len > 13 && !strncasecmp(p, "content-type:", 13)) {
    size_t i = 13, e = len;
    while (i < e && p[i] == ' ') i++;
    while (e > i && (p[e - 1] == '\r' || p[e - 1] == '\n')) e--;
    snprintf(w->ctype, sizeof w->ctype, "%.*s", (int)(e - i), p + i);
  }
  return len;
}

static enum MHD_Result well_known(front *f, struct MHD_Connection *c,
                                  const char *url) {
  char target[2048];
  const char *p = strstr(f->o.upstream_url, "://"), *e;
  const char *why = cli_curl_need();
  CURL *h;
  wk w;
  long status = 0;
  CURLcode rc;
  enum MHD_Result ok;
  if (why || !p) return reply(c, 502, "text/plain", "no upstream", 11, NULL);
  e = strchr(p + 3, '/');
  snprintf(target, sizeof target, "%.*s%s",
           (int)(e ? (size_t)(e - f->o.upstream_url) : strlen(f->o.upstream_url)),
           f->o.upstream_url, url);
  memset(&w, 0, sizeof w);
  cli_outbuf_init(&w.body, WELL_KNOWN_MAX);
  if (!(h = curl_easy_init())) oom();
  curl_easy_setopt(h, CURLOPT_URL, target);
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, wk_body);
  curl_easy_setopt(h, CURLOPT_WRITEDATA, &w);
  curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, wk_header);
  curl_easy_setopt(h, CURLOPT_HEADERDATA, &w);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 10000L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  rc = curl_easy_perform(h);
  if (rc == CURLE_OK) curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
  curl_easy_cleanup(h);
  if (rc != CURLE_OK || status < 100)
    ok = reply(c, 502, "text/plain", "idem: the upstream did not answer", 33,
               NULL);
  else
    ok = reply(c, (unsigned)status, w.ctype[0] ? w.ctype : NULL,
               w.body.p ? w.body.p : "", w.body.len, NULL);
  cli_outbuf_free(&w.body);
  return ok;
}

/* ---- the watchdog --------------------------------------------------------------------- */

static void on_connection(void *cls, struct MHD_Connection *c, void **socket_ctx,
                          enum MHD_ConnectionNotificationCode code) {
  front *f = cls;
  fconn *k = *socket_ctx;
  if (code == MHD_CONNECTION_NOTIFY_STARTED) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (!(k = calloc(1, sizeof *k))) oom();
    k->fd = ci ? ci->connect_fd : -1;
    k->since = cli_mono_ms();
    pthread_mutex_lock(&f->mu);
    k->next = f->conns;
    if (f->conns) f->conns->prev = k;
    f->conns = k;
    pthread_mutex_unlock(&f->mu);
    *socket_ctx = k;
  } else if (k) { /* closed: before libmicrohttpd closes its socket */
    pthread_mutex_lock(&f->mu);
    if (k->prev)
      k->prev->next = k->next;
    else
      f->conns = k->next;
    if (k->next) k->next->prev = k->prev;
    pthread_mutex_unlock(&f->mu);
    free(k);
    *socket_ctx = NULL;
  }
}

/* The connection record of c (its socket context), or NULL. */
static fconn *conn_of(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
  return ci ? ci->socket_context : NULL;
}

static void set_since(front *f, fconn *k, long long when) {
  if (!k) return;
  pthread_mutex_lock(&f->mu);
  k->since = when;
  pthread_mutex_unlock(&f->mu);
}

/* Once a second: a request still arriving after request_s is cut off (its
** socket shut down; libmicrohttpd then closes the connection). */
static void *watch(void *arg) {
  front *f = arg;
  pthread_mutex_lock(&f->mu);
  while (!f->stopping) {
    struct timespec ts;
    long long now = cli_mono_ms();
    for (fconn *k = f->conns; k; k = k->next)
      if (k->since && now - k->since > f->o.request_s * 1000L && k->fd >= 0) {
        shutdown(k->fd, SHUT_RDWR);
        k->since = 0;
      }
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += 1;
    pthread_cond_timedwait(&f->stop_cv, &f->mu, &ts);
  }
  pthread_mutex_unlock(&f->mu);
  return NULL;
}

/* ---- a POST ------------------------------------------------------------------------- */

/* An answer the upstream client made up from an HTTP failure (up.h), with
** this run's nonce: its status, headers and the upstream's body. */
static int http_answer(front *f, const char *text, size_t len, json_t **out) {
  json_t *root, *d;
  if (!memmem(text, len, UP_HTTP_KEY, sizeof UP_HTTP_KEY - 1)) return 0;
  root = json_loadb(text, len, 0, NULL);
  d = json_object_get(
      json_object_get(json_object_get(root, "error"), "data"), UP_HTTP_KEY);
  if (!d || !json_is_string(json_object_get(d, "gateway")) ||
      strcmp(json_string_value(json_object_get(d, "gateway")), f->o.nonce) ||
      json_integer_value(json_object_get(d, "status")) < 400) {
    json_decref(root);
    return 0;
  }
  *out = json_incref(d);
  json_decref(root);
  return 1;
}

/* The answer to a request, as JSON (no message came before it). */
static enum MHD_Result answer_json(front *f, struct MHD_Connection *c,
                                   freq *r, fev *e) {
  json_t *h = NULL;
  enum MHD_Result ok;
  int result = 0;
  size_t vs, ve;
  if (http_answer(f, e->text, e->len, &h)) {
    if (r->initialize) drop_session(f, r->sid); /* it opened nothing */
    /* what HTTP said upstream, unchanged - unless it is an OAuth
    ** discovery no client connected here can pass */
    json_t *hd = json_object_get(h, "headers");
    const char *www = json_string_value(json_object_get(hd, "www-authenticate"));
    const char *ct = json_string_value(json_object_get(hd, "content-type"));
    const char *body = json_string_value(json_object_get(h, "body"));
    unsigned st = (unsigned)json_integer_value(json_object_get(h, "status"));
    struct MHD_Response *resp;
    if (st == 401 && www && strstr(www, "resource_metadata") &&
        !f->o.public_url) {
      if (!__atomic_fetch_add(&f->said_oauth, 1, __ATOMIC_RELAXED))
        cli_err("the upstream asks for OAuth (its 401 names resource "
                "metadata); a client cannot authorize through idem at %s: "
                "run idem mcp with --public-url (idem standing at the URL "
                "the metadata names) or with its own credential (--header "
                "'Authorization: Bearer {$env:NAME}')",
                f->url);
      ok = reply_error(
          c, 502, r->orig_id, r->orig_len, -32001,
          "idem: the upstream asks for OAuth, and its metadata names its own "
          "URL, not %s, so a client's discovery through idem must fail; run "
          "idem mcp with --public-url (idem at the URL the metadata names) "
          "or give idem its own credential (--header 'Authorization: Bearer "
          "{$env:NAME}') - the upstream said: %s",
          f->url, www);
      json_decref(h);
      return ok;
    }
    resp = MHD_create_response_from_buffer(body ? strlen(body) : 0,
                                           (void *)(body ? body : ""),
                                           MHD_RESPMEM_MUST_COPY);
    if (!resp) {
      json_decref(h);
      return MHD_NO;
    }
    if (www) MHD_add_response_header(resp, "WWW-Authenticate", www);
    if (ct) MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE, ct);
    ok = MHD_queue_response(c, st, resp);
    MHD_destroy_response(resp);
    json_decref(h);
    return ok;
  }
  result = mcp_member(e->text, e->len, "result", &vs, &ve) == 1;
  if (r->initialize && !result) drop_session(f, r->sid);
  ok = reply(c, 200, "application/json", e->text, e->len,
             r->initialize && result ? r->sid : NULL);
  return ok;
}

static enum MHD_Result on_post(front *f, struct MHD_Connection *c, hreq *h) {
  const char *sid = header(c, "Mcp-Session-Id");
  const char *auth = header(c, MHD_HTTP_HEADER_AUTHORIZATION);
  const char *proto = header(c, "MCP-Protocol-Version");
  const char *ctype = header(c, MHD_HTTP_HEADER_CONTENT_TYPE);
  const char *who_cred;
  const union MHD_ConnectionInfo *ci;
  json_error_t je;
  json_t *root;
  char *line;
  size_t len = h->body.len;
  mcp_msg m;
  char err[300], caller[33] = "";
  gw_who *who;
  freq *r;
  fev *e;
  front_in *in;
  int opened = 0;

  if (!ctype || strncasecmp(ctype, "application/json", 16))
    return reply_error(c, 415, NULL, 0, -32600,
                       "idem: a POST to /mcp carries application/json");
  {
    size_t i = 0;
    while (i < len && strchr(" \t\r\n", h->body.p[i])) i++;
    if (i < len && h->body.p[i] == '[') {
      if (!(root = json_loadb(h->body.p, len, 0, &je)))
        return reply_error(c, 400, NULL, 0, -32700,
                           "Parse error: idem: %s (line %d, column %d)",
                           je.text, je.line, je.column);
      json_decref(root);
      return reply_error(c, 400, NULL, 0, -32600,
                         "Invalid Request: idem: a batch (a JSON array) is "
                         "not taken; send one message per POST");
    }
  }
  line = dupn(h->body.p ? h->body.p : "", len);
  for (size_t i = 0; i < len; i++)
    if (line[i] == '\n' || line[i] == '\r') line[i] = ' ';
  if (mcp_msg_parse(line, len, &m, err, sizeof err)) {
    free(line);
    return reply_error(c, 400, NULL, 0, -32700, "Parse error: idem: %s", err);
  }
  if (m.kind == MCP_INVALID) {
    mcp_msg_free(&m);
    free(line);
    return reply_error(c, 400, NULL, 0, -32600,
                       "Invalid Request: idem: not a JSON-RPC 2.0 message");
  }
  /* who: the credential presented here names the caller */
  who_cred = f->o.caller_header ? header(c, f->o.caller_header) : auth;
  if (who_cred && *who_cred) digest(who_cred, caller);
  if (sid) {
    fsess *s;
    int mine;
    pthread_mutex_lock(&f->mu);
    s = find_session_locked(f, sid);
    mine = s && !strcmp(s->caller, caller);
    pthread_mutex_unlock(&f->mu);
    if (!mine) {
      mcp_msg_free(&m);
      free(line);
      return reply_error(c, 404, NULL, 0, -32001,
                         "idem: no such session (Mcp-Session-Id); initialize "
                         "again");
    }
  } else if (m.kind == MCP_REQUEST && !strcmp(m.method, "initialize")) {
    fsess *s = calloc(1, sizeof *s);
    if (!s) oom();
    random_hex(s->id, 16);
    memcpy(s->caller, caller, sizeof caller);
    pthread_mutex_lock(&f->mu);
    s->next = f->sessions;
    f->sessions = s;
    pthread_mutex_unlock(&f->mu);
    sid = s->id;
    opened = 1;
  }
  if (!(who = calloc(1, sizeof *who))) oom();
  who->refs = 1;
  memcpy(who->caller, caller, sizeof caller);
  if (sid) who->sid = dupn(sid, strlen(sid));
  if (f->o.pass_auth && auth) who->auth = dupn(auth, strlen(auth));
  if (proto) who->proto = dupn(proto, strlen(proto));
  if (sid) {
    who->scope = dupn(sid, strlen(sid));
  } else {
    char nonce[33];
    random_hex(nonce, 12);
    who->scope = dupn(nonce, strlen(nonce));
  }
  if (m.kind != MCP_REQUEST) { /* a notification, or a response: 202 */
    in = new_in(FI_MSG, line, len);
    in->who = who;
    push_in(f, in);
    mcp_msg_free(&m);
    free(line);
    return reply(c, 202, NULL, "", 0, NULL);
  }
  ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  r = new_req(f, ci ? ci->connect_fd : -1);
  r->orig_id = dupn(line + m.id_s, m.id_e - m.id_s);
  r->orig_len = m.id_e - m.id_s;
  r->initialize = opened;
  if (sid) snprintf(r->sid, sizeof r->sid, "%s", sid);
  who->frid = r->frid;
  who->id = dupn(r->orig_id, r->orig_len);
  h->r = r;
  {
    char num[24];
    cli_outbuf b;
    snprintf(num, sizeof num, "%lld", r->frid);
    cli_outbuf_init(&b, (size_t)-1);
    if (mcp_splice(&b, line, len, m.id_s, m.id_e, num, strlen(num))) oom();
    in = new_in(FI_MSG, b.p, b.len - 1); /* no newline */
    cli_outbuf_free(&b);
  }
  in->who = who;
  in->frid = r->frid;
  mcp_msg_free(&m);
  free(line);
  push_in(f, in);

  pthread_mutex_lock(&f->mu);
  e = next_ev_locked(f, r);
  pthread_mutex_unlock(&f->mu);
  if (!e) { /* the client left: the call goes on, not told */
    in = new_in(FI_GONE, NULL, 0);
    in->frid = r->frid;
    push_in(f, in);
    if (opened) drop_session(f, r->sid);
    return MHD_NO;
  }
  if (e->final) {
    enum MHD_Result ok = answer_json(f, c, r, e);
    free(e);
    return ok;
  }
  {
    /* a message before the answer: the answer becomes a stream */
    struct MHD_Response *resp;
    enum MHD_Result ok;
    pthread_mutex_lock(&f->mu);
    if (cli_outbuf_str(&r->out, "event: message\ndata: ") ||
        cli_outbuf_put(&r->out, e->text, e->len) ||
        cli_outbuf_str(&r->out, "\n\n"))
      oom();
    pthread_mutex_unlock(&f->mu);
    free(e);
    resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read,
                                             r, NULL);
    if (!resp) return MHD_NO;
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                            "text/event-stream");
    MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    if (opened) MHD_add_response_header(resp, "Mcp-Session-Id", r->sid);
    ok = MHD_queue_response(c, 200, resp);
    MHD_destroy_response(resp);
    return ok;
  }
}

static enum MHD_Result on_get(front *f, struct MHD_Connection *c, hreq *h,
                              const char *caller) {
  const char *sid = header(c, "Mcp-Session-Id");
  const char *accept = header(c, MHD_HTTP_HEADER_ACCEPT);
  const union MHD_ConnectionInfo *ci;
  struct MHD_Response *resp;
  fsess *s;
  freq *r;
  enum MHD_Result ok;
  if (!accept || !strstr(accept, "text/event-stream"))
    return reply_error(c, 406, NULL, 0, -32600,
                       "idem: a GET of /mcp is a text/event-stream");
  if (!sid)
    return reply_error(c, 405, NULL, 0, -32600,
                       "idem: a GET of /mcp needs a session (Mcp-Session-Id)");
  ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  r = new_req(f, ci ? ci->connect_fd : -1);
  r->get = 1;
  snprintf(r->sid, sizeof r->sid, "%s", sid);
  pthread_mutex_lock(&f->mu);
  s = find_session_locked(f, sid);
  if (!s || strcmp(s->caller, caller) || s->get) {
    int busy = s && !strcmp(s->caller, caller) && s->get;
    r->done = -1;
    free_req_locked(f, r);
    pthread_mutex_unlock(&f->mu);
    return busy ? reply_error(c, 409, NULL, 0, -32600,
                              "idem: this session has a GET stream open")
                : reply_error(c, 404, NULL, 0, -32001,
                              "idem: no such session (Mcp-Session-Id)");
  }
  s->get = r;
  pthread_mutex_unlock(&f->mu);
  h->r = r;
  set_since(f, h->conn, 0);
  resp = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 4096, sse_read, r,
                                           NULL); /* r: on_done's */
  if (!resp) return MHD_NO;
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CONTENT_TYPE,
                          "text/event-stream");
  MHD_add_response_header(resp, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
  ok = MHD_queue_response(c, 200, resp);
  MHD_destroy_response(resp);
  return ok;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *upload,
                                  size_t *upload_size, void **ptr) {
  front *f = cls;
  hreq *h = *ptr;
  (void)version;
  if (!h) {
    const char *proto = header(c, "MCP-Protocol-Version");
    const char *auth = header(c, MHD_HTTP_HEADER_AUTHORIZATION);
    const char *clen = header(c, MHD_HTTP_HEADER_CONTENT_LENGTH);
    int known = !proto;
    static const char *const checked[] = {
        MHD_HTTP_HEADER_HOST, "Origin", "Mcp-Session-Id",
        MHD_HTTP_HEADER_AUTHORIZATION, "MCP-Protocol-Version",
        MHD_HTTP_HEADER_CONTENT_TYPE};
    if (!(h = calloc(1, sizeof *h))) return MHD_NO;
    cli_outbuf_init(&h->body, f->o.max_body);
    *ptr = h;
    h->refused = 1; /* until it passes the wall */
    h->conn = conn_of(c);
    for (size_t i = 0; i < sizeof checked / sizeof *checked; i++)
      if (header_has_nul(c, checked[i]) ||
          (f->o.caller_header && header_has_nul(c, f->o.caller_header)))
        return reply_error(c, 400, NULL, 0, -32600,
                           "idem: refused: the header %s holds a NUL byte",
                           checked[i]);
    if (clen && header(c, MHD_HTTP_HEADER_TRANSFER_ENCODING))
      return reply_error(c, 400, NULL, 0, -32600,
                         "idem: refused: both Content-Length and "
                         "Transfer-Encoding (RFC 9112 6.3)");
    if (!host_ok(f, header(c, MHD_HTTP_HEADER_HOST)))
      return reply_error(c, 403, NULL, 0, -32600,
                         "idem: refused: Host %s does not name this gateway",
                         header(c, MHD_HTTP_HEADER_HOST)
                             ? header(c, MHD_HTTP_HEADER_HOST)
                             : "(none)");
    if (!origin_ok(f, header(c, "Origin")))
      return reply_error(c, 403, NULL, 0, -32600,
                         "idem: refused: Origin %s is not allowed (idem mcp "
                         "--allow-origin)",
                         header(c, "Origin"));
    if (f->o.public_url && !strcmp(method, "GET") &&
        !strncmp(url, "/.well-known/", 13))
      return well_known(f, c, url);
    if (strcmp(url, "/mcp") != 0)
      return reply(c, 404, "text/plain", "not found\n", 10, NULL);
    if (f->o.token &&
        (!auth || strncmp(auth, "Bearer ", 7) || !same_secret(auth + 7, f->o.token))) {
      struct MHD_Response *r = MHD_create_response_from_buffer(
          0, (void *)"", MHD_RESPMEM_PERSISTENT);
      enum MHD_Result ok;
      if (!r) return MHD_NO;
      MHD_add_response_header(r, "WWW-Authenticate", "Bearer realm=\"idem mcp\"");
      ok = MHD_queue_response(c, 401, r);
      MHD_destroy_response(r);
      return ok;
    }
    for (size_t i = 0; proto && i < sizeof versions / sizeof *versions; i++)
      if (!strcmp(proto, versions[i])) known = 1;
    if (!known)
      return reply_error(c, 400, NULL, 0, -32600,
                         "idem: MCP-Protocol-Version %.60s is not one this "
                         "gateway knows",
                         proto);
    if (!strcmp(method, "POST")) {
      h->refused = 0;
      /* too big: read it (to DRAIN_MAX) and drop it, then say 413 - an
      ** answer sent while the client still sends reaches it as a reset */
      if (clen && strtoull(clen, NULL, 10) > f->o.max_body) {
        const char *expect = header(c, MHD_HTTP_HEADER_EXPECT);
        if (expect && !strcasecmp(expect, "100-continue")) /* it waits */
          return reply_error(c, 413, NULL, 0, -32600,
                             "idem: message larger than %zu bytes refused "
                             "(idem mcp --max-message)",
                             f->o.max_body);
        h->too_big = 1;
      }
      return MHD_YES;
    }
    if (!strcmp(method, "GET")) {
      char caller[33] = "";
      const char *cred = f->o.caller_header ? header(c, f->o.caller_header) : auth;
      if (cred && *cred) digest(cred, caller);
      return on_get(f, c, h, caller);
    }
    if (!strcmp(method, "DELETE")) {
      const char *sid = header(c, "Mcp-Session-Id");
      const char *cred = f->o.caller_header ? header(c, f->o.caller_header) : auth;
      char caller[33] = "";
      fsess *s;
      int mine;
      if (cred && *cred) digest(cred, caller);
      pthread_mutex_lock(&f->mu);
      s = sid ? find_session_locked(f, sid) : NULL;
      mine = s && !strcmp(s->caller, caller);
      pthread_mutex_unlock(&f->mu);
      if (!mine)
        return reply_error(c, 404, NULL, 0, -32001,
                           "idem: no such session (Mcp-Session-Id)");
      drop_session(f, sid);
      return reply(c, 200, NULL, "", 0, NULL);
    }
    {
      struct MHD_Response *r = MHD_create_response_from_buffer(
          0, (void *)"", MHD_RESPMEM_PERSISTENT);
      enum MHD_Result ok;
      if (!r) return MHD_NO;
      MHD_add_response_header(r, "Allow", "GET, POST, DELETE");
      ok = MHD_queue_response(c, 405, r);
      MHD_destroy_response(r);
      return ok;
    }
  }
  if (*upload_size) {
    if (!h->too_big && cli_outbuf_put(&h->body, upload, *upload_size)) {
      h->too_big = 1;
      h->drained = h->body.len;
      cli_outbuf_free(&h->body);
    }
    if (h->too_big) h->drained += *upload_size;
    *upload_size = 0;
    if (h->too_big && h->drained > DRAIN_MAX) {
      h->refused = 1;
      return reply_error(c, 413, NULL, 0, -32600,
                         "idem: message larger than %zu bytes refused (idem "
                         "mcp --max-message)",
                         f->o.max_body);
    }
    return MHD_YES;
  }
  if (h->refused) return MHD_YES; /* its answer is queued */
  h->refused = 1;                   /* answered once */
  set_since(f, h->conn, 0);         /* read whole: the watchdog lets it be */
  if (h->too_big)
    return reply_error(c, 413, NULL, 0, -32600,
                       "idem: message larger than %zu bytes refused (idem "
                       "mcp --max-message)",
                       f->o.max_body);
  return on_post(f, c, h);
}

static void on_done(void *cls, struct MHD_Connection *c, void **ptr,
                    enum MHD_RequestTerminationCode toe) {
  front *f = cls;
  hreq *h = *ptr;
  (void)c;
  if (!h) return;
  /* keep-alive: the next request may wait IDLE_S, as libmicrohttpd lets an
  ** idle connection wait, then arrive within the same bound */
  set_since(f, h->conn,
            cli_mono_ms() + (f->o.request_s < IDLE_S
                                 ? (IDLE_S - f->o.request_s) * 1000LL
                                 : 0));
  if (h->r) {
    freq *r = h->r;
    pthread_mutex_lock(&f->mu);
    r->done = toe == MHD_REQUEST_TERMINATED_COMPLETED_OK && !r->gone ? 1 : -1;
    if (!r->pinned) free_req_locked(f, r);
    pthread_mutex_unlock(&f->mu);
    wake(f);
  }
  cli_outbuf_free(&h->body);
  free(h);
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  (void)cls;
  (void)fmt;
  (void)ap; /* a client's broken request is its own business */
}

/* ---- starting and stopping -------------------------------------------------------- */

front *front_start(const front_opts *o) {
  front *f = calloc(1, sizeof *f);
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION |
                   MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL |
                   MHD_USE_ERROR_LOG;
  int fd, v6;
  if (!f) oom();
  f->o = *o;
  pthread_mutex_init(&f->mu, NULL);
  if ((fd = serve_bind("mcp", o->listen, &f->nm, &v6)) < 0) {
    pthread_mutex_destroy(&f->mu);
    free(f);
    return NULL;
  }
  if (v6) flags |= MHD_USE_IPv6;
  snprintf(f->url, sizeof f->url, "%s/mcp", f->nm.origin);
  if (f->nm.any_host && !o->token && !o->pass_auth) {
    cli_err("--listen %s is beyond loopback and idem holds its own upstream "
            "credential: set IDEM_MCP_TOKEN, the token clients must present, "
            "or anyone who reaches the port acts with it",
            o->listen);
    close(fd);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return NULL;
  }
  f->d = MHD_start_daemon(
      flags, 0, NULL, NULL, on_request, f, MHD_OPTION_LISTEN_SOCKET, fd,
      MHD_OPTION_NOTIFY_COMPLETED, on_done, f, MHD_OPTION_EXTERNAL_LOGGER,
      on_mhd_log, NULL, MHD_OPTION_NOTIFY_CONNECTION, on_connection, f,
      MHD_OPTION_STRICT_FOR_CLIENT, 1, MHD_OPTION_THREAD_STACK_SIZE,
      (size_t)256 << 10, MHD_OPTION_CONNECTION_LIMIT,
      (unsigned)o->max_connections, MHD_OPTION_PER_IP_CONNECTION_LIMIT, 0u,
      MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)(o->request_s > IDLE_S ? o->request_s : IDLE_S), MHD_OPTION_END);
  if (!f->d) {
    cli_err("cannot serve on %s: libmicrohttpd refused", o->listen);
    close(fd);
    pthread_mutex_destroy(&f->mu);
    free(f);
    return NULL;
  }
  pthread_cond_init(&f->stop_cv, NULL);
  f->watching = pthread_create(&f->watchdog, NULL, watch, f) == 0;
  return f;
}

const char *front_url(const front *f) { return f->url; }

void front_stop(front *f) {
  front_in *m;
  if (!f) return;
  /* waiting threads see their requests ended, and libmicrohttpd joins them */
  pthread_mutex_lock(&f->mu);
  for (size_t i = 0; i < BUCKETS; i++)
    for (freq *r = f->reqs[i]; r; r = r->next) {
      r->ended = 1;
      pthread_cond_signal(&r->cv);
    }
  f->stopping = 1;
  pthread_cond_signal(&f->stop_cv);
  pthread_mutex_unlock(&f->mu);
  if (f->watching) pthread_join(f->watchdog, NULL);
  pthread_cond_destroy(&f->stop_cv);
  MHD_stop_daemon(f->d);
  while ((m = front_take(f)))
    while (m) {
      front_in *nx = m->next;
      front_in_free(m);
      m = nx;
    }
  for (size_t i = 0; i < BUCKETS; i++)
    while (f->reqs[i]) free_req_locked(f, f->reqs[i]);
  while (f->sessions) {
    fsess *s = f->sessions;
    f->sessions = s->next;
    free(s);
  }
  pthread_mutex_destroy(&f->mu);
  free(f);
}

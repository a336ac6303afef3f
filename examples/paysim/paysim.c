/*
** paysim.c - idem-paysim, a small, honest payment provider on loopback.
**
** A Stripe-like refund API for idem's demo and tests to call over real HTTP:
**
**   POST /v1/refunds            apply a refund (Idempotency-Key header)
**   GET  /v1/refunds[?order_id=O][&idempotency_key=K]   list, ledger order
**   GET  /v1/refunds/RE_ID      one refund
**   GET  /_ledger               everything applied, for checks
**   GET  /_mode, POST /_mode    the failure mode of the next requests
**
** Keys work as Stripe's do.  Only an applied refund binds its key (a request
** rejected by validation, a 503 or a 429 leaves it free, as the request
** never ran); afterwards the same key with the same order_id, amount_cents
** and reason gets the same status and body again, marked Idempotent-
** Replayed, and with other parameters a 422 idempotency_error.  While the
** request that applied it has not answered (a stall), or a request with the
** key is held before applying (mode late), the key answers 409, as Stripe
** answers a request with the key of one still in flight.  With --no-dedupe
** (or "dedupe": false) the key binds nothing: every POST applies a new
** refund, which records the key it came with (the provider that does not
** dedupe, where a retry is a second refund).
**
** The failure modes are the ways a real provider leaves its client unsure:
** apply then stall, hold then apply (late: the attempt that lands after its
** client gave up), queue then answer 504 at once and apply later on a thread
** of its own (queued: a proxy in front of the provider timed out, and the
** provider applies the request from its queue all the same - the answer
** ENDED the exchange, and says nothing of the effect), fail before applying,
** apply then reset the connection, apply then die by SIGKILL, refuse status
** reads, answer 429.  Each applies only to a request that would apply a new
** refund (status_down: to status reads), for the next `count` of them or
** until changed.  The ledger line is durable before any answer that reports
** it (and before the failure that follows applying it), so after a crash the
** ledger says exactly what was applied; a refund held (late) or queued
** (queued) when the simulator stops is not applied.
**
** One mutex guards the ledger and the mode; it is never held while waiting
** on the network or a stall.  libmicrohttpd runs a thread per connection,
** so a stalled request blocks nobody else; a queued refund waits on a
** detached thread of its own, counted, and the simulator stops only when
** every one of them has given up (SIGTERM: dropped, not applied).
*/
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <microhttpd.h>

#include "paysim.h"

#define MAX_BODY (1L << 20)   /* request bodies over this get 413 */
#define MAX_DRAIN (64L << 20) /* ... read first when declared up to this */
#define DEFAULT_STALL_MS 30000

/* ---- the failure modes ------------------------------------------------ */

#define MODE_MAP(X)                                                            \
  X(NORMAL, "normal")                                                          \
  X(STALL, "stall")                                                            \
  X(LATE, "late")                                                              \
  X(QUEUED, "queued")                                                          \
  X(FAIL, "fail")                                                              \
  X(RESET, "reset")                                                            \
  X(CRASH, "crash")                                                            \
  X(STATUS_DOWN, "status_down")                                                \
  X(REJECT429, "reject429")

typedef enum {
#define X(e, s) MODE_##e,
  MODE_MAP(X)
#undef X
      MODE_COUNT
} mode;

static const char *const mode_names[] = {
#define X(e, s) s,
    MODE_MAP(X)
#undef X
};

static int mode_parse(const char *s) {
  int i;
  for (i = 0; i < MODE_COUNT; i++)
    if (strcmp(s, mode_names[i]) == 0) return i;
  return -1;
}

/* ---- the server's state ------------------------------------------------ */

static struct {
  pthread_mutex_t mu;
  pthread_cond_t wake; /* stalls wait here; shutdown broadcasts */
  paysim_ledger ledger;
  mode mode;
  long long count; /* requests left in this mode; -1 until changed */
  long long stall_ms;
  int dedupe;   /* the Idempotency-Key binds (off: --no-dedupe) */
  json_t *held; /* keys of requests held by mode late or queued, not */
                /* applied yet                                        */
  int queued;   /* refunds of mode queued waiting on their threads     */
  pthread_cond_t idle; /* a queued refund's thread is done           */
  int stopping;
  int quiet;
} S = {.mu = PTHREAD_MUTEX_INITIALIZER,
       .idle = PTHREAD_COND_INITIALIZER}; /* S.wake: main() */

/* Under S.mu: the mode for one request of the kind it applies to (a new
** refund, or a status read for status_down), counting it down. */
static mode take_mode(int status_read) {
  mode m = S.mode;
  if (m == MODE_NORMAL || (m == MODE_STATUS_DOWN) != status_read)
    return MODE_NORMAL;
  if (S.count > 0 && --S.count == 0) S.mode = MODE_NORMAL;
  return m;
}

/* ---- logging ------------------------------------------------------------ */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* One line per request, written at once so threads do not interleave. */
static void say(const char *fmt, ...) {
  char line[1024];
  va_list ap;
  int n;
  if (S.quiet) return;
  memcpy(line, "paysim: ", 8);
  va_start(ap, fmt);
  n = vsnprintf(line + 8, sizeof line - 9, fmt, ap);
  va_end(ap);
  if (n < 0) return;
  n = n + 8 > (int)sizeof line - 2 ? (int)sizeof line - 2 : n + 8;
  line[n++] = '\n';
  fwrite(line, 1, (size_t)n, stderr);
}

/* A client's string made safe for one log line: printable and short. */
static const char *shown(const char *s, char *buf, size_t len) {
  size_t i, o = 0;
  if (!s) s = "-";
  for (i = 0; s[i] && o + 4 < len; i++)
    buf[o++] = (unsigned char)s[i] < 0x20 || s[i] == 0x7f ? '?' : s[i];
  if (s[i]) memcpy(buf + o, "...", 3), o += 3;
  buf[o] = 0;
  return buf;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap) {
  char line[512];
  (void)cls;
  if (S.quiet) return;
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wformat-nonliteral"
  vsnprintf(line, sizeof line, fmt, ap);
#pragma GCC diagnostic pop
  line[strcspn(line, "\n")] = 0;
  say("mhd: %s", line);
}

/* ---- responses ---------------------------------------------------------- */

/* Send BODY (taken) as JSON with STATUS.  A NULL body (out of memory; a
** json_pack given a NULL part also gives NULL) ends the connection without
** an answer rather than with a wrong one. */
static enum MHD_Result send_json(struct MHD_Connection *c, unsigned status,
                                 json_t *body, const char *header,
                                 const char *value) {
  char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;
  struct MHD_Response *r;
  enum MHD_Result ok;
  json_decref(body);
  if (!text) return MHD_NO;
  r = MHD_create_response_from_buffer(strlen(text), text,
                                      MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(text);
    return MHD_NO;
  }
  MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json");
  if (header) MHD_add_response_header(r, header, value);
  ok = MHD_queue_response(c, status, r);
  MHD_destroy_response(r);
  return ok;
}

static json_t *error_body(const char *type, const char *message) {
  return json_pack("{s:{s:s, s:s}}", "error", "type", type, "message", message);
}

static enum MHD_Result send_error(struct MHD_Connection *c, unsigned status,
                                  const char *type, const char *message) {
  return send_json(c, status, error_body(type, message), NULL, NULL);
}

/* ---- one request ---------------------------------------------------------- */

typedef struct request {
  char *body;
  size_t len, cap;
  int too_big;  /* the body passed MAX_BODY; the rest is read and dropped */
  int answered; /* a response was queued before the body (413) */
} request;

/* The body grows by doubling up to MAX_BODY; past it, it is dropped. */
static void take_body(request *q, const char *data, size_t n) {
  if (q->too_big) return;
  if (n > (size_t)MAX_BODY - q->len) {
    q->too_big = 1;
    return;
  }
  if (q->len + n > q->cap) {
    size_t cap = q->cap ? q->cap : 1024;
    char *p;
    while (cap < q->len + n) cap *= 2;
    p = realloc(q->body, cap);
    if (!p) {
      q->too_big = 1; /* treated as too big: we cannot hold it */
      return;
    }
    q->body = p;
    q->cap = cap;
  }
  memcpy(q->body + q->len, data, n);
  q->len += n;
}

typedef struct refund_args {
  const char *order_id;
  long long amount_cents;
  const char *reason;
} refund_args;

/* Fill A from the JSON body; NULL or the message of the 400. */
static const char *parse_refund(json_t *root, refund_args *a) {
  json_t *order = json_object_get(root, "order_id");
  json_t *amount = json_object_get(root, "amount_cents");
  json_t *reason = json_object_get(root, "reason");
  if (!json_is_object(root)) return "the body must be a JSON object";
  if (!json_is_string(order) || json_string_length(order) == 0 ||
      json_string_length(order) > PAYSIM_MAX_ORDER)
    return "order_id: missing, or not a string of 1 to 255 bytes";
  if (!json_is_integer(amount))
    return "amount_cents: missing, or not an integer";
  if (reason && !json_is_null(reason) &&
      (!json_is_string(reason) ||
       json_string_length(reason) > PAYSIM_MAX_REASON))
    return "reason: not a string of at most 1000 bytes";
  a->order_id = json_string_value(order);
  a->amount_cents = (long long)json_integer_value(amount);
  a->reason = json_string_value(reason);
  return NULL;
}

static int same_args(const paysim_refund *r, const refund_args *a) {
  return strcmp(r->order_id, a->order_id) == 0 &&
         r->amount_cents == a->amount_cents &&
         (r->reason && a->reason ? strcmp(r->reason, a->reason) == 0
                                 : r->reason == a->reason);
}

/* End the connection with a TCP reset and no answer.  Linger 0 makes a
** close() send RST; but libmicrohttpd shuts down the write side first,
** which would send a FIN (an empty reply), so the socket is disconnected
** here with connect(AF_UNSPEC), which on Linux resets an established
** connection at once.  Returning MHD_NO then makes MHD close what is left. */
static enum MHD_Result reset_connection(struct MHD_Connection *c) {
  const union MHD_ConnectionInfo *ci =
      MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  if (ci) {
    struct linger lg = {1, 0};
    struct sockaddr unspec;
    memset(&unspec, 0, sizeof unspec);
    unspec.sa_family = AF_UNSPEC;
    setsockopt(ci->connect_fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
    connect(ci->connect_fd, &unspec, sizeof unspec);
  }
  return MHD_NO;
}

/* Wait out a stall; 0 when it ran to its end, -1 when the server stops. */
static int stall(long long ms) {
  struct timespec until;
  int stopping;
  clock_gettime(CLOCK_MONOTONIC, &until);
  until.tv_sec += (time_t)(ms / 1000);
  until.tv_nsec += (long)(ms % 1000) * 1000000;
  if (until.tv_nsec >= 1000000000) until.tv_sec++, until.tv_nsec -= 1000000000;
  pthread_mutex_lock(&S.mu);
  while (!S.stopping &&
         pthread_cond_timedwait(&S.wake, &S.mu, &until) != ETIMEDOUT) {
  }
  stopping = S.stopping;
  pthread_mutex_unlock(&S.mu);
  return stopping ? -1 : 0;
}

/* A copy of S, or NULL for NULL; *bad set when memory ran out. */
static char *copy_or_null(const char *s, int *bad) {
  char *p;
  size_t n;
  if (!s) return NULL;
  n = strlen(s) + 1;
  if ((p = malloc(n)))
    memcpy(p, s, n);
  else
    *bad = 1;
  return p;
}

/* A refund of mode queued: answered 504 already, applied after delay_ms on
** a thread of its own - or dropped, not applied, when the server stops. */
typedef struct queued_refund {
  char *key, *order_id, *reason;
  long long amount_cents, delay_ms;
  int held; /* its key is in S.held */
} queued_refund;

static void queued_free(queued_refund *qr) {
  free(qr->key);
  free(qr->order_id);
  free(qr->reason);
  free(qr);
}

static void *apply_queued(void *arg) {
  queued_refund *qr = arg;
  char kbuf[80], id[32], err[300];
  int dropped = stall(qr->delay_ms) != 0; /* the server stops: not applied */
  long i;
  shown(qr->key, kbuf, sizeof kbuf);
  pthread_mutex_lock(&S.mu);
  if (qr->held) json_object_del(S.held, qr->key);
  if (dropped) {
    say("POST /v1/refunds key=%s -> dropped from the queue, not applied", kbuf);
  } else if ((i = paysim_ledger_append(&S.ledger, qr->key, qr->order_id,
                                       qr->amount_cents, qr->reason, err,
                                       sizeof err)) < 0) {
    say("POST /v1/refunds key=%s -> not applied from the queue: %s", kbuf, err);
  } else {
    paysim_refund_id(&S.ledger.v[i], id, sizeof id);
    say("POST /v1/refunds key=%s -> applied %s from the queue (mode queued)",
        kbuf, id);
  }
  queued_free(qr);
  S.queued--;
  pthread_cond_broadcast(&S.idle);
  pthread_mutex_unlock(&S.mu);
  return NULL;
}

/* Under S.mu, which it releases: queue the refund of a (mode queued) and
** answer 504 at once, as a proxy whose upstream did not answer in time;
** the refund is applied delay_ms later (apply_queued).  Meanwhile the key
** answers 409 (with dedupe) and status reads do not show it. */
static enum MHD_Result queue_refund(struct MHD_Connection *c, const char *key,
                                    const refund_args *a, long long delay_ms,
                                    int dedupe, const char *kbuf) {
  queued_refund *qr = calloc(1, sizeof *qr);
  pthread_attr_t at;
  pthread_t th;
  int bad = !qr, started = 0;
  if (qr) {
    qr->key = copy_or_null(key, &bad);
    qr->order_id = copy_or_null(a->order_id, &bad);
    qr->reason = copy_or_null(a->reason, &bad);
    qr->amount_cents = a->amount_cents;
    qr->delay_ms = delay_ms;
  }
  if (!bad && dedupe && key) {
    if (json_object_set_new(S.held, key, json_true()) != 0)
      bad = 1;
    else
      qr->held = 1;
  }
  if (!bad && pthread_attr_init(&at) == 0) {
    pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
    started = pthread_create(&th, &at, apply_queued, qr) == 0;
    pthread_attr_destroy(&at);
  }
  if (started) {
    S.queued++; /* qr is the thread's now */
  } else if (qr) {
    if (qr->held) json_object_del(S.held, key);
    queued_free(qr);
  }
  pthread_mutex_unlock(&S.mu);
  if (!started) {
    say("POST /v1/refunds key=%s -> 500 not applied: cannot queue it", kbuf);
    return send_error(c, 500, "api_error", "The refund could not be queued.");
  }
  say("POST /v1/refunds key=%s -> 504, queued: applying in %lld ms (mode "
      "queued)",
      kbuf, delay_ms);
  return send_error(c, 504, "gateway_timeout",
                    "The upstream server did not answer in time.");
}

static enum MHD_Result post_refund(struct MHD_Connection *c, request *q) {
  const char *key =
      MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Idempotency-Key");
  char kbuf[80], id[32], msg[300], err[300];
  const char *bad;
  json_error_t je;
  json_t *root, *body;
  refund_args a;
  long i;
  mode m;
  long long stall_ms;
  int dedupe, held, dropped;
  enum MHD_Result ok = MHD_NO;

  shown(key, kbuf, sizeof kbuf);
  if (key) {
    json_t *k = json_string(key); /* NULL unless valid UTF-8 */
    size_t n = strlen(key);
    json_decref(k);
    if (!k || n == 0 || n > PAYSIM_MAX_KEY) {
      say("POST /v1/refunds key=%s -> 400 bad key", kbuf);
      return send_error(c, 400, "invalid_request",
                        "Idempotency-Key: must be 1 to 255 bytes of UTF-8");
    }
  }
  root =
      json_loadb(q->body ? q->body : "", q->len, JSON_REJECT_DUPLICATES, &je);
  if (!root) {
    snprintf(msg, sizeof msg, "the body is not JSON: %s (at byte %d)", je.text,
             je.position);
    bad = msg;
  } else {
    bad = parse_refund(root, &a);
  }
  if (bad) {
    json_decref(root);
    say("POST /v1/refunds key=%s -> 400 invalid_request", kbuf);
    return send_error(c, 400, "invalid_request", bad);
  }
  if (a.amount_cents <= 0 || a.amount_cents > PAYSIM_MAX_AMOUNT) {
    json_decref(root);
    say("POST /v1/refunds key=%s -> 422 invalid_amount", kbuf);
    return send_error(c, 422, "invalid_amount",
                      "amount_cents must be between 1 and 10000000");
  }

  pthread_mutex_lock(&S.mu);
  /* Without dedupe the key is only recorded: no 409, replay or 422. */
  dedupe = S.dedupe;
  if (dedupe && key && json_object_get(S.held, key)) {
    pthread_mutex_unlock(&S.mu);
    json_decref(root);
    say("POST /v1/refunds key=%s -> 409 in progress (held, not applied yet)",
        kbuf);
    return send_error(c, 409, "idempotency_conflict",
                      "A request with this Idempotency-Key is still being "
                      "processed; retry later.");
  }
  i = dedupe ? paysim_ledger_find_key(&S.ledger, key) : -1;
  if (i >= 0) {
    paysim_refund *r = &S.ledger.v[i];
    int pending = r->pending, same = same_args(r, &a);
    body = !pending && same ? paysim_refund_json(r) : NULL;
    paysim_refund_id(r, id, sizeof id);
    pthread_mutex_unlock(&S.mu);
    json_decref(root);
    if (pending) {
      say("POST /v1/refunds key=%s -> 409 in progress (%s)", kbuf, id);
      return send_error(c, 409, "idempotency_conflict",
                        "A request with this Idempotency-Key is still being "
                        "processed; retry later.");
    }
    if (!same) {
      say("POST /v1/refunds key=%s -> 422 other parameters than %s", kbuf, id);
      return send_error(c, 422, "idempotency_error",
                        "Keys for idempotent requests can only be used with "
                        "the same parameters they were first used with.");
    }
    say("POST /v1/refunds key=%s -> 200 replayed %s", kbuf, id);
    return send_json(c, 200, body, "Idempotent-Replayed", "true");
  }
  if (strncmp(a.order_id, "closed_", 7) == 0) {
    pthread_mutex_unlock(&S.mu);
    json_decref(root);
    say("POST /v1/refunds key=%s -> 422 order_closed", kbuf);
    return send_error(c, 422, "order_closed",
                      "The order is closed and cannot be refunded.");
  }
  m = take_mode(0);
  stall_ms = S.stall_ms;
  if (m == MODE_FAIL || m == MODE_REJECT429) {
    pthread_mutex_unlock(&S.mu);
    json_decref(root);
    say("POST /v1/refunds key=%s -> %s, not applied", kbuf,
        m == MODE_FAIL ? "503 (mode fail)" : "429 (mode reject429)");
    if (m == MODE_FAIL)
      return send_error(c, 503, "api_error",
                        "The provider failed before applying the refund.");
    return send_json(
        c, 429, error_body("rate_limit", "Too many requests; retry later."),
        "Retry-After", "1");
  }
  if (m == MODE_QUEUED) {
    ok = queue_refund(c, key, &a, stall_ms, dedupe, kbuf);
    json_decref(root);
    return ok;
  }
  if (m == MODE_LATE) {
    /* Hold first, apply after: meanwhile the key answers 409 (dedupe) and
    ** status reads do not show the refund, which is not applied yet. */
    held = dedupe && key;
    if (held && json_object_set_new(S.held, key, json_true()) != 0) {
      pthread_mutex_unlock(&S.mu);
      json_decref(root);
      say("POST /v1/refunds key=%s -> 500 not applied: out of memory", kbuf);
      return send_error(c, 500, "api_error", "Out of memory.");
    }
    pthread_mutex_unlock(&S.mu);
    say("POST /v1/refunds key=%s -> holding %lld ms, then applying (mode "
        "late)",
        kbuf, stall_ms);
    dropped = stall(stall_ms) != 0; /* the server stops: not applied */
    pthread_mutex_lock(&S.mu);
    if (held) json_object_del(S.held, key);
    if (dropped) {
      pthread_mutex_unlock(&S.mu);
      json_decref(root);
      say("POST /v1/refunds key=%s -> dropped while held, not applied", kbuf);
      return MHD_NO;
    }
  }
  i = paysim_ledger_append(&S.ledger, key, a.order_id, a.amount_cents, a.reason,
                           err, sizeof err);
  json_decref(root);
  if (i < 0) {
    pthread_mutex_unlock(&S.mu);
    say("POST /v1/refunds key=%s -> 500 not applied: %s", kbuf, err);
    return send_error(c, 500, "api_error", "The ledger could not be written.");
  }
  S.ledger.v[i].pending = 1;
  body = paysim_refund_json(&S.ledger.v[i]);
  paysim_refund_id(&S.ledger.v[i], id, sizeof id);
  pthread_mutex_unlock(&S.mu);

  switch (m) {
  case MODE_CRASH:
    say("POST /v1/refunds key=%s -> applied %s, then SIGKILL (mode crash)",
        kbuf, id);
    kill(getpid(), SIGKILL);
    break;
  case MODE_RESET:
    say("POST /v1/refunds key=%s -> applied %s, then reset (mode reset)", kbuf,
        id);
    ok = reset_connection(c);
    json_decref(body);
    body = NULL;
    break;
  case MODE_STALL:
    say("POST /v1/refunds key=%s -> applied %s, stalling %lld ms", kbuf, id,
        stall_ms);
    if (stall(stall_ms) != 0) {
      json_decref(body);
      body = NULL;
      ok = MHD_NO;
    }
    break;
  default: break;
  }
  pthread_mutex_lock(&S.mu);
  S.ledger.v[i].pending = 0;
  pthread_mutex_unlock(&S.mu);
  if (!body) return ok;
  say("POST /v1/refunds key=%s -> 200 applied %s", kbuf, id);
  return send_json(c, 200, body, NULL, NULL);
}

static enum MHD_Result get_refunds(struct MHD_Connection *c, const char *id) {
  const char *order =
      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "order_id");
  const char *key =
      MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "idempotency_key");
  char buf[80], rid[80];
  json_t *list = json_array(), *one = NULL;
  size_t i;
  pthread_mutex_lock(&S.mu);
  if (take_mode(1) == MODE_STATUS_DOWN) {
    pthread_mutex_unlock(&S.mu);
    json_decref(list);
    say("GET /v1/refunds%s%s -> 503 (mode status_down)", id ? "/" : "",
        id ? shown(id, buf, sizeof buf) : "");
    return send_error(c, 503, "api_error", "Status reads are down.");
  }
  for (i = 0; list && i < S.ledger.n; i++) {
    const paysim_refund *r = &S.ledger.v[i];
    if (id) {
      paysim_refund_id(r, rid, sizeof rid);
      if (strcmp(rid, id) == 0) one = paysim_refund_json(r);
      if (one) break;
      continue;
    }
    if (order && strcmp(r->order_id, order) != 0) continue;
    if (key && (!r->key || strcmp(r->key, key) != 0)) continue;
    if (json_array_append_new(list, paysim_refund_json(r)) != 0) {
      json_decref(list);
      list = NULL;
    }
  }
  pthread_mutex_unlock(&S.mu);
  if (id) {
    json_decref(list);
    say("GET /v1/refunds/%s -> %d", shown(id, buf, sizeof buf),
        one ? 200 : 404);
    if (one) return send_json(c, 200, one, NULL, NULL);
    return send_error(c, 404, "not_found", "No such refund.");
  }
  say("GET /v1/refunds%s%s%s%s%s -> 200 (%zu refunds)", order || key ? "?" : "",
      order ? "order_id=" : "", order ? shown(order, buf, sizeof buf) : "",
      order && key ? "&idempotency_key="
      : key        ? "idempotency_key="
                   : "",
      key ? shown(key, rid, sizeof rid) : "", json_array_size(list));
  return send_json(c, 200,
                   json_pack("{s:s, s:o}", "object", "list", "data", list),
                   NULL, NULL);
}

static enum MHD_Result get_ledger(struct MHD_Connection *c) {
  json_t *all = json_array();
  size_t i;
  pthread_mutex_lock(&S.mu);
  for (i = 0; all && i < S.ledger.n; i++)
    if (json_array_append_new(all, paysim_refund_json(&S.ledger.v[i])) != 0) {
      json_decref(all);
      all = NULL;
    }
  pthread_mutex_unlock(&S.mu);
  say("GET /_ledger -> 200 (%zu refunds)", json_array_size(all));
  return send_json(c, 200, json_pack("{s:o}", "refunds", all), NULL, NULL);
}

/* Under S.mu. */
static json_t *mode_json(void) {
  return json_pack("{s:s, s:o, s:I, s:b}", "mode", mode_names[S.mode], "count",
                   S.count < 0 ? json_null() : json_integer(S.count),
                   "stall_ms", (json_int_t)S.stall_ms, "dedupe", S.dedupe);
}

static enum MHD_Result set_mode(struct MHD_Connection *c, request *q) {
  json_error_t je;
  json_t *root =
      json_loadb(q->body ? q->body : "", q->len, JSON_REJECT_DUPLICATES, &je);
  json_t *name = json_object_get(root, "mode");
  json_t *count = json_object_get(root, "count");
  json_t *stall_ms = json_object_get(root, "stall_ms");
  json_t *dedupe = json_object_get(root, "dedupe");
  const char *bad = NULL;
  int m = json_is_string(name) ? mode_parse(json_string_value(name)) : -1;
  json_t *now;
  if (!json_is_object(root))
    bad = "the body must be a JSON object";
  else if (m < 0)
    bad = "mode: one of normal, stall, late, queued, fail, reset, crash, "
          "status_down, reject429";
  else if (count && !json_is_null(count) &&
           (!json_is_integer(count) || json_integer_value(count) < 1))
    bad = "count: an integer >= 1, or null for until changed";
  else if (stall_ms &&
           (!json_is_integer(stall_ms) || json_integer_value(stall_ms) < 0 ||
            json_integer_value(stall_ms) > 3600000))
    bad = "stall_ms: an integer from 0 to 3600000";
  else if (dedupe && !json_is_boolean(dedupe))
    bad = "dedupe: true or false";
  if (bad) {
    json_decref(root);
    say("POST /_mode -> 400");
    return send_error(c, 400, "invalid_request", bad);
  }
  pthread_mutex_lock(&S.mu);
  S.mode = (mode)m;
  S.count = json_is_integer(count) ? (long long)json_integer_value(count) : -1;
  if (stall_ms) S.stall_ms = (long long)json_integer_value(stall_ms);
  if (dedupe) S.dedupe = json_is_true(dedupe);
  now = mode_json();
  pthread_mutex_unlock(&S.mu);
  json_decref(root);
  say("POST /_mode -> 200 mode=%s", mode_names[m]);
  return send_json(c, 200, now, NULL, NULL);
}

static enum MHD_Result get_mode(struct MHD_Connection *c) {
  json_t *now;
  pthread_mutex_lock(&S.mu);
  now = mode_json();
  pthread_mutex_unlock(&S.mu);
  say("GET /_mode -> 200 mode=%s",
      json_string_value(json_object_get(now, "mode")));
  return send_json(c, 200, now, NULL, NULL);
}

static enum MHD_Result not_allowed(struct MHD_Connection *c, const char *method,
                                   const char *url, const char *allow) {
  char m[40], u[80];
  say("%s %s -> 405", shown(method, m, sizeof m), shown(url, u, sizeof u));
  return send_json(c, 405,
                   error_body("method_not_allowed",
                              "This method is not allowed on this path."),
                   "Allow", allow);
}

static enum MHD_Result route(struct MHD_Connection *c, const char *url,
                             const char *method, request *q) {
  int get = strcmp(method, "GET") == 0, post = strcmp(method, "POST") == 0;
  char m[40], u[80];
  if (q->too_big) {
    say("%s %s -> 413", shown(method, m, sizeof m), shown(url, u, sizeof u));
    return send_error(c, 413, "invalid_request",
                      "The request body is over 1 MiB.");
  }
  if (strcmp(url, "/v1/refunds") == 0) {
    if (post) return post_refund(c, q);
    if (get) return get_refunds(c, NULL);
    return not_allowed(c, method, url, "GET, POST");
  }
  if (strncmp(url, "/v1/refunds/", 12) == 0 && url[12] &&
      !strchr(url + 12, '/')) {
    if (get) return get_refunds(c, url + 12);
    return not_allowed(c, method, url, "GET");
  }
  if (strcmp(url, "/_ledger") == 0) {
    if (get) return get_ledger(c);
    return not_allowed(c, method, url, "GET");
  }
  if (strcmp(url, "/_mode") == 0) {
    if (post) return set_mode(c, q);
    if (get) return get_mode(c);
    return not_allowed(c, method, url, "GET, POST");
  }
  say("%s %s -> 404", shown(method, m, sizeof m), shown(url, u, sizeof u));
  return send_error(c, 404, "not_found", "No such path.");
}

/* libmicrohttpd calls this once when the headers are in, once per piece of
** body, and once more at the end; the answer is given at the end. */
static enum MHD_Result on_request(void *cls, struct MHD_Connection *c,
                                  const char *url, const char *method,
                                  const char *version, const char *data,
                                  size_t *size, void **state) {
  request *q = *state;
  (void)cls;
  (void)version;
  if (!q) {
    const char *len = MHD_lookup_connection_value(
        c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (!(q = calloc(1, sizeof *q))) return MHD_NO;
    *state = q;
    /* A body over the limit is read and dropped, then refused, so a client
    ** that writes its whole body before reading sees the 413.  One declared
    ** far over it is refused at once, and the connection closed. */
    if (len && strtoull(len, NULL, 10) > (unsigned long long)MAX_DRAIN) {
      q->answered = q->too_big = 1;
      return route(c, url, method, q);
    }
    return MHD_YES;
  }
  if (*size) {
    take_body(q, data, *size);
    *size = 0;
    return MHD_YES;
  }
  if (q->answered) return MHD_YES;
  q->answered = 1;
  return route(c, url, method, q);
}

static void on_done(void *cls, struct MHD_Connection *c, void **state,
                    enum MHD_RequestTerminationCode why) {
  request *q = *state;
  (void)cls;
  (void)c;
  (void)why;
  if (q) free(q->body);
  free(q);
  *state = NULL;
}

/* ---- the command line ---------------------------------------------------- */

static const char usage[] =
    "usage: idem-paysim --ledger FILE [--port N] [--port-file FILE]\n"
    "                   [--mode MODE] [--stall-ms N] [--no-dedupe] [--quiet]\n"
    "MODE: normal stall late queued fail reset crash status_down reject429\n";

static int bad_usage(const char *what, const char *value) {
  fprintf(stderr, "paysim: %s%s%s%s\n%s", what, value ? ": \"" : "",
          value ? value : "", value ? "\"" : "", usage);
  return 2;
}

static int parse_num(const char *s, long long lo, long long hi,
                     long long *out) {
  char *end;
  errno = 0;
  *out = strtoll(s, &end, 10);
  return !errno && end != s && !*end && *out >= lo && *out <= hi ? 0 : -1;
}

/* PORT into FILE whole or not at all: a reader never sees half a number. */
static int write_port_file(const char *path, unsigned port) {
  char tmp[4096], text[16];
  int fd, n = snprintf(text, sizeof text, "%u\n", port), ok;
  if (snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid()) >=
      (int)sizeof tmp)
    return -1;
  fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return -1;
  ok = write(fd, text, (size_t)n) == n;
  ok = close(fd) == 0 && ok;
  if (!ok || rename(tmp, path) != 0) {
    unlink(tmp);
    return -1;
  }
  return 0;
}

int main(int argc, char **argv) {
  const char *ledger = NULL, *port_file = NULL;
  long long port = 0, stall_ms = DEFAULT_STALL_MS;
  int i, m = MODE_NORMAL, sig, dedupe = 1;
  char err[512];
  struct sockaddr_in addr;
  struct MHD_Daemon *d;
  const union MHD_DaemonInfo *info;
  sigset_t stop;

  for (i = 1; i < argc; i++) {
    const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
    static const char *const valued[] = {
        "--ledger", "--port", "--port-file", "--mode", "--stall-ms", NULL};
    int k, flag = 1;
    for (k = 0; valued[k]; k++)
      if (strcmp(a, valued[k]) == 0) flag = 0;
    if (strcmp(a, "--help") == 0) {
      fputs(usage, stdout);
      return 0;
    }
    if (!flag && !v) return bad_usage("missing value for", a);
    if (strcmp(a, "--quiet") == 0)
      S.quiet = 1;
    else if (strcmp(a, "--no-dedupe") == 0)
      dedupe = 0;
    else if (strcmp(a, "--ledger") == 0)
      ledger = v;
    else if (strcmp(a, "--port-file") == 0)
      port_file = v;
    else if (strcmp(a, "--port") == 0) {
      if (parse_num(v, 0, 65535, &port) != 0)
        return bad_usage("--port: not a port number", v);
    } else if (strcmp(a, "--stall-ms") == 0) {
      if (parse_num(v, 0, 3600000, &stall_ms) != 0)
        return bad_usage("--stall-ms: not a number of ms (0 to 3600000)", v);
    } else if (strcmp(a, "--mode") == 0) {
      if ((m = mode_parse(v)) < 0) return bad_usage("--mode: unknown mode", v);
    } else
      return bad_usage("unknown option", a);
    if (!flag) i++;
  }
  if (!ledger) return bad_usage("--ledger FILE is required", NULL);

  if (paysim_ledger_open(&S.ledger, ledger, !dedupe, err, sizeof err) != 0) {
    fprintf(stderr, "paysim: %s\n", err);
    paysim_ledger_close(&S.ledger);
    return 1;
  }
  S.mode = (mode)m;
  S.count = -1;
  S.stall_ms = stall_ms;
  S.dedupe = dedupe;
  if (!(S.held = json_object())) {
    fprintf(stderr, "paysim: out of memory\n");
    paysim_ledger_close(&S.ledger);
    return 1;
  }
  {
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&S.wake, &ca);
    pthread_condattr_destroy(&ca);
  }

  /* Every thread inherits the blocked stop signals; main takes them. */
  signal(SIGPIPE, SIG_IGN);
  sigemptyset(&stop);
  sigaddset(&stop, SIGTERM);
  sigaddset(&stop, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop, NULL);

  memset(&addr, 0, sizeof addr);
  addr.sin_family = AF_INET;
  addr.sin_port = htons((uint16_t)port);
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  d = MHD_start_daemon(
      MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
          MHD_USE_POLL | MHD_USE_ERROR_LOG,
      (uint16_t)port, NULL, NULL, on_request, NULL, MHD_OPTION_EXTERNAL_LOGGER,
      on_mhd_log, NULL, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&addr,
      MHD_OPTION_NOTIFY_COMPLETED, on_done, NULL, MHD_OPTION_CONNECTION_TIMEOUT,
      (unsigned)60, MHD_OPTION_END);
  info = d ? MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT) : NULL;
  if (!d || !info) {
    fprintf(stderr, "paysim: cannot listen on 127.0.0.1:%lld\n", port);
    if (d) MHD_stop_daemon(d);
    json_decref(S.held);
    paysim_ledger_close(&S.ledger);
    return 1;
  }
  if (port_file && write_port_file(port_file, info->port) != 0) {
    fprintf(stderr, "paysim: --port-file %s: %s\n", port_file, strerror(errno));
    MHD_stop_daemon(d);
    json_decref(S.held);
    paysim_ledger_close(&S.ledger);
    return 1;
  }
  fprintf(stderr, "paysim: listening on 127.0.0.1:%u\n", (unsigned)info->port);
  pthread_mutex_lock(&S.mu); /* the daemon's threads already serve */
  if (S.ledger.n)
    fprintf(stderr, "paysim: ledger %s: %zu refunds\n", ledger, S.ledger.n);
  pthread_mutex_unlock(&S.mu);

  while (sigwait(&stop, &sig) != 0) {
  }
  pthread_mutex_lock(&S.mu);
  S.stopping = 1;
  pthread_cond_broadcast(&S.wake);
  pthread_mutex_unlock(&S.mu);
  MHD_stop_daemon(d);
  /* the queued refunds' threads saw S.stopping: each drops its refund */
  pthread_mutex_lock(&S.mu);
  while (S.queued > 0) pthread_cond_wait(&S.idle, &S.mu);
  pthread_mutex_unlock(&S.mu);
  json_decref(S.held);
  paysim_ledger_close(&S.ledger);
  fprintf(stderr, "paysim: stopped (%s)\n",
          sig == SIGINT ? "SIGINT" : "SIGTERM");
  return 0;
}

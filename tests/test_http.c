/*
** test_http.c - a policy's HTTP tools run by the library, through the
** public API alone (idem.h: this file includes nothing of src/, and links
** the shared library, whose only symbols are the API's).
**
**   test_http PAYSIM DIR       the payment-provider simulator (idem-paysim)
**                              over real HTTP on loopback, logs in DIR
**   test_http --no-http DIR    linked with a libidem built without HTTP
**
** Against idem-paysim, counting refunds in its own ledger: a call applies
** once and its repeat replays; a refund applied then stalled past the
** deadline is outcome unknown at the attempt, and the status check (an
** HTTP tool too) settles it as applied; without a status check the answer
** is outcome_unknown; a 503 ENDS its attempt but is no verdict (SPEC §6a):
** by default the action stays in doubt whatever the status check says,
** and nothing is sent again (one refund at most); under on_5xx
** "not_applied" (a provider that documents a 5xx as never applied) it is
** retried with the same key, and so it is under provider_dedupes; issue
** 26: a proxy answers 504 at once while the provider applies the refund
** a second later - the call, the model's re-issue at once and another
** 1.6 s later make one refund (outcome_unknown, never failed; fenced;
** already_applied), and with settle_ms a re-issue after it runs once when
** the provider never applied; eight threads on one guard, and four racing
** copies of one call; the caller's check hook for a status command; hooks
** of an older, smaller layout read only within their size;
** idem_step_check_http's refusals.
** Against a small server of this file, which keeps the head of every
** request: a URL and a header filled with numbers carry their canonical
** RFC 8785 text (0.1, 1e+21, the shortest digits of a long mantissa), not
** a printf rendering; a 408 is unknown (an end without a verdict), not
** rejected, and not sent again; an argument "." or ".." never leaves its
** path segment (refused, nothing sent: at the provider it was a refund
** through POST /v1/refunds), and a header value with a control character
** is refused.  Without HTTP support: the call fails with a message
** naming the tool and saying so, and nothing is recorded or sent.
*/
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check.h"
#include "idem.h"

extern char **environ;

#define CHECK_HAS(hay, needle)                                                 \
  do {                                                                         \
    const char *h_ = (hay), *n_ = (needle);                                    \
    if (h_ && strstr(h_, n_))                                                  \
      check_passed++;                                                          \
    else {                                                                     \
      check_failed++;                                                          \
      fprintf(stderr, "%s:%d: %s has no \"%s\":\n  %s\n", __FILE__, __LINE__,  \
              #hay, n_, h_ ? h_ : "(null)");                                   \
    }                                                                          \
  } while (0)

static void sleep_ms(int ms) {
  struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
  nanosleep(&ts, NULL);
}

/* ---- a server that keeps what it is sent ---------------------------------------- */

/* Answers every request 200 {} (a request for /s408: 408 Request Timeout)
** and keeps its head (request line and headers) in heads, one after the
** other. */
static struct {
  int fd, port, stop, n;
  pthread_t th;
  pthread_mutex_t mu;
  char heads[16384];
} srv = {-1, 0, 0, 0, 0, PTHREAD_MUTEX_INITIALIZER, ""};

static void *srv_main(void *arg) {
  static const char ok[] = "HTTP/1.1 200 OK\r\nContent-Type: application/json"
                           "\r\nContent-Length: 2\r\nConnection: close\r\n"
                           "\r\n{}";
  static const char t408[] = "HTTP/1.1 408 Request Timeout\r\nContent-Length:"
                             " 0\r\nConnection: close\r\n\r\n";
  (void)arg;
  while (!srv.stop) {
    char buf[4096];
    size_t have = 0;
    ssize_t r;
    int c = accept(srv.fd, NULL, NULL);
    if (c < 0) continue;
    while (have < sizeof buf - 1 &&
           (r = read(c, buf + have, sizeof buf - 1 - have)) > 0) {
      have += (size_t)r;
      buf[have] = '\0';
      if (strstr(buf, "\r\n\r\n")) break;
    }
    buf[have] = '\0';
    pthread_mutex_lock(&srv.mu);
    {
      size_t at = strlen(srv.heads);
      if (at + have + 1 < sizeof srv.heads) memcpy(srv.heads + at, buf, have + 1);
    }
    srv.n++;
    pthread_mutex_unlock(&srv.mu);
    if (strstr(buf, " /s408 ")) {
      if (write(c, t408, sizeof t408 - 1) < 0) { /* no matter */
      }
    } else if (write(c, ok, sizeof ok - 1) < 0) { /* the client went */
    }
    close(c);
  }
  return NULL;
}

static int srv_start(void) {
  struct sockaddr_in a;
  socklen_t alen = sizeof a;
  memset(&a, 0, sizeof a);
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if ((srv.fd = socket(AF_INET, SOCK_STREAM, 0)) < 0 ||
      bind(srv.fd, (struct sockaddr *)&a, sizeof a) != 0 ||
      listen(srv.fd, 16) != 0 ||
      getsockname(srv.fd, (struct sockaddr *)&a, &alen) != 0)
    return -1;
  srv.port = ntohs(a.sin_port);
  return pthread_create(&srv.th, NULL, srv_main, NULL) == 0 ? 0 : -1;
}

static void srv_stop(void) {
  srv.stop = 1;
  shutdown(srv.fd, SHUT_RDWR); /* wakes accept() */
  pthread_join(srv.th, NULL);
  close(srv.fd);
}

/* The heads received since the last call, into out; how many requests. */
static int srv_take(char *out, size_t n) {
  int k;
  pthread_mutex_lock(&srv.mu);
  snprintf(out, n, "%s", srv.heads);
  srv.heads[0] = '\0';
  k = srv.n;
  srv.n = 0;
  pthread_mutex_unlock(&srv.mu);
  return k;
}

/* ---- the payment provider: idem-paysim ---------------------------------------- */

static char ledger[4096], portfile[4096];
static pid_t sim;

static int sim_start(const char *paysim, const char *dir) {
  char *argv[] = {(char *)paysim, "--ledger",    ledger,   "--port",
                  "0",            "--port-file", portfile, "--stall-ms",
                  "3000",         "--quiet",     NULL};
  FILE *f;
  int i, port = 0;
  snprintf(ledger, sizeof ledger, "%s/ledger.jsonl", dir);
  snprintf(portfile, sizeof portfile, "%s/paysim.port", dir);
  if (posix_spawn(&sim, paysim, NULL, NULL, argv, environ) != 0) return 0;
  for (i = 0; i < 400 && !port; i++) {
    if ((f = fopen(portfile, "r"))) {
      if (fscanf(f, "%d", &port) != 1) port = 0;
      fclose(f);
    }
    if (!port) sleep_ms(25);
  }
  return port;
}

static void sim_stop(void) {
  int st;
  if (sim <= 0) return;
  kill(sim, SIGTERM);
  waitpid(sim, &st, 0);
}

/* Refunds of order in the provider's ledger. */
static int refunds(const char *order) {
  char line[4096], want[300];
  FILE *f = fopen(ledger, "r");
  int n = 0;
  if (!f) return 0;
  snprintf(want, sizeof want, "\"order_id\":\"%s\"", order);
  while (fgets(line, sizeof line, f))
    if (strstr(line, want)) n++;
  fclose(f);
  return n;
}

/* ---- the calls ----------------------------------------------------------------- */

/* What the hooks saw of one run. */
typedef struct seen {
  int attempts, checks;
  int attempt_outcome[8], check_outcome[8];
  long attempt_status[8];
  char check_tool[64];
} seen;

static void on_attempt(void *ctx, const idem_run_event *ev) {
  seen *w = ctx;
  if (w->attempts < 8) {
    w->attempt_outcome[w->attempts] = ev->outcome;
    w->attempt_status[w->attempts] = ev->http_status;
  }
  w->attempts++;
}

static void on_check(void *ctx, const idem_run_event *ev) {
  seen *w = ctx;
  if (w->checks < 8) w->check_outcome[w->checks] = ev->outcome;
  snprintf(w->check_tool, sizeof w->check_tool, "%s", ev->tool);
  w->checks++;
}

/* Run tool with args as (session "s", call_id) on g: the return code, the
** envelope in env (free with idem_free) and what the hooks saw in w. */
static int run(idem_guard *g, const char *call_id, const char *tool,
               const char *args, char **env, seen *w) {
  idem_call call;
  idem_run_hooks hooks;
  size_t len = 0;
  memset(&call, 0, sizeof call);
  call.size = sizeof call;
  call.session = "s";
  call.call_id = call_id;
  call.tool = tool;
  call.args = args;
  call.args_len = strlen(args);
  memset(w, 0, sizeof *w);
  memset(&hooks, 0, sizeof hooks);
  hooks.size = sizeof hooks;
  hooks.ctx = w;
  hooks.on_attempt = on_attempt;
  hooks.on_check = on_check;
  return idem_guard_run(g, &call, &hooks, env, &len);
}

/* The simulator's failure mode for the next refund, through its control
** endpoint - a read_only HTTP tool of the policy like any other. */
static void mode(idem_guard *g, const char *m) {
  char args[128], *env = NULL;
  static int n;
  char id[32];
  seen w;
  snprintf(args, sizeof args, "{\"mode\":\"%s\",\"count\":1}", m);
  snprintf(id, sizeof id, "mode%d", ++n);
  CHECK_INT(run(g, id, "paysim_mode", args, &env, &w), IDEM_OK);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  idem_free(env);
}

/* The same with the delay (stall_ms) and the dedupe it keeps after. */
static void mode_with(idem_guard *g, const char *m, int stall_ms, int dedupe) {
  char args[160], *env = NULL;
  static int n;
  char id[32];
  seen w;
  snprintf(args, sizeof args,
           "{\"mode\":\"%s\",\"count\":1,\"stall_ms\":%d,\"dedupe\":%s}", m,
           stall_ms, dedupe ? "true" : "false");
  snprintf(id, sizeof id, "modew%d", ++n);
  CHECK_INT(run(g, id, "paysim_mode", args, &env, &w), IDEM_OK);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  idem_free(env);
}

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The record of (session "s", call_id) is in state st after attempts. */
static void record_is(idem_guard *g, const char *call_id, int st,
                      int attempts) {
  idem_record *r = NULL;
  CHECK_INT(idem_guard_record(g, "s", call_id, &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, st);
    CHECK_INT(r->attempts, attempts);
  }
  idem_record_free(r);
}

/* An answer that ran nothing new and says so honestly: outcome_unknown,
** never failed, never "safe to call again" (SPEC §6a). */
#define CHECK_IN_DOUBT(env)                                                    \
  do {                                                                         \
    CHECK_HAS(env, "\"status\":\"outcome_unknown\"");                          \
    CHECK(!strstr(env ? env : "", "\"status\":\"failed\""));                   \
    CHECK(!strstr(env ? env : "", "safe to call"));                            \
  } while (0)

static const char POLICY[] =
    "{\"tools\": {\n"
    /* the provider dedupes; a status check by order */
    " \"refund\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50, \"provider_dedupes\": true,\n"
    "  \"fence\": [\"order_id\"],\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
    "  \"status\": {\"tool\": \"list\", \"arguments\": {\"order_id\": "
    "\"{order_id}\"}}},\n"
    /* no dedupe (by the policy's word): a retry only when nothing can land */
    " \"refund_nd\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50, \"fence\": [\"order_id\"],\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
    "  \"status\": {\"tool\": \"list\", \"arguments\": {\"order_id\": "
    "\"{order_id}\"}}},\n"
    /* the same, under a provider that documents a 5xx as never applied */
    " \"refund_5na\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50, \"fence\": [\"order_id\"],\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\",\n"
    "   \"on_5xx\": \"not_applied\"},\n"
    "  \"status\": {\"tool\": \"list\", \"arguments\": {\"order_id\": "
    "\"{order_id}\"}}},\n"
    /* issue 26: no dedupe, a status check by key over HTTP; without and
    ** with settle_ms */
    " \"refund_q\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50, \"fence\": [\"order_id\"],\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
    "  \"status\": {\"tool\": \"by_key\", \"applied_when\":\n"
    "   {\"pointer\": \"/data\", \"key_present\": true}}},\n"
    " \"refund_qs\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50, \"fence\": [\"order_id\"],\n"
    "  \"settle_ms\": 500,\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
    "  \"status\": {\"tool\": \"by_key\", \"applied_when\":\n"
    "   {\"pointer\": \"/data\", \"key_present\": true}}},\n"
    " \"by_key\": {\"class\": \"read_only\", \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/v1/refunds?idempotency_key={$key}\"}},\n"
    /* a status check the library does not make: a command */
    " \"refund_cmd\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 2, \"backoff_ms\": 50,\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
    "  \"status\": {\"command\": \"exit 100\"}},\n"
    /* no status check */
    " \"refund_blind\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 0, \"http\": {\"url\": \"http://127.0.0.1:%d/v1/refunds\"}},\n"
    " \"list\": {\"class\": \"read_only\", \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/v1/refunds?order_id={order_id}\"}},\n"
    " \"paysim_mode\": {\"class\": \"read_only\", \"http\": {\"method\": "
    "\"POST\",\n"
    "  \"url\": \"http://127.0.0.1:%d/_mode\"}},\n"
    /* the server of this file: numbers in a URL and a header */
    " \"amount\": {\"class\": \"read_only\", \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/n?amount={amount}&s={s}\",\n"
    "  \"headers\": {\"X-Amount\": \"{amount}\"}}},\n"
    /* the server of this file, as a guarded tool */
    " \"note\": {\"class\": \"guarded\", \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/note\"}},\n"
    /* the server of this file answering 408 */
    " \"note408\": {\"class\": \"guarded\", \"retries\": 2, \"backoff_ms\": 1,\n"
    "  \"http\": {\"url\": \"http://127.0.0.1:%d/s408\"}},\n"
    /* issue 27: an argument in a path segment of its own (the provider;
    ** the server of this file, twice) */
    " \"refund_cust\": {\"class\": \"guarded\", \"timeout_ms\": 1000,\n"
    "  \"retries\": 0, \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/v1/customers/{customer_id}/refunds\"}},\n"
    " \"end_sessions\": {\"class\": \"guarded\", \"retries\": 0,\n"
    "  \"http\": {\"method\": \"DELETE\", \"url\":\n"
    "  \"http://127.0.0.1:%d/v1/accounts/{account_id}/sessions?q={q}\"}},\n"
    " \"hdr\": {\"class\": \"read_only\", \"http\": {\"url\":\n"
    "  \"http://127.0.0.1:%d/h\", \"headers\": {\"X-Note\": \"{n}\"}}},\n"
    /* a tool without an http rule */
    " \"plain\": {\"class\": \"guarded\"}\n"
    "}}";

static idem_policy *policy_for(int paysim, int mine) {
  char text[sizeof POLICY + 64];
  idem_policy *p = NULL;
  snprintf(text, sizeof text, POLICY, paysim, paysim, paysim, paysim,
           paysim, paysim, paysim, paysim, paysim, paysim, mine, mine, mine,
           paysim, mine, mine);
  if (idem_policy_parse(text, strlen(text), "test policy", &p) != IDEM_OK) {
    fprintf(stderr, "policy: %s\n", p ? idem_policy_errmsg(p) : "no memory");
    exit(1);
  }
  return p;
}

/* ---- the cases ------------------------------------------------------------------ */

static void applies_once(idem_guard *g) {
  char *env = NULL;
  seen w;
  CHECK_INT(run(g, "c1", "refund", "{\"order_id\":\"o1\",\"amount_cents\":500}",
                &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  CHECK_HAS(env, "\"replayed\":false");
  CHECK_HAS(env, "\"object\":\"refund\"");
  CHECK_INT(w.attempts, 1);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_APPLIED);
  CHECK_INT(w.attempt_status[0], 200);
  CHECK_INT(refunds("o1"), 1);
  idem_free(env);

  /* the repeat - same call id, the arguments reformatted - replays */
  CHECK_INT(run(g, "c1", "refund",
                "{ \"amount_cents\": 500.0, \"order_id\": \"o1\" }", &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  CHECK_HAS(env, "\"replayed\":true");
  CHECK_INT(w.attempts, 0);
  CHECK_INT(refunds("o1"), 1);
  idem_free(env);
}

static void stall_reconciled(idem_guard *g) {
  char *env = NULL;
  idem_record *r = NULL;
  seen w;
  /* applied, then no answer before the deadline: unknown; the status check
  ** (GET /v1/refunds?order_id=o2, an HTTP tool) finds it */
  mode(g, "stall");
  CHECK_INT(run(g, "c2", "refund", "{\"order_id\":\"o2\",\"amount_cents\":700}",
                &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 1);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(w.attempt_status[0], 0);
  CHECK_INT(w.checks, 1);
  CHECK_INT(w.check_outcome[0], IDEM_OUTCOME_APPLIED);
  CHECK_STR(w.check_tool, "list");
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  CHECK_INT(refunds("o2"), 1);
  idem_free(env);
  CHECK_INT(idem_guard_record(g, "s", "c2", &r), IDEM_OK);
  if (r) {
    CHECK_INT(r->state, IDEM_STATE_SUCCEEDED);
    CHECK_INT(r->resolution, IDEM_RESOLVED_RECONCILED);
    CHECK_INT(r->attempts, 1);
  }
  idem_record_free(r);

  /* the same without a status check: outcome_unknown, said honestly */
  mode(g, "stall");
  CHECK_INT(run(g, "c3", "refund_blind",
                "{\"order_id\":\"o3\",\"amount_cents\":700}", &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "\"status\":\"outcome_unknown\"");
  CHECK_INT(w.checks, 0);
  CHECK_INT(refunds("o3"), 1);
  idem_free(env);
}

static void five_hundreds(idem_guard *g) {
  char *env = NULL;
  seen w;
  /* a 503 ends the exchange, but it is no verdict (SPEC §6a): the provider
  ** may apply the request from its queue still.  By default the status
  ** check's "not applied" says only "not yet": the action stays in doubt,
  ** and nothing is sent again (a provider that does not dedupe) */
  mode(g, "fail");
  CHECK_INT(run(g, "c4", "refund_nd",
                "{\"order_id\":\"o4\",\"amount_cents\":900}", &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 1);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(w.attempt_status[0], 503);
  CHECK_INT(w.checks, 1);
  CHECK_INT(w.check_outcome[0], IDEM_OUTCOME_NOT_APPLIED);
  CHECK_IN_DOUBT(env);
  CHECK_HAS(env, "\"attempts\":1");
  CHECK_HAS(env, "HTTP 503");
  idem_free(env);
  record_is(g, "c4", IDEM_STATE_IN_DOUBT, 1);
  /* the same call again, and the model's re-issue: nothing is sent */
  CHECK_INT(run(g, "c4", "refund_nd",
                "{\"order_id\":\"o4\",\"amount_cents\":900}", &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_IN_DOUBT(env);
  idem_free(env);
  CHECK_INT(run(g, "c4b", "refund_nd",
                "{\"order_id\":\"o4\",\"amount_cents\":900}", &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_IN_DOUBT(env);
  CHECK_HAS(env, "\"duplicate_of\":\"c4\"");
  idem_free(env);
  CHECK_INT(refunds("o4"), 0);
  record_is(g, "c4", IDEM_STATE_IN_DOUBT, 1);

  /* a provider that documents a 5xx as "never applied", told so by the
  ** policy (on_5xx "not_applied"): the 503 is a verdict, and the call runs
  ** again with its key, once */
  mode(g, "fail");
  CHECK_INT(run(g, "c4n", "refund_5na",
                "{\"order_id\":\"o4n\",\"amount_cents\":900}", &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 2);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_NOT_APPLIED);
  CHECK_INT(w.attempt_status[0], 503);
  CHECK_INT(w.attempt_outcome[1], IDEM_OUTCOME_APPLIED);
  CHECK_INT(w.checks, 0);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  CHECK_HAS(env, "\"attempts\":2");
  CHECK_INT(refunds("o4n"), 1);
  idem_free(env);

  /* a provider that dedupes on the key (provider_dedupes): the same key
  ** again is harmless, so the ended attempt is retried with it at once */
  mode(g, "fail");
  CHECK_INT(run(g, "c4d", "refund",
                "{\"order_id\":\"o4d\",\"amount_cents\":900}", &env, &w),
            IDEM_OK);
  CHECK_INT(w.attempts, 2);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(w.attempt_status[0], 503);
  CHECK_INT(w.attempt_outcome[1], IDEM_OUTCOME_APPLIED);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  CHECK_HAS(env, "\"attempts\":2");
  CHECK_INT(refunds("o4d"), 1);
  idem_free(env);
}

/* Issue 26 through idem_guard_run: a proxy in front of the provider
** answers 504 at once, and the provider applies the refund from its queue
** a second later (paysim mode queued); the provider does not dedupe, the
** status check asks by key over HTTP.  The call, the model's re-issue at
** once and another 1.6 s after the first: one refund. */
static void proxy_504(idem_guard *g) {
  static const char ARGS26[] = "{\"order_id\":\"o26\",\"amount_cents\":2600}";
  static const char ARGS26S[] =
      "{\"order_id\":\"o26s\",\"amount_cents\":2600}";
  char *env = NULL;
  long long t0, left;
  seen w;
  mode_with(g, "queued", 1000, 0);
  t0 = mono_ms();
  CHECK_INT(run(g, "q1", "refund_q", ARGS26, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 1); /* never sent again */
  CHECK_INT(w.attempt_status[0], 504);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(w.checks, 1);
  CHECK_INT(w.check_outcome[0], IDEM_OUTCOME_NOT_APPLIED); /* not YET */
  CHECK_STR(w.check_tool, "by_key");
  CHECK_IN_DOUBT(env);
  CHECK_HAS(env, "\"check_with\"");
  idem_free(env);
  record_is(g, "q1", IDEM_STATE_IN_DOUBT, 1);
  /* the model re-issues it at once, under a new call id: fenced */
  CHECK_INT(run(g, "q2", "refund_q", ARGS26, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_IN_DOUBT(env);
  CHECK_HAS(env, "\"duplicate_of\":\"q1\"");
  idem_free(env);
  CHECK_INT(refunds("o26"), 0);
  if (mono_ms() - t0 >= 1000)
    fprintf(stderr, "test_http: note: the checks took %lld ms, past the "
            "provider's queue (the premise of issue 26)\n", mono_ms() - t0);
  CHECK(mono_ms() - t0 < 1000);
  /* the refund lands from the queue; the third call 1.6 s after the first */
  if ((left = t0 + 1600 - mono_ms()) > 0) sleep_ms((int)left);
  CHECK_INT(refunds("o26"), 1);
  CHECK_INT(run(g, "q3", "refund_q", ARGS26, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_HAS(env, "\"status\":\"already_applied\"");
  CHECK_HAS(env, "\"duplicate_of\":\"q1\"");
  idem_free(env);
  CHECK_INT(run(g, "q1", "refund_q", ARGS26, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  idem_free(env);
  CHECK_INT(refunds("o26"), 1);

  /* settle_ms 500, and a provider that never applies (a 503 it does not
  ** document): within settle_ms the re-issue is fenced; after it, "not
  ** applied" is the whole truth, and the re-issue runs - once */
  mode_with(g, "fail", 3000, 1);
  t0 = mono_ms();
  CHECK_INT(run(g, "s1", "refund_qs", ARGS26S, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 1);
  CHECK_INT(w.attempt_status[0], 503);
  CHECK_IN_DOUBT(env);
  idem_free(env);
  CHECK_INT(run(g, "s2", "refund_qs", ARGS26S, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 0);
  CHECK_IN_DOUBT(env);
  CHECK_HAS(env, "\"duplicate_of\":\"s1\"");
  idem_free(env);
  CHECK(mono_ms() - t0 < 500);
  sleep_ms(700);
  CHECK_INT(run(g, "s3", "refund_qs", ARGS26S, &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 1);
  CHECK_HAS(env, "\"status\":\"succeeded\"");
  idem_free(env);
  CHECK_INT(refunds("o26s"), 1);
}

typedef struct racer {
  idem_guard *g;
  const char *call_id, *args;
  char *env;
  int rc;
} racer;

static void *race(void *arg) {
  racer *x = arg;
  seen w;
  x->rc = run(x->g, x->call_id, "refund", x->args, &x->env, &w);
  return NULL;
}

static void threads(idem_guard *g) {
  static const char *ids[] = {"t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"};
  static const char *args[] = {
      "{\"order_id\":\"p0\",\"amount_cents\":100}",
      "{\"order_id\":\"p1\",\"amount_cents\":100}",
      "{\"order_id\":\"p2\",\"amount_cents\":100}",
      "{\"order_id\":\"p3\",\"amount_cents\":100}",
      "{\"order_id\":\"p4\",\"amount_cents\":100}",
      "{\"order_id\":\"p5\",\"amount_cents\":100}",
      "{\"order_id\":\"p6\",\"amount_cents\":100}",
      "{\"order_id\":\"p7\",\"amount_cents\":100}"};
  racer x[8];
  pthread_t th[8];
  char order[8];
  int i;
  /* eight calls at once on one guard: each applied once */
  for (i = 0; i < 8; i++) {
    x[i].g = g;
    x[i].call_id = ids[i];
    x[i].args = args[i];
    x[i].env = NULL;
    pthread_create(&th[i], NULL, race, &x[i]);
  }
  for (i = 0; i < 8; i++) {
    pthread_join(th[i], NULL);
    CHECK_INT(x[i].rc, IDEM_OK);
    CHECK_HAS(x[i].env, "\"status\":\"succeeded\"");
    idem_free(x[i].env);
    snprintf(order, sizeof order, "p%d", i);
    CHECK_INT(refunds(order), 1);
  }
  /* four copies of one call at once: one request, three that wait for it */
  for (i = 0; i < 4; i++) {
    x[i].g = g;
    x[i].call_id = "dup";
    x[i].args = "{\"order_id\":\"q1\",\"amount_cents\":100}";
    x[i].env = NULL;
    pthread_create(&th[i], NULL, race, &x[i]);
  }
  for (i = 0; i < 4; i++) {
    pthread_join(th[i], NULL);
    CHECK_INT(x[i].rc, IDEM_OK);
    CHECK_HAS(x[i].env, "\"status\":\"succeeded\"");
    idem_free(x[i].env);
  }
  CHECK_INT(refunds("q1"), 1);
}

static void canonical_numbers(idem_guard *g) {
  static const struct {
    const char *args, *url, *header;
  } v[] = {
      {"{\"amount\":0.1,\"s\":\"x\"}", "GET /n?amount=0.1&s=x ",
       "X-Amount: 0.1\r\n"},
      {"{\"amount\":1e21,\"s\":\"x\"}", "GET /n?amount=1e%2B21&s=x ",
       "X-Amount: 1e+21\r\n"},
      {"{\"amount\":3.141592653589793238462643383279,\"s\":\"x\"}",
       "GET /n?amount=3.141592653589793&s=x ",
       "X-Amount: 3.141592653589793\r\n"},
      {"{\"amount\":6000.0,\"s\":\"x\"}", "GET /n?amount=6000&s=x ",
       "X-Amount: 6000\r\n"},
      {"{\"amount\":1e-7,\"s\":\"x\"}", "GET /n?amount=1e-7&s=x ",
       "X-Amount: 1e-7\r\n"},
      {"{\"amount\":-0.0,\"s\":\"x\"}", "GET /n?amount=0&s=x ",
       "X-Amount: 0\r\n"},
      /* a string is its characters; true, false, null as such */
      {"{\"amount\":\"12.50 \\u00e9\",\"s\":\"a/b\"}",
       "GET /n?amount=12.50%20%C3%A9&s=a%2Fb ", "X-Amount: 12.50 \xC3\xA9\r\n"},
      {"{\"amount\":true,\"s\":null}", "GET /n?amount=true&s=null ",
       "X-Amount: true\r\n"},
  };
  char heads[16384], id[32], *env = NULL;
  size_t i;
  seen w;
  srv_take(heads, sizeof heads);
  for (i = 0; i < sizeof v / sizeof *v; i++) {
    snprintf(id, sizeof id, "n%zu", i);
    CHECK_INT(run(g, id, "amount", v[i].args, &env, &w), IDEM_OK);
    CHECK_HAS(env, "\"status\":\"succeeded\"");
    idem_free(env);
    CHECK_INT(srv_take(heads, sizeof heads), 1);
    CHECK_HAS(heads, v[i].url);
    CHECK_HAS(heads, v[i].header);
  }
  /* an object fills nothing: rejected before anything is sent */
  CHECK_INT(run(g, "n_obj", "amount", "{\"amount\":{\"v\":1},\"s\":\"x\"}",
                &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "\"status\":\"failed\"");
  CHECK_HAS(env, "{amount}: the argument is an object");
  idem_free(env);
  CHECK_INT(srv_take(heads, sizeof heads), 0);
}

/* A 408 ended the exchange but says nothing of the effect (SPEC §6a): the
** server or a proxy gave up waiting, and what it read may be at work. */
static void request_timeout(idem_guard *g) {
  char heads[16384], *env = NULL;
  seen w;
  srv_take(heads, sizeof heads);
  CHECK_INT(run(g, "t408", "note408", "{\"a\":1}", &env, &w), IDEM_OK);
  CHECK_INT(w.attempts, 1); /* not sent again, not rejected */
  CHECK_INT(w.attempt_status[0], 408);
  CHECK_INT(w.attempt_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_IN_DOUBT(env);
  idem_free(env);
  CHECK_INT(srv_take(heads, sizeof heads), 1);
}

/* The caller's check hook: the status command says "not applied". */
static int hook_checks;
static int hook_check(void *ctx, const idem_step *s, const char **result,
                      size_t *len) {
  (void)ctx;
  hook_checks++;
  CHECK_STR(idem_step_check_command(s), "exit 100");
  *result = "{\"ignored\":true}"; /* only an APPLIED check's is read */
  *len = strlen(*result);
  return IDEM_OUTCOME_NOT_APPLIED;
}

static int forbidden_calls;
static void forbidden(void *ctx, const idem_run_event *ev) {
  (void)ctx, (void)ev;
  forbidden_calls++;
}

static void hooks_and_checks(idem_guard *g) {
  idem_run_hooks hooks;
  idem_call call;
  idem_step *s = NULL;
  char *env = NULL, *res = (char *)"x", *why = (char *)"x";
  size_t len = 0, rlen = 9;
  int outcome = 0;
  seen w;
  memset(&call, 0, sizeof call);
  call.size = sizeof call;
  call.session = "s";
  call.tool = "refund_cmd";
  /* a status command: the check hook makes it; its "not applied" after a
  ** 503 (an attempt that ended without a verdict) leaves the action in
  ** doubt, and nothing is sent again (SPEC §6a) */
  mode(g, "fail");
  memset(&hooks, 0, sizeof hooks);
  hooks.size = sizeof hooks;
  hooks.ctx = &w;
  hooks.on_attempt = on_attempt;
  hooks.check = hook_check;
  memset(&w, 0, sizeof w);
  call.call_id = "k1";
  call.args = "{\"order_id\":\"k1\",\"amount_cents\":100}";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_guard_run(g, &call, &hooks, &env, &len), IDEM_OK);
  CHECK_INT(hook_checks, 1);
  CHECK_INT(w.attempts, 1);
  CHECK_IN_DOUBT(env);
  CHECK_INT(refunds("k1"), 0);
  idem_free(env);
  /* without the hook the check is not made: in doubt, outcome_unknown */
  mode(g, "fail");
  call.call_id = "k2";
  call.args = "{\"order_id\":\"k2\",\"amount_cents\":100}";
  call.args_len = strlen(call.args);
  CHECK_INT(run(g, "k2", "refund_cmd", call.args, &env, &w), IDEM_OK);
  CHECK_HAS(env, "\"status\":\"outcome_unknown\"");
  CHECK_INT(w.checks, 1);
  CHECK_INT(w.check_outcome[0], IDEM_OUTCOME_UNKNOWN);
  CHECK_INT(refunds("k2"), 0);
  idem_free(env);

  /* hooks of an older, smaller layout: only the fields within size are
  ** read (on_check lies past it; a check over HTTP happens) */
  mode(g, "fail");
  memset(&hooks, 0, sizeof hooks);
  hooks.size = offsetof(idem_run_hooks, on_check);
  hooks.ctx = &w;
  hooks.on_attempt = on_attempt;
  hooks.on_check = forbidden;
  memset(&w, 0, sizeof w);
  call.tool = "refund_nd";
  call.call_id = "k3";
  call.args = "{\"order_id\":\"k3\",\"amount_cents\":100}";
  call.args_len = strlen(call.args);
  CHECK_INT(idem_guard_run(g, &call, &hooks, &env, &len), IDEM_OK);
  CHECK_IN_DOUBT(env); /* the 503 again: in doubt, not sent again */
  CHECK_INT(w.attempts, 1);
  CHECK_INT(forbidden_calls, 0);
  idem_free(env);

  /* idem_step_check_http: a step not at CHECK; a status tool that is no
  ** HTTP tool (refund_blind has none) */
  call.tool = "refund";
  call.call_id = "k4";
  CHECK_INT(idem_guard_begin(g, &call, &s), IDEM_OK);
  CHECK_INT(idem_step_next(s), IDEM_NEXT_EXECUTE);
  CHECK_INT(idem_step_check_http(s, &outcome, &res, &rlen, &why), IDEM_MISUSE);
  CHECK(res == NULL && why == NULL && rlen == 0);
  CHECK_INT(outcome, IDEM_OUTCOME_UNKNOWN);
  idem_step_free(s);
  s = NULL;
  CHECK_INT(idem_guard_recover(g, "s", "c3", &s), IDEM_OK); /* in doubt */
  CHECK_INT(idem_step_next(s), IDEM_NEXT_CHECK);
  CHECK_INT(idem_step_check_http(s, &outcome, &res, &rlen, &why), IDEM_POLICY);
  CHECK_HAS(idem_guard_errmsg(g), "names no status tool");
  idem_step_free(s);
}

static void refusals(idem_guard *g) {
  idem_record *r = NULL;
  idem_run_hooks hooks;
  idem_call call;
  char *env = (char *)"x";
  seen w;
  size_t len = 7;
  /* a tool without an http rule: nothing runs, nothing is recorded */
  CHECK_INT(run(g, "p1", "plain", "{}", &env, &w), IDEM_POLICY);
  CHECK(env == NULL);
  CHECK_HAS(idem_guard_errmsg(g), "plain");
  CHECK_HAS(idem_guard_errmsg(g), "no \"http\" rule");
  CHECK_INT(idem_guard_record(g, "s", "p1", &r), IDEM_NOTFOUND);
  CHECK_INT(idem_policy_http(NULL, "plain"), 0);
  /* a tool the policy does not name: refused, an answer */
  CHECK_INT(run(g, "u1", "unknown", "{}", &env, &w), IDEM_OK);
  CHECK_HAS(env, "\"status\":\"refused\"");
  idem_free(env);
  /* hooks whose size is 0 */
  memset(&call, 0, sizeof call);
  call.size = sizeof call;
  call.session = "s";
  call.call_id = "h0";
  call.tool = "refund";
  call.args = "{}";
  call.args_len = 2;
  memset(&hooks, 0, sizeof hooks);
  CHECK_INT(idem_guard_run(g, &call, &hooks, &env, &len), IDEM_MISUSE);
  CHECK_HAS(idem_guard_errmsg(g), "idem_run_hooks.size");
  CHECK(env == NULL);
  CHECK_INT(len, 0);
  CHECK_INT(idem_guard_run(NULL, &call, NULL, &env, &len), IDEM_MISUSE);
}

/* Issue 27: a model-controlled argument never leaves its own path
** segment.  "." and ".." are dot segments, which libcurl (and servers)
** resolve: an argument ".." in POST /v1/customers/{customer_id}/refunds
** sent POST /v1/refunds - a refund at the provider - and DELETE
** /v1/accounts/{account_id}/sessions became DELETE /v1/sessions.  They
** are refused before anything is sent; dots that are no dot segment, and
** dots in the query, go out as they are.  And a header value holds no
** control character but a tab (ESC and DEL are refused like line breaks). */
static void dot_segments(idem_guard *g) {
  static const struct {
    const char *tool, *args;
    const char *sent; /* what the server gets, or NULL: nothing */
    const char *why;  /* the refusal, when nothing is sent */
  } v[] = {
      {"end_sessions", "{\"account_id\":\"..\",\"q\":\"x\"}", NULL,
       "{account_id}: the value \\\"..\\\" would leave its path segment"},
      {"end_sessions", "{\"account_id\":\".\",\"q\":\"x\"}", NULL,
       "{account_id}: the value \\\".\\\" would leave its path segment"},
      {"end_sessions", "{\"account_id\":\"../x\",\"q\":\"x\"}", NULL,
       "would leave its path segment"},
      {"end_sessions", "{\"account_id\":\"a/..\",\"q\":\"x\"}", NULL,
       "would leave its path segment"},
      {"end_sessions", "{\"account_id\":\"..\\\\x\",\"q\":\"x\"}", NULL,
       "would leave its path segment"},
      {"end_sessions", "{\"account_id\":\"...\",\"q\":\"..\"}",
       "DELETE /v1/accounts/.../sessions?q=.. ", NULL},
      {"end_sessions", "{\"account_id\":\"a..b\",\"q\":\"x\"}",
       "DELETE /v1/accounts/a..b/sessions?q=x ", NULL},
      {"end_sessions", "{\"account_id\":\"%2E%2E\",\"q\":\"x\"}",
       "DELETE /v1/accounts/%252E%252E/sessions?q=x ", NULL},
      {"end_sessions", "{\"account_id\":\"acct_1\",\"q\":\"../..\"}",
       "DELETE /v1/accounts/acct_1/sessions?q=..%2F.. ", NULL},
      {"hdr", "{\"n\":\"a\\u001bb\"}", NULL,
       "{n} holds the control character 0x1B"},
      {"hdr", "{\"n\":\"a\\u007fb\"}", NULL,
       "{n} holds the control character 0x7F"},
      {"hdr", "{\"n\":\"a\\u0001\"}", NULL,
       "{n} holds the control character 0x01"},
      {"hdr", "{\"n\":\"a\\u000bb\"}", NULL,
       "{n} holds the control character 0x0B"},
      {"hdr", "{\"n\":\"a\\tb \\u00e9\"}", "X-Note: a\tb \xC3\xA9\r\n", NULL},
  };
  char heads[16384], id[32], *env = NULL;
  size_t i;
  seen w;
  /* at the provider: ".." would have been POST /v1/refunds */
  CHECK_INT(run(g, "cu1", "refund_cust",
                "{\"customer_id\":\"..\",\"order_id\":\"dot1\","
                "\"amount_cents\":100}",
                &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "\"status\":\"failed\"");
  CHECK_HAS(env, "{customer_id}: the value \\\"..\\\" would leave its path "
                 "segment");
  idem_free(env);
  CHECK_INT(run(g, "cu2", "refund_cust",
                "{\"customer_id\":\".\",\"order_id\":\"dot1\","
                "\"amount_cents\":100}",
                &env, &w),
            IDEM_OK);
  CHECK_HAS(env, "would leave its path segment");
  idem_free(env);
  CHECK_INT(refunds("dot1"), 0);

  srv_take(heads, sizeof heads);
  for (i = 0; i < sizeof v / sizeof *v; i++) {
    snprintf(id, sizeof id, "ds%zu", i);
    CHECK_INT(run(g, id, v[i].tool, v[i].args, &env, &w), IDEM_OK);
    CHECK_HAS(env, v[i].sent ? "\"status\":\"succeeded\""
                             : "\"status\":\"failed\"");
    CHECK_INT(srv_take(heads, sizeof heads), v[i].sent ? 1 : 0);
    if (v[i].sent)
      CHECK_HAS(heads, v[i].sent);
    else
      CHECK_HAS(env, v[i].why);
    idem_free(env);
  }
}

/* A libidem built without HTTP support. */
static int no_http(const char *dir) {
  char log[4200], heads[16384], *env = (char *)"x";
  idem_policy *p = policy_for(1, srv.port);
  idem_guard *g = NULL;
  idem_record *r = NULL;
  seen w;
  CHECK(idem_http_missing() != NULL);
  CHECK_HAS(idem_http_missing(), "built without HTTP support");
  snprintf(log, sizeof log, "sqlite:%s/nohttp.db", dir);
  CHECK_INT(idem_guard_open(log, p, &g), IDEM_OK);
  CHECK_INT(run(g, "n1", "note", "{\"a\":1}", &env, &w), IDEM_ERROR);
  CHECK(env == NULL);
  CHECK_HAS(idem_guard_errmsg(g), "the HTTP tool note");
  CHECK_HAS(idem_guard_errmsg(g), "built without HTTP support");
  CHECK_HAS(idem_guard_errmsg(g), "nothing was sent or recorded");
  CHECK_INT(idem_guard_record(g, "s", "n1", &r), IDEM_NOTFOUND);
  CHECK_INT(w.attempts, 0);
  sleep_ms(100);
  CHECK_INT(srv_take(heads, sizeof heads), 0);
  /* a refused tool needs no HTTP: still answered */
  CHECK_INT(run(g, "n2", "unknown", "{}", &env, &w), IDEM_OK);
  CHECK_HAS(env, "\"status\":\"refused\"");
  idem_free(env);
  idem_guard_close(g);
  idem_policy_free(p);
  return 0;
}

int main(int argc, char **argv) {
  char log[4200];
  idem_policy *p;
  idem_guard *g = NULL;
  int port;
  if (argc != 3) {
    fprintf(stderr, "usage: test_http PAYSIM DIR | test_http --no-http DIR\n");
    return 2;
  }
  signal(SIGPIPE, SIG_IGN);
  if (srv_start() != 0) {
    fprintf(stderr, "test_http: cannot listen: %s\n", strerror(errno));
    return 1;
  }
  if (strcmp(argv[1], "--no-http") == 0) {
    no_http(argv[2]);
    srv_stop();
    return check_done();
  }
  CHECK(idem_http_missing() == NULL);
  if (!(port = sim_start(argv[1], argv[2]))) {
    fprintf(stderr, "test_http: the simulator %s did not start\n", argv[1]);
    srv_stop();
    return 1;
  }
  p = policy_for(port, srv.port);
  CHECK_INT(idem_policy_http(p, "refund"), 1);
  CHECK_INT(idem_policy_http(p, "plain"), 0);
  snprintf(log, sizeof log, "sqlite:%s/log.db", argv[2]);
  CHECK_INT(idem_guard_open(log, p, &g), IDEM_OK);
  applies_once(g);
  stall_reconciled(g);
  five_hundreds(g);
  proxy_504(g);
  threads(g);
  canonical_numbers(g);
  request_timeout(g);
  hooks_and_checks(g);
  refusals(g);
  dot_segments(g);
  idem_guard_close(g);
  idem_policy_free(p);
  sim_stop();
  srv_stop();
  return check_done();
}

/*
** cmd_mcp.c - `idem mcp`: the MCP stdio gateway (SPEC §10).
**
**   idem mcp --policy FILE [--log URL] [--session ID] [--max-message N]
**            -- COMMAND [ARGS...]
**
** The gateway speaks MCP's stdio transport (one JSON-RPC message per line)
** to the client on its stdin/stdout and spawns the real server, COMMAND, as
** a child with pipes on the child's stdin/stdout; the child's stderr is ours.
**
** Shape.  One thread runs a poll() loop over four descriptors (client in,
** client out, server in, server out), a self-pipe for signals and a
** wake-up pipe for the workers.  Everything that touches the attempt log
** (a begin commits and syncs the write-ahead record) runs on a small pool
** of worker threads, one job at a time per call, so that fifty calls in
** flight do not wait on each other's syncs and the loop keeps forwarding.
** The loop owns every deadline: a timer per call, set when its request
** goes to the server.  Output to either side is queued and written as the
** descriptor accepts it; a line is queued whole or not at all, so nothing
** reaches a peer half-written.  A side whose queue is full is not read
** (back-pressure), so memory stays bounded.
**
** Ids.  Every request the client sends to the server is given a fresh id
** of the gateway's (an integer), remembered with the client's original id
** (its raw bytes), and the server's response gets the original id back.
** The gateway's own requests (guarded calls, status checks) draw from the
** same counter, so the two streams can never collide whatever ids the
** client uses.  Requests from the server to the client (sampling,
** elicitation, roots, ping) and their responses pass through unchanged.
**
** A guarded tools/call (class from the policy, else from the tool's
** annotations learned from tools/list, else unknown_tools) is a call
** (struct gcall) that walks the guard's steps (include/idem.h): EXECUTE
** sends tools/call to the server with the canonical arguments, the key in
** key_arg and in _meta "io.idem/key"; CHECK calls the policy's status tool
** on the same server (or runs its status command on a worker, as idem exec
** does); WAIT sets a timer; ANSWER turns the envelope into a
** tool result for the client.  Past its deadline an execute is answered
** unknown to the guard, the server gets notifications/cancelled, and the
** request's id stays mapped: a response that still comes is recorded as a
** late result (idem_guard_late).
**
** What the server's answer means: a result with isError true is a definite
** failure (rejected: the tool ran and said no); a JSON-RPC error with a
** protocol code (-32700, -32600, -32601, -32602) means the request was not
** processed (rejected); any other error, a server that exits, or the
** deadline means unknown.
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "idemInt.h"
#include "mcp.h"

#define DEFAULT_MAX_MESSAGE ((size_t)4 << 20)
#define WORKERS 4
#define BUCKETS 1024
#define QUEUE_HIGH ((size_t)16 << 20) /* stop reading the other side */
#define GRACE_MS 2000 /* after the client's EOF, before SIGTERM, SIGKILL */

enum { P_FWD = 1, P_EXEC, P_CHECK, P_LATE, P_DROP };
enum { T_NONE = 0, T_DELAY, T_WAIT, T_DEADLINE };
enum { J_BEGIN = 1, J_FINISH, J_RESOLVE, J_POLL, J_DELIVER, J_LATE, J_CMD };

typedef struct gw gw;
typedef struct gcall gcall;

/* A request the gateway sent to the server, by the id it gave it. */
typedef struct pend {
  long long gid;
  int kind;       /* P_*                                      */
  char *cid;      /* P_FWD: the client's id, raw JSON text    */
  size_t cidlen;  /*                                          */
  json_t *cidv;   /* P_FWD: the client's id, parsed           */
  int tools_list; /* P_FWD: a tools/list, whose result we learn */
  gcall *c;       /* P_EXEC, P_CHECK: the call; P_LATE: the late */
  struct pend *next;
} pend;

/* One guarded call (or, with s == NULL, one late result to record). */
struct gcall {
  gw *gw;
  idem_guard *g;
  char *cid;
  size_t cidlen;
  json_t *cidv;
  char *session, *call_id, *tool;
  char *args;
  size_t args_len;
  json_t *meta; /* the client's _meta, sent on downstream */
  idem_step *s;
  /* the worker's job: its inputs, its status and message */
  int job, rc, deliver;
  int outcome;
  char *result, *error;
  size_t result_len;
  char errmsg[512];
  long long token; /* the lease token of the execute in flight */
  /* the server's own answer to this call's last execute */
  int fresh;          /* IDEM_OUTCOME_APPLIED / _REJECTED, or 0 */
  int fresh_is_error; /* fresh_text is a JSON-RPC error object */
  char *fresh_text;   /* its "result" or "error" member, raw */
  size_t fresh_len;
  long long gid; /* the server request in flight, or 0 */
  int timer;
  long long due;
  int cancelled; /* the client cancelled it: no answer */
  gcall *prev, *next, *qnext;
};

struct gw {
  idem_policy *policy;  /* the user's                                */
  idem_policy *gpolicy; /* the same with unknown_tools "guard"       */
  idem_guard *g_user, *g_guarded;
  const char *session;
  size_t max_message;
  json_t *learned; /* tool name -> class, from tools/list        */
  pid_t child;
  int to_srv, from_srv;
  int child_done, child_status, we_killed;
  long long grace_at;
  int grace_stage;
  mcp_lines cin, sin;
  mcp_buf cout, sout;
  int cin_eof, sin_eof, cout_dead, sout_closed;
  pend *buckets[BUCKETS];
  long long next_gid;
  gcall *live;
  int nlive;
  /* workers */
  pthread_t th[WORKERS];
  int nth;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  gcall *qhead, *qtail, *done;
  int stop;
  int wake[2], sig[2];
};

static gw *the_gw; /* for the signal handler's self-pipe */

static long long mono_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static char *dupn(const char *p, size_t n) {
  char *q = malloc(n + 1);
  if (q) {
    memcpy(q, p, n);
    q[n] = '\0';
  }
  return q;
}

static void oom(void) {
  cli_err("out of memory");
  exit(EXIT_FAIL);
}

/* ---- output --------------------------------------------------------------------- */

static void to_client(gw *w, const char *p, size_t n) {
  if (w->cout_dead) return;
  if (mcp_buf_put(&w->cout, p, n)) oom();
}

static void to_server(gw *w, const char *p, size_t n) {
  if (w->sout_closed) return;
  if (mcp_buf_put(&w->sout, p, n)) oom();
}

/* Write what fd takes now; -1 when the peer is gone. */
static int flush_fd(int fd, mcp_buf *b) {
  while (b->len) {
    ssize_t k = write(fd, b->p, b->len);
    if (k < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return 0;
      return -1;
    }
    mcp_buf_consume(b, (size_t)k);
  }
  return 0;
}

static void flush_all(gw *w) {
  if (!w->cout_dead && w->cout.len && flush_fd(1, &w->cout)) {
    w->cout_dead = 1;
    w->cout.len = 0;
  }
  if (!w->sout_closed && w->sout.len && flush_fd(w->to_srv, &w->sout)) {
    w->sout_closed = 1;
    w->sout.len = 0;
    close(w->to_srv);
  }
}

static void client_error(gw *w, const char *id, size_t idlen, int code,
                         const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 5, 6)))
#endif
    ;
static void client_error(gw *w, const char *id, size_t idlen, int code,
                         const char *fmt, ...) {
  char msg[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  if (!w->cout_dead && mcp_put_error(&w->cout, id, idlen, code, msg)) oom();
}

/* ---- pending server requests ------------------------------------------------------- */

static pend *pend_add(gw *w, int kind) {
  pend *p = calloc(1, sizeof *p);
  if (!p) oom();
  p->gid = ++w->next_gid;
  p->kind = kind;
  p->next = w->buckets[p->gid % BUCKETS];
  w->buckets[p->gid % BUCKETS] = p;
  return p;
}

static pend *pend_find(gw *w, long long gid) {
  pend *p;
  if (gid <= 0) return NULL;
  for (p = w->buckets[gid % BUCKETS]; p; p = p->next)
    if (p->gid == gid) return p;
  return NULL;
}

static void pend_remove(gw *w, pend *p) {
  pend **pp = &w->buckets[p->gid % BUCKETS];
  while (*pp != p) pp = &(*pp)->next;
  *pp = p->next;
  free(p->cid);
  json_decref(p->cidv);
  free(p);
}

/* ---- workers ------------------------------------------------------------------------ */

static void gcall_free(gcall *c) {
  if (!c) return;
  idem_step_free(c->s);
  free(c->cid);
  json_decref(c->cidv);
  free(c->session);
  free(c->call_id);
  free(c->tool);
  free(c->args);
  json_decref(c->meta);
  free(c->result);
  free(c->error);
  free(c->fresh_text);
  free(c);
}

static void run_job(gcall *c) {
  int rc = IDEM_OK;
  switch (c->job) {
  case J_BEGIN: {
    idem_call call = {c->session, c->call_id, c->tool, c->args, c->args_len};
    rc = idem_guard_begin(c->g, &call, &c->s);
    break;
  }
  case J_FINISH:
    rc = idem_step_finish(c->s, c->outcome, c->result, c->result_len, c->error);
    break;
  case J_RESOLVE:
    rc = idem_step_resolve(c->s, c->outcome, c->result, c->result_len);
    break;
  case J_POLL: rc = idem_step_poll(c->s); break;
  case J_DELIVER:
    if (c->deliver) rc = idem_step_delivered(c->s);
    break;
  case J_CMD: {
    /* the policy's status command (as for idem exec), then its verdict */
    char *out = NULL;
    size_t len = 0;
    int outcome = cli_status_check(c->s, idem_step_check_command(c->s),
                                   c->session, c->call_id, c->tool, &out, &len);
    rc = idem_step_resolve(c->s, outcome, out, out ? len : 0);
    free(out);
    break;
  }
  case J_LATE:
    rc = idem_guard_late(c->g, c->session, c->call_id, c->token, c->outcome,
                         c->result, c->result_len, c->error);
    break;
  }
  c->rc = rc;
  if (rc) snprintf(c->errmsg, sizeof c->errmsg, "%s", idem_guard_errmsg(c->g));
}

static void *worker(void *arg) {
  gw *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    gcall *c;
    while (!w->qhead && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->qhead) break;
    c = w->qhead;
    w->qhead = c->qnext;
    if (!w->qhead) w->qtail = NULL;
    pthread_mutex_unlock(&w->mu);
    run_job(c);
    pthread_mutex_lock(&w->mu);
    c->qnext = w->done;
    w->done = c;
    if (write(w->wake[1], "j", 1) < 0) { /* the pipe is full: already woken */
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

static void submit(gw *w, gcall *c, int job) {
  c->job = job;
  c->qnext = NULL;
  pthread_mutex_lock(&w->mu);
  if (w->qtail)
    w->qtail->qnext = c;
  else
    w->qhead = c;
  w->qtail = c;
  pthread_cond_signal(&w->cv);
  pthread_mutex_unlock(&w->mu);
}

static void set_input(gcall *c, int outcome, const char *result, size_t len,
                      const char *error) {
  free(c->result);
  free(c->error);
  c->result = result ? dupn(result, len) : NULL;
  c->result_len = result ? len : 0;
  c->error = error ? dupn(error, strlen(error)) : NULL;
  c->outcome = outcome;
}

/* ---- live calls ------------------------------------------------------------------------ */

static void live_add(gw *w, gcall *c) {
  c->next = w->live;
  c->prev = NULL;
  if (w->live) w->live->prev = c;
  w->live = c;
  w->nlive++;
}

static void live_remove(gw *w, gcall *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    w->live = c->next;
  if (c->next) c->next->prev = c->prev;
  w->nlive--;
}

/* ---- a guarded call's steps --------------------------------------------------------- */

static void put_json_string(mcp_buf *b, const char *s) {
  json_t *v = json_string(s);
  char *d = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  if (!d || mcp_buf_puts(b, d)) oom();
  free(d);
  json_decref(v);
}

/* Send tools/call name(args) with _meta to the server as request gid. */
static void send_call(gw *w, long long gid, const char *tool, const char *args,
                      size_t alen, const json_t *meta) {
  mcp_buf m;
  char head[96];
  mcp_buf_init(&m, (size_t)-1);
  snprintf(head, sizeof head,
           "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"tools/call\","
           "\"params\":{\"name\":",
           gid);
  if (mcp_buf_puts(&m, head)) oom();
  put_json_string(&m, tool);
  if (mcp_buf_puts(&m, ",\"arguments\":") || mcp_buf_put(&m, args, alen)) oom();
  if (meta) {
    char *d = json_dumps(meta, JSON_COMPACT);
    if (!d || mcp_buf_puts(&m, ",\"_meta\":") || mcp_buf_puts(&m, d)) oom();
    free(d);
  }
  if (mcp_buf_puts(&m, "}}\n")) oom();
  to_server(w, m.p, m.len);
  mcp_buf_free(&m);
}

static void send_cancel(gw *w, long long gid, const char *why) {
  json_t *n = json_pack("{s:s,s:s,s:{s:I,s:s}}", "jsonrpc", "2.0", "method",
                        "notifications/cancelled", "params", "requestId",
                        (json_int_t)gid, "reason", why);
  char *d = n ? json_dumps(n, JSON_COMPACT) : NULL;
  if (!d) oom();
  to_server(w, d, strlen(d));
  to_server(w, "\n", 1);
  free(d);
  json_decref(n);
}

static int server_gone(gw *w) { return w->sin_eof || w->sout_closed; }

static void send_exec(gw *w, gcall *c) {
  size_t alen;
  const char *args = idem_step_args(c->s, &alen);
  json_t *meta = json_deep_copy(c->meta);
  pend *p;
  if (server_gone(w)) {
    json_decref(meta);
    set_input(c, IDEM_OUTCOME_NOT_APPLIED, NULL, 0,
              "the server has exited; the call was not sent");
    submit(w, c, J_FINISH);
    return;
  }
  if (!meta || json_object_set_new(meta, "io.idem/key",
                                   json_string(idem_step_key(c->s))))
    oom();
  p = pend_add(w, P_EXEC);
  p->c = c;
  c->gid = p->gid;
  c->token = idem_step_token(c->s);
  c->fresh = 0;
  send_call(w, p->gid, c->tool, args, alen, meta);
  json_decref(meta);
  c->timer = T_DEADLINE;
  c->due = mono_ms() + idem_step_deadline_ms(c->s);
}

static void send_check(gw *w, gcall *c) {
  const char *tool = idem_step_check_tool(c->s);
  size_t alen;
  const char *args = idem_step_check_args(c->s, &alen);
  pend *p;
  if (!tool && idem_step_check_command(c->s)) {
    submit(w, c, J_CMD); /* a shell command: on a worker, it blocks */
    return;
  }
  if (!tool || server_gone(w)) {
    set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
    submit(w, c, J_RESOLVE);
    return;
  }
  p = pend_add(w, P_CHECK);
  p->c = c;
  c->gid = p->gid;
  send_call(w, p->gid, tool, args ? args : "{}", args ? alen : 2, NULL);
  c->timer = T_DEADLINE;
  c->due = mono_ms() + idem_step_deadline_ms(c->s);
}

/* The envelope as a tool result: isError, structuredContent, the message. */
static void put_envelope_result(mcp_buf *b, const char *env, size_t elen,
                                const char *message, const char *status,
                                int replayed, int is_error) {
  if (mcp_buf_puts(b, "{\"content\":[{\"type\":\"text\",\"text\":")) oom();
  put_json_string(b, message ? message : status);
  if (mcp_buf_puts(b, "}],\"structuredContent\":") ||
      mcp_buf_put(b, env, elen) ||
      mcp_buf_puts(b, is_error ? ",\"isError\":true" : ",\"isError\":false") ||
      mcp_buf_puts(b, ",\"_meta\":{\"io.idem/status\":"))
    oom();
  put_json_string(b, status);
  if (mcp_buf_puts(b, replayed ? ",\"io.idem/replayed\":true}}"
                               : ",\"io.idem/replayed\":false}}"))
    oom();
}

/* Answer the client from the step's envelope (SPEC §10). */
static void answer(gw *w, gcall *c) {
  size_t elen, rs = 0, re = 0;
  const char *env = idem_step_envelope(c->s, &elen);
  int a = idem_step_answer(c->s);
  json_t *e = json_loadb(env, elen, JSON_DECODE_INT_AS_REAL, NULL);
  const char *status = json_string_value(json_object_get(e, "status"));
  const char *message = json_string_value(json_object_get(e, "message"));
  const char *dup = json_string_value(json_object_get(e, "duplicate_of"));
  int replayed = json_is_true(json_object_get(e, "replayed"));
  int has_result =
      mcp_member(env, elen, "result", &rs, &re) == 1 && env[rs] == '{';
  mcp_buf b;
  if (!status) status = idem_answer_name(a);
  mcp_buf_init(&b, (size_t)-1);
  if (mcp_buf_puts(&b, "{\"jsonrpc\":\"2.0\",\"id\":") ||
      mcp_buf_put(&b, c->cid, c->cidlen))
    oom();
  if (!replayed && c->fresh &&
      ((a == IDEM_ANSWER_SUCCEEDED && c->fresh == IDEM_OUTCOME_APPLIED) ||
       (a == IDEM_ANSWER_FAILED && c->fresh == IDEM_OUTCOME_REJECTED))) {
    /* the server's own answer to this very call, unchanged */
    if (mcp_buf_puts(&b, c->fresh_is_error ? ",\"error\":" : ",\"result\":") ||
        mcp_buf_put(&b, c->fresh_text, c->fresh_len))
      oom();
  } else if (has_result &&
             (a == IDEM_ANSWER_SUCCEEDED || a == IDEM_ANSWER_ALREADY_APPLIED ||
              a == IDEM_ANSWER_FAILED)) {
    /* the recorded result, marked */
    json_t *add = json_pack("{sbss}", "io.idem/replayed",
                            replayed || a == IDEM_ANSWER_ALREADY_APPLIED,
                            "io.idem/status", status);
    if (!add) oom();
    if (dup) json_object_set_new(add, "io.idem/duplicate_of", json_string(dup));
    if (message)
      json_object_set_new(add, "io.idem/message", json_string(message));
    if (mcp_buf_puts(&b, ",\"result\":")) oom();
    if (json_is_array(
            json_object_get(json_object_get(e, "result"), "content"))) {
      if (mcp_put_with_meta(&b, env + rs, re - rs, add)) oom();
    } else {
      /* not a tool result (a status command's output): its JSON as text */
      char *d = json_dumps(add, JSON_COMPACT), *t = dupn(env + rs, re - rs);
      if (!d || !t ||
          mcp_buf_puts(&b, "{\"content\":[{\"type\":\"text\",\"text\":"))
        oom();
      put_json_string(&b, t);
      if (mcp_buf_puts(&b, "}],\"_meta\":") || mcp_buf_puts(&b, d) ||
          mcp_buf_puts(&b, "}"))
        oom();
      free(d);
      free(t);
    }
    json_decref(add);
  } else {
    if (mcp_buf_puts(&b, ",\"result\":")) oom();
    put_envelope_result(&b, env, elen, message, status, replayed,
                        a != IDEM_ANSWER_SUCCEEDED &&
                            a != IDEM_ANSWER_ALREADY_APPLIED);
  }
  if (mcp_buf_puts(&b, "}\n")) oom();
  to_client(w, b.p, b.len);
  mcp_buf_free(&b);
  json_decref(e);
}

/* What the step says next, after a job came back. */
static void advance(gw *w, gcall *c) {
  c->timer = T_NONE;
  switch (idem_step_next(c->s)) {
  case IDEM_NEXT_EXECUTE: {
    long long d = idem_step_delay_ms(c->s);
    if (d > 0) {
      c->timer = T_DELAY;
      c->due = mono_ms() + d;
    } else {
      send_exec(w, c);
    }
    break;
  }
  case IDEM_NEXT_CHECK: send_check(w, c); break;
  case IDEM_NEXT_WAIT:
    c->timer = T_WAIT;
    c->due = mono_ms() + idem_step_delay_ms(c->s);
    break;
  case IDEM_NEXT_ANSWER:
    c->deliver = !c->cancelled && !w->cout_dead;
    if (c->deliver) answer(w, c);
    submit(w, c, J_DELIVER);
    break;
  default:
    client_error(w, c->cid, c->cidlen, -32603, "idem: the guard is confused");
    submit(w, c, J_DELIVER);
  }
}

static void job_done(gw *w, gcall *c) {
  if (c->job == J_DELIVER || c->job == J_LATE) {
    if (c->job == J_LATE && c->rc)
      cli_err("recording a late result of %s/%s: %s", c->session, c->call_id,
              c->errmsg);
    if (c->job == J_DELIVER) live_remove(w, c);
    gcall_free(c);
    return;
  }
  if (c->rc) {
    /* the log failed: no downstream call, and the client is told */
    if (!c->cancelled)
      client_error(w, c->cid, c->cidlen, -32603, "idem: %s%s", c->errmsg,
                   c->job == J_BEGIN ? "; the tool was not called" : "");
    cli_err("%s (session %s, call %s)", c->errmsg, c->session, c->call_id);
    live_remove(w, c);
    gcall_free(c);
    return;
  }
  advance(w, c);
}

/* ---- from the client ------------------------------------------------------------------ */

/* The raw text of member name of params (its span in line), or NULL. */
static const char *params_member(const char *line, size_t len, const char *name,
                                 size_t *n) {
  size_t ps, pe, vs, ve;
  if (mcp_member(line, len, "params", &ps, &pe) != 1) return NULL;
  if (mcp_member(line + ps, pe - ps, name, &vs, &ve) != 1) return NULL;
  *n = ve - vs;
  return line + ps + vs;
}

static void forward_request(gw *w, const char *line, size_t len,
                            const mcp_msg *m) {
  char gid[32];
  pend *p;
  if (server_gone(w)) {
    client_error(w, line + m->id_s, m->id_e - m->id_s, -32603,
                 "idem: the server has exited");
    return;
  }
  p = pend_add(w, P_FWD);
  if (!(p->cid = dupn(line + m->id_s, m->id_e - m->id_s))) oom();
  p->cidlen = m->id_e - m->id_s;
  p->cidv = json_incref(m->id);
  p->tools_list = strcmp(m->method, "tools/list") == 0;
  snprintf(gid, sizeof gid, "%lld", p->gid);
  if (mcp_splice(&w->sout, line, len, m->id_s, m->id_e, gid, strlen(gid)))
    oom();
}

static int tool_class(gw *w, const char *tool) {
  idem__tool_rule scratch;
  const idem__tool_rule *r = idem__policy_rule(w->policy, tool, &scratch);
  json_t *l;
  if (r != &scratch) return r->cls; /* the policy always wins */
  if ((l = json_object_get(w->learned, tool)))
    return (int)json_integer_value(l);
  return w->policy->unknown_tools;
}

static char *meta_string(const json_t *meta, const char *name) {
  const char *v = json_string_value(json_object_get(meta, name));
  return v && *v ? dupn(v, strlen(v)) : NULL;
}

static void handle_call(gw *w, const char *line, size_t len, const mcp_msg *m) {
  const char *tool = json_string_value(json_object_get(m->params, "name"));
  json_t *meta = json_object_get(m->params, "_meta");
  const char *args;
  size_t alen = 0;
  int cls;
  gcall *c;
  if (!tool) {
    forward_request(w, line, len, m); /* the server says what is wrong */
    return;
  }
  cls = tool_class(w, tool);
  if (cls == IDEM_CLASS_READ_ONLY || cls == IDEM_CLASS_IDEMPOTENT) {
    forward_request(w, line, len, m);
    return;
  }
  if (!(c = calloc(1, sizeof *c))) oom();
  c->gw = w;
  c->g = cls == IDEM_CLASS_REFUSED ? w->g_user : w->g_guarded;
  c->cidlen = m->id_e - m->id_s;
  c->cid = dupn(line + m->id_s, c->cidlen);
  c->cidv = json_incref(m->id);
  c->session = meta_string(meta, "io.idem/session");
  if (!c->session) c->session = dupn(w->session, strlen(w->session));
  c->call_id = meta_string(meta, "io.idem/call_id");
  if (!c->call_id) {
    if (json_is_string(m->id))
      c->call_id = meta_string(m->root, "id");
    else
      c->call_id = dupn(c->cid, c->cidlen);
  }
  if (!c->call_id) c->call_id = dupn("\"\"", 2); /* an empty string id */
  c->tool = dupn(tool, strlen(tool));
  args = params_member(line, len, "arguments", &alen);
  if (args) {
    c->args = dupn(args, alen);
    c->args_len = alen;
  } else if (json_object_get(m->params, "arguments")) {
    /* spelt with escapes the scanner does not unescape: jansson's text */
    c->args = json_dumps(json_object_get(m->params, "arguments"),
                         JSON_COMPACT | JSON_ENCODE_ANY);
    c->args_len = c->args ? strlen(c->args) : 0;
  } else {
    c->args = dupn("{}", 2);
    c->args_len = 2;
  }
  c->meta = json_is_object(meta) ? json_deep_copy(meta) : json_object();
  if (!c->cid || !c->session || !c->call_id || !c->tool || !c->args || !c->meta)
    oom();
  /* the gateway's own members are not the server's business */
  json_object_del(c->meta, "io.idem/session");
  json_object_del(c->meta, "io.idem/call_id");
  json_object_del(c->meta, "io.idem/key");
  live_add(w, c);
  submit(w, c, J_BEGIN);
}

static void handle_cancel(gw *w, const char *line, size_t len,
                          const mcp_msg *m) {
  json_t *rid = json_object_get(m->params, "requestId");
  size_t ps, pe, vs, ve;
  gcall *c;
  if (!rid) return;
  for (size_t i = 0; i < BUCKETS; i++)
    for (pend *p = w->buckets[i]; p; p = p->next)
      if (p->kind == P_FWD && json_equal(p->cidv, rid)) {
        char gid[32];
        snprintf(gid, sizeof gid, "%lld", p->gid);
        if (mcp_member(line, len, "params", &ps, &pe) == 1 &&
            mcp_member(line + ps, pe - ps, "requestId", &vs, &ve) == 1) {
          if (!w->sout_closed && mcp_splice(&w->sout, line, len, ps + vs,
                                            ps + ve, gid, strlen(gid)))
            oom();
        }
        return;
      }
  /* a guarded call goes on (its outcome is recorded); it is just not
  ** answered, as MCP asks of a cancelled request */
  for (c = w->live; c; c = c->next)
    if (json_equal(c->cidv, rid)) c->cancelled = 1;
}

static void on_client_line(void *ctx, const char *line, size_t len,
                           int oversized) {
  gw *w = ctx;
  mcp_msg m;
  char err[300];
  if (oversized) {
    size_t vs, ve;
    int has = mcp_prefix_id(line, len, &vs, &ve);
    cli_err("a client message of more than %zu bytes was refused",
            w->max_message);
    client_error(w, has ? line + vs : NULL, has ? ve - vs : 0, -32600,
                 "idem: message larger than %zu bytes refused (see idem mcp "
                 "--max-message)",
                 w->max_message);
    return;
  }
  if (mcp_msg_parse(line, len, &m, err, sizeof err)) {
    client_error(w, NULL, 0, -32700, "Parse error: idem: %s", err);
    return;
  }
  switch (m.kind) {
  case MCP_REQUEST:
    if (strcmp(m.method, "tools/call") == 0)
      handle_call(w, line, len, &m);
    else
      forward_request(w, line, len, &m);
    break;
  case MCP_NOTIFY:
    if (strcmp(m.method, "notifications/cancelled") == 0)
      handle_cancel(w, line, len, &m);
    else {
      to_server(w, line, len);
      to_server(w, "\n", 1);
    }
    break;
  case MCP_RESPONSE: /* to one of the server's requests: its own ids */
    to_server(w, line, len);
    to_server(w, "\n", 1);
    break;
  default:
    client_error(w, m.id_e ? line + m.id_s : NULL, m.id_e ? m.id_e - m.id_s : 0,
                 -32600, "Invalid Request: idem: not a JSON-RPC 2.0 message");
  }
  mcp_msg_free(&m);
}

/* ---- from the server ------------------------------------------------------------------ */

static void learn_tools(gw *w, const json_t *result) {
  const json_t *tools = json_object_get(result, "tools"), *t;
  size_t i;
  json_array_foreach(tools, i, t) {
    const char *name = json_string_value(json_object_get(t, "name"));
    if (name)
      json_object_set_new(w->learned, name, json_integer(mcp_class_of(t)));
  }
}

/* A late result's record-keeper: a gcall without a step. */
static gcall *late_for(gw *w, gcall *c) {
  gcall *l = calloc(1, sizeof *l);
  if (!l) oom();
  l->gw = w;
  l->g = c->g;
  l->session = dupn(c->session, strlen(c->session));
  l->call_id = dupn(c->call_id, strlen(c->call_id));
  l->token = c->token;
  if (!l->session || !l->call_id) oom();
  return l;
}

/* What the server's answer to an execute says happened: the outcome, made
** the input of c's next job (finish, or a late result's record).  *text is
** the raw "result" (or "error", *is_error) member of the answer. */
static int take_answer(gcall *c, const mcp_msg *m, const char *line, size_t len,
                       const char **text, size_t *tlen, int *is_error) {
  size_t vs, ve;
  json_t *result = json_object_get(m->root, "result");
  char err[400];
  int outcome;
  *text = NULL;
  *tlen = 0;
  *is_error = 0;
  err[0] = '\0';
  if (result) {
    if (mcp_member(line, len, "result", &vs, &ve) == 1) {
      *text = line + vs;
      *tlen = ve - vs;
    }
    outcome = IDEM_OUTCOME_APPLIED;
    if (json_is_true(json_object_get(result, "isError"))) {
      snprintf(err, sizeof err, "the tool answered isError");
      outcome = IDEM_OUTCOME_REJECTED;
    }
  } else {
    json_t *e = json_object_get(m->root, "error");
    double code = json_number_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    snprintf(err, sizeof err, "the server answered error %.0f: %s", code,
             msg ? msg : "");
    if (mcp_member(line, len, "error", &vs, &ve) == 1) {
      *text = line + vs;
      *tlen = ve - vs;
      *is_error = 1;
    }
    /* protocol errors: the request was not processed */
    outcome =
        code == -32700 || code == -32600 || code == -32601 || code == -32602
            ? IDEM_OUTCOME_REJECTED
            : IDEM_OUTCOME_UNKNOWN;
  }
  set_input(c, outcome, *is_error ? NULL : *text, *tlen, err[0] ? err : NULL);
  return outcome;
}

static void on_exec_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
                           size_t len) {
  const char *text;
  size_t tlen;
  int is_error, outcome = take_answer(c, m, line, len, &text, &tlen, &is_error);
  c->gid = 0;
  c->timer = T_NONE;
  free(c->fresh_text);
  c->fresh_text = NULL;
  c->fresh = 0;
  if (text && outcome != IDEM_OUTCOME_UNKNOWN) {
    if (!(c->fresh_text = dupn(text, tlen))) oom();
    c->fresh_len = tlen;
    c->fresh = outcome;
    c->fresh_is_error = is_error;
  }
  submit(w, c, J_FINISH);
}

static int step_verdict(void *ctx, const char *text, size_t len) {
  return idem_step_check_verdict(ctx, text, len);
}

static void on_check_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
                            size_t len) {
  json_t *result = json_object_get(m->root, "result");
  size_t vs, ve;
  int outcome = IDEM_OUTCOME_UNKNOWN;
  c->gid = 0;
  c->timer = T_NONE;
  if (json_is_object(result) &&
      !json_is_true(json_object_get(result, "isError")) &&
      mcp_member(line, len, "result", &vs, &ve) == 1) {
    outcome = mcp_verdict(result, line + vs, ve - vs, step_verdict, c->s);
    set_input(c, outcome, outcome == IDEM_OUTCOME_APPLIED ? line + vs : NULL,
              ve - vs, NULL);
  } else {
    set_input(c, outcome, NULL, 0, NULL);
  }
  submit(w, c, J_RESOLVE);
}

static void on_server_response(gw *w, const mcp_msg *m, const char *line,
                               size_t len) {
  long long gid = -1;
  pend *p;
  if (json_is_number(m->id)) {
    double d = json_number_value(m->id);
    if (d >= 1 && d < 9e15 && d == (double)(long long)d) gid = (long long)d;
  }
  if (!(p = pend_find(w, gid))) {
    cli_err("the server answered a request it was not sent (id %.*s); dropped",
            (int)(m->id_e - m->id_s), line + m->id_s);
    return;
  }
  switch (p->kind) {
  case P_FWD:
    if (p->tools_list) learn_tools(w, json_object_get(m->root, "result"));
    if (!w->cout_dead &&
        mcp_splice(&w->cout, line, len, m->id_s, m->id_e, p->cid, p->cidlen))
      oom();
    break;
  case P_EXEC: on_exec_answer(w, p->c, m, line, len); break;
  case P_CHECK: on_check_answer(w, p->c, m, line, len); break;
  case P_LATE: {
    const char *text;
    size_t tlen;
    int is_error;
    take_answer(p->c, m, line, len, &text, &tlen, &is_error);
    submit(w, p->c, J_LATE);
    p->c = NULL;
    break;
  }
  default: break; /* P_DROP: a check answered after its deadline */
  }
  pend_remove(w, p);
}

/* A request in flight that will get no (readable) answer. */
static void pend_fail(gw *w, pend *p, const char *why) {
  switch (p->kind) {
  case P_FWD:
    client_error(w, p->cid, p->cidlen, -32603, "idem: %s", why);
    break;
  case P_EXEC:
    p->c->gid = 0;
    p->c->timer = T_NONE;
    set_input(p->c, IDEM_OUTCOME_UNKNOWN, NULL, 0, why);
    submit(w, p->c, J_FINISH);
    break;
  case P_CHECK:
    p->c->gid = 0;
    p->c->timer = T_NONE;
    set_input(p->c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
    submit(w, p->c, J_RESOLVE);
    break;
  case P_LATE: gcall_free(p->c); break;
  default: break;
  }
  pend_remove(w, p);
}

static void on_server_line(void *ctx, const char *line, size_t len,
                           int oversized) {
  gw *w = ctx;
  mcp_msg m;
  char err[300];
  if (oversized) {
    size_t vs, ve;
    pend *p = NULL;
    cli_err("the server sent a message of more than %zu bytes; dropped",
            w->max_message);
    if (mcp_prefix_id(line, len, &vs, &ve)) {
      char num[32];
      size_t k = ve - vs < sizeof num - 1 ? ve - vs : sizeof num - 1;
      memcpy(num, line + vs, k);
      num[k] = '\0';
      p = pend_find(w, strtoll(num, NULL, 10));
    }
    if (p)
      pend_fail(w, p,
                "the server's answer was larger than the limit "
                "(idem mcp --max-message)");
    return;
  }
  if (mcp_msg_parse(line, len, &m, err, sizeof err)) {
    cli_err("the server sent a line that is not JSON (%s); dropped", err);
    return;
  }
  switch (m.kind) {
  case MCP_REQUEST:
  case MCP_NOTIFY:
    to_client(w, line, len);
    to_client(w, "\n", 1);
    break;
  case MCP_RESPONSE: on_server_response(w, &m, line, len); break;
  default: cli_err("the server sent a line that is not JSON-RPC 2.0; dropped");
  }
  mcp_msg_free(&m);
}

/* ---- timers ---------------------------------------------------------------------------- */

static void fire(gw *w, gcall *c) {
  int t = c->timer;
  c->timer = T_NONE;
  if (t == T_DELAY) {
    send_exec(w, c);
  } else if (t == T_WAIT) {
    submit(w, c, J_POLL);
  } else if (t == T_DEADLINE) {
    pend *p = pend_find(w, c->gid);
    char why[96];
    long long ms = idem_step_deadline_ms(c->s);
    snprintf(why, sizeof why, "no answer within %lld ms", ms);
    if (!server_gone(w)) send_cancel(w, c->gid, "idem: the deadline passed");
    c->gid = 0;
    if (p && p->kind == P_EXEC) {
      /* the answer may still come: record it then */
      p->kind = P_LATE;
      p->c = late_for(w, c);
      set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, why);
      submit(w, c, J_FINISH);
    } else {
      if (p) p->kind = P_DROP;
      set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
      submit(w, c, J_RESOLVE);
    }
  }
}

/* Milliseconds to the next timer (-1: none), firing those that are due. */
static int run_timers(gw *w) {
  long long now = mono_ms(), next = -1;
  gcall *c, *nx;
  for (c = w->live; c; c = nx) {
    nx = c->next;
    if (c->timer == T_NONE) continue;
    if (c->due <= now)
      fire(w, c);
    else if (next < 0 || c->due < next)
      next = c->due;
  }
  if (w->grace_at && next < 0) next = w->grace_at;
  if (w->grace_at && w->grace_at < next) next = w->grace_at;
  if (next < 0) return -1;
  return next - now > 60000 ? 60000 : (int)(next - now);
}

/* ---- the child ------------------------------------------------------------------------- */

static void on_signal(int sig) {
  unsigned char b = (unsigned char)sig;
  int saved = errno;
  if (the_gw && write(the_gw->sig[1], &b, 1) < 0) { /* full: already told */
  }
  errno = saved;
}

static int set_flags(int fd, int add) {
  int fl = fcntl(fd, F_GETFL);
  return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | add);
}

/* Start the server with pipes on its stdin and stdout; 0 or an errno. */
static int spawn(gw *w, char **argv) {
  int in[2], out[2], err[2], e = 0;
  pid_t pid, parent = getpid();
  ssize_t k;
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
    return errno;
  pid = fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    /* the server dies with us, and is signalled by us alone */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127); /* we died before the prctl */
    setpgid(0, 0);
    signal(SIGPIPE, SIG_DFL);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(127);
    execvp(argv[0], argv);
    e = errno;
    if (write(err[1], &e, sizeof e) < 0) _exit(127);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  do k = read(err[0], &e, sizeof e);
  while (k < 0 && errno == EINTR);
  close(err[0]);
  if (k == (ssize_t)sizeof e) {
    waitpid(pid, NULL, 0);
    close(in[1]);
    close(out[0]);
    return e;
  }
  w->child = pid;
  w->to_srv = in[1];
  w->from_srv = out[0];
  set_flags(w->to_srv, O_NONBLOCK);
  set_flags(w->from_srv, O_NONBLOCK);
  return 0;
}

static void reap(gw *w) {
  int st;
  pid_t r;
  while (!w->child_done && (r = waitpid(w->child, &st, WNOHANG)) != 0) {
    if (r < 0 && errno == EINTR) continue;
    w->child_done = 1;
    w->child_status = r < 0 ? 0 : st;
  }
}

static void server_closed(gw *w) {
  w->sin_eof = 1;
  mcp_lines_end(&w->sin, on_server_line, w);
  /* every request in flight is answered now: nobody else will */
  for (size_t i = 0; i < BUCKETS; i++)
    while (w->buckets[i])
      pend_fail(w, w->buckets[i], "the server exited before answering");
  if (!w->sout_closed) {
    w->sout_closed = 1;
    w->sout.len = 0;
    close(w->to_srv);
  }
}

/* ---- the loop -------------------------------------------------------------------------- */

static int jobs_idle(gw *w) {
  int idle;
  pthread_mutex_lock(&w->mu);
  idle = !w->qhead && !w->done;
  pthread_mutex_unlock(&w->mu);
  return idle;
}

static int loop(gw *w) {
  char buf[65536];
  for (;;) {
    struct pollfd pf[6];
    int n = 0, ic = -1, is = -1, oc = -1, os = -1, timeout;
    gcall *d;

    /* jobs the workers finished */
    pthread_mutex_lock(&w->mu);
    d = w->done;
    w->done = NULL;
    pthread_mutex_unlock(&w->mu);
    while (d) {
      gcall *nx = d->qnext;
      job_done(w, d);
      d = nx;
    }
    timeout = run_timers(w);

    /* the client is gone and its last messages are sent: the server's
    ** stdin closes; a server that does not exit then is stopped */
    if (w->cin_eof && !w->sout_closed && !w->sout.len && !w->nlive) {
      w->sout_closed = 1;
      close(w->to_srv);
      w->grace_at = mono_ms() + GRACE_MS;
    }
    if (w->grace_at && !w->child_done && mono_ms() >= w->grace_at) {
      kill(w->child, w->grace_stage ? SIGKILL : SIGTERM);
      w->we_killed = 1;
      w->grace_stage++;
      w->grace_at = mono_ms() + GRACE_MS;
    }
    flush_all(w);
    if (w->child_done && w->sin_eof && !w->nlive && jobs_idle(w) &&
        (w->cout_dead || !w->cout.len))
      return 0;
    if (w->cin_eof && w->cout_dead && w->child_done && w->sin_eof &&
        jobs_idle(w) && !w->nlive)
      return 0;

    pf[n].fd = w->sig[0];
    pf[n++].events = POLLIN;
    pf[n].fd = w->wake[0];
    pf[n++].events = POLLIN;
    if (!w->cin_eof && w->sout.len < QUEUE_HIGH && w->cout.len < QUEUE_HIGH) {
      ic = n;
      pf[n].fd = 0;
      pf[n++].events = POLLIN;
    }
    if (!w->sin_eof && w->cout.len < QUEUE_HIGH) {
      is = n;
      pf[n].fd = w->from_srv;
      pf[n++].events = POLLIN;
    }
    if (w->cout.len && !w->cout_dead) {
      oc = n;
      pf[n].fd = 1;
      pf[n++].events = POLLOUT;
    }
    if (w->sout.len && !w->sout_closed) {
      os = n;
      pf[n].fd = w->to_srv;
      pf[n++].events = POLLOUT;
    }
    if (w->child_done && w->sin_eof && timeout < 0) timeout = 50;
    if (poll(pf, (nfds_t)n, timeout) < 0) {
      if (errno == EINTR) continue;
      cli_err("poll: %s", strerror(errno));
      return -1;
    }
    if (pf[0].revents & POLLIN) {
      unsigned char sigs[64];
      ssize_t k = read(w->sig[0], sigs, sizeof sigs);
      for (ssize_t i = 0; i < k; i++) {
        if (sigs[i] == SIGCHLD)
          reap(w);
        else if (!w->child_done)
          kill(w->child, sigs[i]); /* forwarded */
      }
    }
    if (pf[1].revents & POLLIN) {
      ssize_t k = read(w->wake[0], buf, sizeof buf);
      (void)k;
    }
    if (is >= 0 && pf[is].revents) {
      ssize_t k = read(w->from_srv, buf, sizeof buf);
      if (k > 0) {
        if (mcp_lines_feed(&w->sin, buf, (size_t)k, on_server_line, w)) oom();
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        server_closed(w);
      }
    }
    if (ic >= 0 && pf[ic].revents) {
      ssize_t k = read(0, buf, sizeof buf);
      if (k > 0) {
        if (mcp_lines_feed(&w->cin, buf, (size_t)k, on_client_line, w)) oom();
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        w->cin_eof = 1;
        mcp_lines_end(&w->cin, on_client_line, w);
      }
    }
    (void)oc;
    (void)os;
  }
}

/* ---- setting up ---------------------------------------------------------------------- */

/* The user's policy with unknown_tools "guard": the guard's rules for the
** tools the policy does not name but tools/list showed to be guarded. */
static int guarding_policy(const char *path, idem_policy **out) {
  json_error_t je;
  json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
  char *text;
  int rc;
  *out = NULL;
  if (!root || json_object_set_new(root, "unknown_tools", json_string("guard")))
    return IDEM_POLICY;
  text = json_dumps(root, JSON_COMPACT);
  json_decref(root);
  if (!text) return IDEM_NOMEM;
  rc = idem_policy_parse(text, strlen(text), path, out);
  free(text);
  return rc;
}

static void random_session(char *buf, size_t n) {
  unsigned char r[8] = {0};
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(r, 1, sizeof r, f) != sizeof r) {
    long long t = mono_ms() ^ (long long)getpid();
    memcpy(r, &t, sizeof r);
  }
  if (f) fclose(f);
  snprintf(buf, n, "mcp-%02x%02x%02x%02x%02x%02x%02x%02x", r[0], r[1], r[2],
           r[3], r[4], r[5], r[6], r[7]);
}

static int exit_status(const gw *w) {
  if (!w->child_done) return EXIT_FAIL;
  if (WIFEXITED(w->child_status)) return WEXITSTATUS(w->child_status);
  if (w->we_killed) return EXIT_OK; /* stopped after the client left */
  if (WIFSIGNALED(w->child_status)) return 128 + WTERMSIG(w->child_status);
  return EXIT_FAIL;
}

int cmd_mcp(int argc, char **argv) {
  static const struct option opts[] = {
      {"policy", required_argument, NULL, 'p'},
      {"log", required_argument, NULL, 'L'},
      {"session", required_argument, NULL, 's'},
      {"max-message", required_argument, NULL, 'm'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *policy_path = NULL, *log = NULL, *session = NULL;
  char sessbuf[64], logbuf[4200];
  size_t max_message = DEFAULT_MAX_MESSAGE;
  gw *w;
  int ch, rc, code = EXIT_FAIL, stdout_flags;
  struct sigaction sa;

  while ((ch = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': policy_path = optarg; break;
    case 'L': log = optarg; break;
    case 's': session = optarg; break;
    case 'm':
      if (cli_parse_size("--max-message", optarg, 1024, (size_t)1 << 30,
                         &max_message))
        return EXIT_USAGE;
      break;
    case 'h': cli_print_usage(stdout, "mcp"); return EXIT_OK;
    case ':':
      return cli_usage("mcp", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("mcp", "no option '%s' for mcp", argv[optind - 1]);
    }
  }
  if (!policy_path) return cli_usage("mcp", "--policy is required");
  if (optind >= argc)
    return cli_usage("mcp", "the server to run is missing (after --)");
  if (session && !*session) return cli_usage("mcp", "--session is empty");
  if (!session) session = getenv("IDEM_SESSION");
  if (!session || !*session) {
    random_session(sessbuf, sizeof sessbuf);
    session = sessbuf;
    cli_err("no --session or IDEM_SESSION: calls without _meta "
            "\"io.idem/session\" use session %s, which a restart does not "
            "keep",
            session);
  }
  if (!(w = calloc(1, sizeof *w))) oom();
  w->session = session;
  w->max_message = max_message;
  rc = idem_policy_load(policy_path, &w->policy);
  if (rc) {
    cli_err("%s: %s", policy_path,
            w->policy ? idem_policy_errmsg(w->policy) : "out of memory");
    code = rc == IDEM_POLICY ? EXIT_DATA : EXIT_FAIL;
    goto out;
  }
  if ((rc = guarding_policy(policy_path, &w->gpolicy))) {
    cli_err("%s: %s", policy_path,
            w->gpolicy ? idem_policy_errmsg(w->gpolicy) : "cannot be read");
    goto out;
  }
  if (!(w->learned = json_object())) oom();
  mcp_lines_init(&w->cin, max_message);
  mcp_lines_init(&w->sin, max_message);
  mcp_buf_init(&w->cout, (size_t)1 << 40);
  mcp_buf_init(&w->sout, (size_t)1 << 40);
  if (pipe2(w->sig, O_CLOEXEC | O_NONBLOCK) ||
      pipe2(w->wake, O_CLOEXEC | O_NONBLOCK)) {
    cli_err("pipe: %s", strerror(errno));
    goto out;
  }
  the_gw = w;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGCHLD, &sa, NULL);
  sigaction(SIGINT, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
  sigaction(SIGHUP, &sa, NULL);
  signal(SIGPIPE, SIG_IGN);
  /* the server is forked before any thread exists (the log's included),
  ** so the child's way to exec takes no lock another thread held */
  if ((rc = spawn(w, argv + optind))) {
    cli_err("cannot run %s: %s", argv[optind], strerror(rc));
    goto out;
  }
  if (!log) log = idem__default_log(logbuf, sizeof logbuf);
  if (idem_guard_open(log, w->policy, &w->g_user) ||
      idem_guard_open(log, w->gpolicy, &w->g_guarded)) {
    cli_err("%s", idem_guard_errmsg(w->g_guarded ? w->g_guarded : w->g_user));
    kill(w->child, SIGTERM);
    waitpid(w->child, NULL, 0);
    goto out;
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (w->nth = 0; w->nth < WORKERS; w->nth++)
    if (pthread_create(&w->th[w->nth], NULL, worker, w)) break;
  if (!w->nth) {
    cli_err("cannot start a thread");
    kill(w->child, SIGTERM);
    waitpid(w->child, NULL, 0);
    goto out;
  }
  stdout_flags = fcntl(1, F_GETFL);
  set_flags(1, O_NONBLOCK);
  if (loop(w) == 0) code = exit_status(w);
  if (stdout_flags >= 0) fcntl(1, F_SETFL, stdout_flags);

  pthread_mutex_lock(&w->mu);
  w->stop = 1;
  pthread_cond_broadcast(&w->cv);
  pthread_mutex_unlock(&w->mu);
  for (int i = 0; i < w->nth; i++) pthread_join(w->th[i], NULL);
  for (size_t i = 0; i < BUCKETS; i++)
    while (w->buckets[i]) {
      if (w->buckets[i]->kind == P_LATE) gcall_free(w->buckets[i]->c);
      pend_remove(w, w->buckets[i]);
    }
  while (w->live) {
    gcall *c = w->live;
    live_remove(w, c);
    gcall_free(c);
  }
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
out:
  the_gw = NULL;
  mcp_lines_free(&w->cin);
  mcp_lines_free(&w->sin);
  mcp_buf_free(&w->cout);
  mcp_buf_free(&w->sout);
  json_decref(w->learned);
  idem_guard_close(w->g_user);
  idem_guard_close(w->g_guarded);
  idem_policy_free(w->policy);
  idem_policy_free(w->gpolicy);
  free(w);
  return code;
}

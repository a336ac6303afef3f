/*
** gateway.c - `idem mcp`: the MCP stdio gateway (SPEC §10): the loop, the
** two peers' lines, the child process, setting up and shutting down.
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
** unknown to the guard and the request's id stays mapped: a response that
** still comes is recorded as a late result (idem_guard_late).  The server's
** request is not cancelled (a server that honours notifications/cancelled
** drops the very answer that would settle the action); the gateway sends
** that notification only to pass on the client's own.  A request past its
** deadline (an execute, or a status check, whose answer is then dropped)
** stays in the id table until its answer comes, the server's output
** closes, or the gateway exits: for the gateway's life at most, about a
** kilobyte each.
**
** What the server's answer means (call.c, gw_take_answer): a result is
** applied; a result with isError true means what the tool's on_is_error
** says - by default unknown (the SDKs answer isError for any exception of
** a handler, its own timeout talking to the provider included); a JSON-RPC
** error -32700, -32600 or -32601 means the request was not processed
** (rejected); any other error (-32602 and -32603 included: the official
** SDK answers -32602 when it validates a result after the handler ran), a
** server that exits, or the deadline means unknown.  A tools/call whose
** params.name is not a non-empty string is refused (-32602) and never
** forwarded: no class, no record, no key could be given to it.  Ended is
** not finished (SPEC §6a): an answer ends the attempt, but only a verdict
** (applied, rejected, not applied) finishes it; after an end without one
** the request may still land, and a status check's "not applied" means
** "not yet".
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
#include <strings.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "gw.h"
#include "mcp.h"
#include "serve/serve.h"

extern char **environ;

static gw *the_gw; /* for the signal handler's self-pipe */

/* Is request (id, who) the client's request rid?  Over HTTP the front
** numbered the request; its client's own id is who's, and only the same
** session's requests are that client's. */
static int same_request(const gw *w, const json_t *id, const gw_who *who,
                        const json_t *rid) {
  json_t *own;
  int same;
  if (!w->front) return json_equal(id, rid);
  if (!who || !who->id || !w->who || !who->sid || !w->who->sid ||
      strcmp(who->sid, w->who->sid) || strcmp(who->caller, w->who->caller))
    return 0;
  own = json_loads(who->id, JSON_DECODE_ANY, NULL);
  same = own && json_equal(own, rid);
  json_decref(own);
  return same;
}

static void handle_cancel(gw *w, const char *line, size_t len,
                          const mcp_msg *m) {
  json_t *rid = json_object_get(m->params, "requestId");
  size_t ps, pe, vs, ve;
  gcall *c;
  if (!rid) return;
  for (size_t i = 0; i < BUCKETS; i++)
    for (pend *p = w->buckets[i]; p; p = p->next)
      if (p->kind == P_FWD && same_request(w, p->cidv, p->who, rid)) {
        char gid[32];
        snprintf(gid, sizeof gid, "%lld", p->gid);
        if (mcp_member(line, len, "params", &ps, &pe) == 1 &&
            mcp_member(line + ps, pe - ps, "requestId", &vs, &ve) == 1) {
          if (!w->sout_closed && mcp_splice(&w->sout, line, len, ps + vs,
                                            ps + ve, gid, strlen(gid)))
            gw_oom();
          gw_server_push(w);
        }
        return;
      }
  /* a guarded call goes on (its outcome is recorded); it is just not
  ** answered, as MCP asks of a cancelled request */
  for (c = w->live; c; c = c->next)
    if (same_request(w, c->cidv, c->who, rid)) c->cancelled = 1;
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
    gw_client_error(w, has ? line + vs : NULL, has ? ve - vs : 0, -32600,
                    "idem: message larger than %zu bytes refused (see idem mcp "
                    "--max-message)",
                    w->max_message);
    return;
  }
  if (mcp_msg_parse(line, len, &m, err, sizeof err)) {
    gw_client_error(w, NULL, 0, -32700, "Parse error: idem: %s", err);
    return;
  }
  switch (m.kind) {
  case MCP_REQUEST:
    if (strcmp(m.method, "tools/call") == 0)
      gw_handle_call(w, line, len, &m);
    else
      gw_forward_request(w, line, len, &m);
    break;
  case MCP_NOTIFY:
    if (strcmp(m.method, "notifications/cancelled") == 0)
      handle_cancel(w, line, len, &m);
    else if (strcmp(m.method, "tools/call") == 0) {
      /* a call shaped as a notification (no id) would reach the server
      ** unguarded, and nobody could be told its outcome: it stops here,
      ** and JSON-RPC allows no answer to a notification */
      cli_err("a tools/call without an id (a notification) was dropped: "
              "a call must be a request, with an id, to go through the "
              "guard");
    } else {
      gw_to_server(w, line, len);
      gw_to_server(w, "\n", 1);
    }
    break;
  case MCP_RESPONSE: /* to one of the server's requests: its own ids */
    gw_to_server(w, line, len);
    gw_to_server(w, "\n", 1);
    break;
  default:
    gw_client_error(w, m.id_e ? line + m.id_s : NULL,
                    m.id_e ? m.id_e - m.id_s : 0, -32600,
                    "Invalid Request: idem: not a JSON-RPC 2.0 message");
  }
  mcp_msg_free(&m);
}

/* ---- from the server ------------------------------------------------------------------ */

static void on_server_response(gw *w, const mcp_msg *m, const char *line,
                               size_t len) {
  long long gid = -1;
  pend *p;
  if (json_is_number(m->id)) {
    double d = json_number_value(m->id);
    if (d >= 1 && d < 9e15 && d == (double)(long long)d) gid = (long long)d;
  }
  if (!(p = gw_pend_find(w, gid))) {
    cli_err("the server answered a request it was not sent (id %.*s); dropped",
            (int)(m->id_e - m->id_s), line + m->id_s);
    return;
  }
  switch (p->kind) {
  case P_FWD:
    if (p->tools_list) gw_learn_tools(w, json_object_get(m->root, "result"));
    if (!w->cout_dead &&
        mcp_splice(&w->cout, line, len, m->id_s, m->id_e, p->cid, p->cidlen))
      gw_oom();
    break;
  case P_EXEC: gw_on_exec_answer(w, p->c, m, line, len); break;
  case P_CHECK: gw_on_check_answer(w, p->c, m, line, len); break;
  case P_LATE: {
    const char *text;
    size_t tlen;
    int is_error;
    gw_take_answer(p->c, m, line, len, &text, &tlen, &is_error);
    gw_submit(w, p->c, J_LATE);
    p->c = NULL;
    break;
  }
  default: break; /* P_DROP: a check answered after its deadline */
  }
  gw_pend_remove(w, p);
}

/* A request in flight that will get no (readable) answer.  An execute's
** outcome is unknown and its attempt is NOT reported ended: a server that
** exits or closes its output is no verdict, and its process group (or a
** provider it handed the call to) may still carry the attempt - the guard
** holds it as one that may still land, until settle_ms after its deadline
** (SPEC §6a). */
static void pend_fail(gw *w, pend *p, const char *why) {
  switch (p->kind) {
  case P_FWD:
    gw_client_error(w, p->cid, p->cidlen, -32603, "idem: %s", why);
    break;
  case P_EXEC:
    p->c->gid = 0;
    p->c->timer = T_NONE;
    gw_set_input(p->c, IDEM_OUTCOME_UNKNOWN, NULL, 0, why);
    gw_submit(w, p->c, J_FINISH);
    break;
  case P_CHECK:
    p->c->gid = 0;
    p->c->timer = T_NONE;
    gw_set_input(p->c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
    gw_submit(w, p->c, J_RESOLVE);
    break;
  case P_LATE: gw_gcall_free(p->c); break;
  default: break;
  }
  gw_pend_remove(w, p);
}

/* A server's request or notification, for HTTP clients: on the stream of
** the request it came about (an HTTP upstream says which: w->rel), else on
** its session's GET stream; a message no stream can take is dropped (a
** stdio server says nothing of which request a message is about). */
static void to_http_client(gw *w, const char *line, size_t len) {
  pend *p = gw_pend_find(w, w->rel);
  const gw_who *who = NULL;
  static int said;
  if (p) who = p->kind == P_FWD ? p->who : p->c ? p->c->who : NULL;
  if (front_server_msg(w->front, who ? who->frid : 0,
                       who ? who->sid : w->rel_sid[0] ? w->rel_sid : NULL,
                       line, len) &&
      !said++)
    cli_err("a message of the server's reached no client (no request or "
            "session stream to take it); dropped, and so are later ones");
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
      p = gw_pend_find(w, strtoll(num, NULL, 10));
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
    if (w->front)
      to_http_client(w, line, len);
    else {
      gw_to_client(w, line, len);
      gw_to_client(w, "\n", 1);
    }
    break;
  case MCP_RESPONSE: on_server_response(w, &m, line, len); break;
  default: cli_err("the server sent a line that is not JSON-RPC 2.0; dropped");
  }
  mcp_msg_free(&m);
}

/* ---- timers ---------------------------------------------------------------------------- */

/* Milliseconds to the next timer (-1: none), firing those that are due.
** A call whose timer fired may have armed a new one (a WAIT polled on the
** loop waits again) or be gone: 0 then, and the next turn of the loop
** looks again. */
static int run_timers(gw *w) {
  long long now = cli_mono_ms(), next = -1;
  gcall *c, *nx;
  int fired = 0;
  for (c = w->live; c; c = nx) {
    nx = c->next;
    if (c->timer == T_NONE) continue;
    if (c->due <= now) {
      gw_fire(w, c);
      fired = 1;
    } else if (next < 0 || c->due < next)
      next = c->due;
  }
  if (fired) return 0;
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

/* Start the server (spawn.c) with non-blocking pipes on its stdin and
** stdout; 0 or an errno. */
static int spawn(gw *w, char **argv) {
  int e = mcp_spawn(argv, &w->child, &w->to_srv, &w->from_srv);
  if (e) return e;
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

/*
** The server's output ended: it exited, or it closed its stdout and lives
** on, and either way it will answer nothing more.  Every request in flight
** is answered now (a guarded one: unknown, in these words), and the
** shutdown rule applies as when the client leaves: its stdin closes, then
** SIGTERM after GRACE_MS, then SIGKILL - a server that keeps running with
** its output closed is not waited for without bound.
*/
static void server_closed(gw *w) {
  int partial = w->sin.b.len > 0 || w->sin.skipping;
  char why[160];
  w->sin_eof = 1;
  /* which of the two, for the words: an exiting process closes its files
  ** a moment before it can be reaped */
  for (int i = 0; i < 50 && !w->child_done; i++) {
    reap(w);
    if (!w->child_done) usleep(1000);
  }
  w->gone_why = w->child_done ? "the server has exited"
                              : "the server closed its output";
  if (!w->child_done) {
    w->output_closed = 1;
    cli_err("the server closed its output but is still running; it is "
            "stopped as when the client leaves");
  }
  mcp_lines_end(&w->sin, on_server_line, w);
  snprintf(why, sizeof why, "%s %s", w->gone_why,
           partial ? "in the middle of a message, before answering"
                   : "before answering");
  for (size_t i = 0; i < BUCKETS; i++)
    while (w->buckets[i]) pend_fail(w, w->buckets[i], why);
  if (!w->sout_closed) {
    w->sout_closed = 1;
    w->sout.len = 0;
    close(w->to_srv);
  }
  if (!w->child_done && !w->grace_at) w->grace_at = cli_mono_ms() + GRACE_MS;
}

/* ---- the loop -------------------------------------------------------------------------- */

static int jobs_idle(gw *w) {
  int idle;
  pthread_mutex_lock(&w->mu);
  idle = !w->qhead && !w->done && !w->busy;
  pthread_mutex_unlock(&w->mu);
  return idle;
}

static void front_to_client_error(gw *w, long long frid);

/* What the HTTP front took from its clients. */
static void from_http_clients(gw *w) {
  front_in *m = front_take(w->front);
  while (m) {
    front_in *nx = m->next;
    if (w->cin_eof) {
      if (m->kind == FI_MSG && m->who && m->who->frid)
        front_to_client_error(w, m->frid);
    } else if (m->kind == FI_MSG) {
      w->who = m->who;
      on_client_line(w, m->line, m->len, 0);
      w->who = NULL;
    } else if (m->kind == FI_GONE) {
      /* its client left: the call goes on to its outcome, unanswered and
      ** not told (SPEC §10); the server's request is not cancelled */
      for (gcall *c = w->live; c; c = c->next)
        if (c->who && c->who->frid == m->frid) c->cancelled = 1;
    } else if (m->kind == FI_END_SESSION && w->up) {
      up_session_end(w->up, m->line);
    }
    front_in_free(m);
    m = nx;
  }
}

/* What the HTTP upstream answered; its end is the server's. */
static void from_http_server(gw *w) {
  int eof;
  up_msg *m = up_take(w->up, &eof);
  while (m) {
    up_msg *nx = m->next;
    w->rel = m->rel;
    w->rel_sid = m->sid;
    on_server_line(w, m->line, m->len, 0);
    w->rel = 0;
    w->rel_sid = "";
    free(m);
    m = nx;
  }
  if (eof && !w->sin_eof) {
    w->child_done = 1;
    w->child_status = 0;
    w->gone_why = "the gateway stopped its upstream";
    for (size_t i = 0; i < BUCKETS; i++)
      while (w->buckets[i]) pend_fail(w, w->buckets[i], w->gone_why);
    w->sin_eof = 1;
  }
}

/* A client request that came while the gateway winds down. */
static void front_to_client_error(gw *w, long long frid) {
  char id[32];
  snprintf(id, sizeof id, "%lld", frid);
  gw_client_error(w, id, strlen(id), -32603,
                  "idem: the gateway is stopping; nothing was sent");
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
      gw_job_done(w, d);
      d = nx;
    }
    timeout = run_timers(w);

    /* the client is gone and its last messages are sent: the server's
    ** stdin closes; a server that does not exit then is stopped */
    if (w->cin_eof && !w->sout_closed && !w->sout.len && !w->nlive) {
      w->sout_closed = 1;
      if (w->up) {
        up_close(w->up, GRACE_MS); /* late answers still land meanwhile */
      } else {
        close(w->to_srv);
        w->grace_at = cli_mono_ms() + GRACE_MS;
      }
    }
    if (w->grace_at && w->child && !w->child_done &&
        cli_mono_ms() >= w->grace_at) {
      kill(w->child, w->grace_stage ? SIGKILL : SIGTERM);
      w->we_killed = 1;
      w->grace_stage++;
      w->grace_at = cli_mono_ms() + GRACE_MS;
    }
    gw_flush(w);
    gw_settle(w, 0);
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
    if (!w->front && !w->cin_eof && w->sout.len < QUEUE_HIGH &&
        w->cout.len < QUEUE_HIGH) {
      ic = n;
      pf[n].fd = 0;
      pf[n++].events = POLLIN;
    }
    if (!w->up && !w->sin_eof && w->cout.len < QUEUE_HIGH) {
      is = n;
      pf[n].fd = w->from_srv;
      pf[n++].events = POLLIN;
    }
    if (w->cout.len && !w->cout_dead && !w->front) {
      oc = n;
      pf[n].fd = 1;
      pf[n++].events = POLLOUT;
    }
    if (w->sout.len && !w->sout_closed && !w->up) {
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
        else if (w->child && !w->child_done)
          kill(w->child, sigs[i]); /* forwarded */
        else
          w->cin_eof = 1; /* no child: the gateway winds down */
        if (sigs[i] != SIGCHLD && w->front) w->cin_eof = 1;
      }
    }
    if (pf[1].revents & POLLIN) {
      ssize_t k = read(w->wake[0], buf, sizeof buf);
      (void)k;
    }
    if (w->front) from_http_clients(w);
    if (w->up) from_http_server(w);
    if (is >= 0 && pf[is].revents) {
      ssize_t k = read(w->from_srv, buf, sizeof buf);
      if (k > 0) {
        if (mcp_lines_feed(&w->sin, buf, (size_t)k, on_server_line, w))
          gw_oom();
      } else if (k == 0 || (errno != EAGAIN && errno != EINTR)) {
        server_closed(w);
      }
    }
    if (ic >= 0 && pf[ic].revents) {
      ssize_t k = read(0, buf, sizeof buf);
      if (k > 0) {
        if (mcp_lines_feed(&w->cin, buf, (size_t)k, on_client_line, w))
          gw_oom();
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

/* prefix and 16 random hex digits, for names no other run will draw. */
static void random_name(const char *prefix, char *buf, size_t n) {
  unsigned char r[8] = {0};
  FILE *f = fopen("/dev/urandom", "rb");
  if (!f || fread(r, 1, sizeof r, f) != sizeof r) {
    long long t = cli_mono_ms() ^ ((long long)getpid() << 20);
    memcpy(r, &t, sizeof r);
  }
  if (f) fclose(f);
  snprintf(buf, n, "%s%02x%02x%02x%02x%02x%02x%02x%02x", prefix, r[0], r[1],
           r[2], r[3], r[4], r[5], r[6], r[7]);
}

static int exit_status(const gw *w) {
  if (!w->child_done) return EXIT_FAIL;
  if (WIFEXITED(w->child_status)) return WEXITSTATUS(w->child_status);
  if (w->we_killed) /* stopped after the client left, or broken */
    return w->output_closed ? EXIT_FAIL : EXIT_OK;
  if (WIFSIGNALED(w->child_status)) return 128 + WTERMSIG(w->child_status);
  return EXIT_FAIL;
}

static void free_headers(char **h, int n) {
  for (int i = 0; i < n; i++) {
    if (h[i]) memset(h[i], 0, strlen(h[i])); /* a credential, gone */
    free(h[i]);
  }
  free(h);
}

/*
** --header 'Name: value' filled: "{$env:NAME}" in the value is the
** environment variable NAME (the policy's template syntax).  The value is
** a credential as often as not: no message says it, only its name.  0, or
** an exit status after one error line.
*/
static int fill_header(const char *arg, char **out) {
  const char *colon = strchr(arg, ':'), *p;
  cli_outbuf b;
  size_t nl = colon ? (size_t)(colon - arg) : 0;
  *out = NULL;
  for (size_t i = 0; i < nl; i++)
    if (!strchr("!#$%&'*+-.^_`|~", arg[i]) &&
        !(arg[i] >= '0' && arg[i] <= '9') &&
        !((arg[i] | 32) >= 'a' && (arg[i] | 32) <= 'z'))
      nl = 0;
  if (!nl)
    return cli_usage("mcp", "--header is 'Name: value' with a header name "
                            "before the colon");
  cli_outbuf_init(&b, (size_t)64 << 10);
  if (cli_outbuf_put(&b, arg, nl) || cli_outbuf_str(&b, ": ")) gw_oom();
  for (p = colon + 1; *p == ' ' || *p == '\t'; p++) {
  }
  while (*p) {
    const char *open = strstr(p, "{$env:"), *close;
    if (!open) {
      if (cli_outbuf_str(&b, p)) gw_oom();
      break;
    }
    if (cli_outbuf_put(&b, p, (size_t)(open - p))) gw_oom();
    if (!(close = strchr(open, '}'))) {
      cli_outbuf_free(&b);
      return cli_usage("mcp", "--header %.*s: a {$env: without its }",
                       (int)nl, arg);
    }
    {
      char var[256];
      const char *v;
      snprintf(var, sizeof var, "%.*s", (int)(close - open - 6), open + 6);
      if (!(v = getenv(var))) {
        cli_outbuf_free(&b);
        cli_err("--header %.*s: the environment variable %s is not set",
                (int)nl, arg, var);
        return EXIT_USAGE;
      }
      if (cli_outbuf_str(&b, v)) gw_oom();
    }
    p = close + 1;
  }
  for (size_t i = nl; i < b.len; i++)
    if ((unsigned char)b.p[i] < 0x20 && b.p[i] != '\t') {
      memset(b.p, 0, b.len);
      cli_outbuf_free(&b);
      cli_err("--header %.*s: its value has a control character (a line "
              "break?); refused",
              (int)nl, arg);
      return EXIT_USAGE;
    }
  *out = b.p;
  return 0;
}

int cmd_mcp(int argc, char **argv) {
  static const struct option opts[] = {
      {"policy", required_argument, NULL, 'p'},
      {"log", required_argument, NULL, 'L'},
      {"session", required_argument, NULL, 's'},
      {"max-message", required_argument, NULL, 'm'},
      {"console", required_argument, NULL, 'c'},
      {"listen", required_argument, NULL, 'l'},
      {"header", required_argument, NULL, 'H'},
      {"public-url", required_argument, NULL, 'P'},
      {"caller-header", required_argument, NULL, 'C'},
      {"call-id-meta", required_argument, NULL, 'i'},
      {"allow-origin", required_argument, NULL, 'o'},
      {"max-connections", required_argument, NULL, 'n'},
      {"request-timeout", required_argument, NULL, 'T'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *policy_path = NULL, *log = NULL, *session = NULL;
  const char *console = NULL, *listen = NULL, *public_url = NULL;
  const char *caller_header = NULL, *upstream_url = NULL;
  const char **id_keys = NULL, **origins = NULL;
  char **headers = NULL;
  int nid_keys = 0, norigins = 0, nheaders = 0, own_auth = 0;
  size_t max_conns = 1024, request_s = 30;
  serve *con = NULL;
  char sessbuf[64];
  size_t max_message = DEFAULT_MAX_MESSAGE;
  gw *w;
  int ch, rc, code = EXIT_FAIL, stdout_flags;
  struct sigaction sa;

  for (int i = 1; i < argc && strcmp(argv[i], "--") != 0; i++)
    if (strcmp(argv[i], "--suggest-policy") == 0) /* suggest.c */
      return mcp_suggest(argc, argv);
  while ((ch = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': policy_path = optarg; break;
    case 'L': log = optarg; break;
    case 's': session = optarg; break;
    case 'c': console = optarg; break;
    case 'l': listen = optarg; break;
    case 'P': public_url = optarg; break;
    case 'C': caller_header = optarg; break;
    case 'i':
      if (!(id_keys = realloc(id_keys, sizeof *id_keys * (size_t)(nid_keys + 1))))
        gw_oom();
      id_keys[nid_keys++] = optarg;
      break;
    case 'o':
      if (!(origins = realloc(origins, sizeof *origins * (size_t)(norigins + 1))))
        gw_oom();
      origins[norigins++] = optarg;
      break;
    case 'H': {
      char *h = NULL;
      int rc2 = fill_header(optarg, &h);
      if (rc2) {
        free_headers(headers, nheaders);
        return rc2;
      }
      /* its text leaves argv: ps shows no credential */
      memset(optarg, 'x', strlen(optarg));
      if (!(headers = realloc(headers, sizeof *headers * (size_t)(nheaders + 1))))
        gw_oom();
      headers[nheaders++] = h;
      if (!strncasecmp(h, "authorization:", 14)) own_auth = 1;
      break;
    }
    case 'n':
      if (cli_parse_size("--max-connections", optarg, 1, 100000, &max_conns))
        return EXIT_USAGE;
      break;
    case 'T':
      if (cli_parse_size("--request-timeout", optarg, 1, 3600, &request_s))
        return EXIT_USAGE;
      break;
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
  if (!strncmp(argv[optind], "http://", 7) ||
      !strncmp(argv[optind], "https://", 8)) {
    if (optind + 1 < argc)
      return cli_usage("mcp", "an upstream URL takes no arguments after it "
                              "(%s)", argv[optind + 1]);
    upstream_url = argv[optind];
  } else if (nheaders) {
    return cli_usage("mcp", "--header is for an HTTP upstream (a URL after "
                            "--), not a command");
  }
  if (public_url && (!listen || !upstream_url))
    return cli_usage("mcp", "--public-url needs --listen and an upstream URL");
  if ((caller_header || norigins) && !listen)
    return cli_usage("mcp", "--caller-header and --allow-origin are for "
                            "--listen");
  if (session && !*session) return cli_usage("mcp", "--session is empty");
  if (!session) session = getenv("IDEM_SESSION");
  if (!session || !*session) {
    random_name("mcp-", sessbuf, sizeof sessbuf);
    session = sessbuf;
    cli_err("no --session or IDEM_SESSION: calls without _meta "
            "\"io.idem/session\" use session %s, which a restart does not "
            "keep",
            session);
  }
  if (!(w = calloc(1, sizeof *w))) gw_oom();
  w->session = session;
  w->rel_sid = "";
  w->max_message = max_message;
  random_name("", w->nonce, sizeof w->nonce);
  rc = idem_policy_load(policy_path, &w->policy);
  if (rc) {
    cli_err("%s: %s", policy_path,
            w->policy ? idem_policy_errmsg(w->policy) : "out of memory");
    code = rc == IDEM_POLICY ? EXIT_DATA : EXIT_FAIL;
    goto out;
  }
  for (size_t i = 0; idem_policy_warning(w->policy, i); i++)
    cli_err("%s: warning: %s", policy_path, idem_policy_warning(w->policy, i));
  if ((rc = guarding_policy(policy_path, &w->gpolicy))) {
    cli_err("%s: %s", policy_path,
            w->gpolicy ? idem_policy_errmsg(w->gpolicy) : "cannot be read");
    goto out;
  }
  if (!(w->learned = json_object()) || !(w->weakened = json_object()))
    gw_oom();
  mcp_lines_init(&w->cin, max_message);
  mcp_lines_init(&w->sin, max_message);
  cli_outbuf_init(&w->cout, (size_t)1 << 40);
  cli_outbuf_init(&w->sout, (size_t)1 << 40);
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
  /* the log first: a bad --log is one error line, and nothing spawned */
  if (idem_guard_open(log, w->policy, &w->g_user) ||
      idem_guard_open(log, w->gpolicy, &w->g_guarded)) {
    cli_err("%s", idem_guard_errmsg(w->g_guarded ? w->g_guarded : w->g_user));
    goto out;
  }
  if (console) { /* the console in this process: its /metrics are ours */
    serve_options o = {log, policy_path, console, 0};
    int usage;
    if (!(con = serve_start(&o, &usage))) {
      code = usage ? EXIT_USAGE : EXIT_FAIL;
      goto out;
    }
    serve_announce(con, stderr);
  }
  w->id_keys = id_keys;
  w->nid_keys = nid_keys;
  if (upstream_url) {
    up_opts uo = {.url = upstream_url,
                  .headers = headers,
                  .nheaders = nheaders,
                  .own_auth = own_auth,
                  .max_message = max_message,
                  .nonce = w->nonce,
                  .wake_fd = w->wake[1]};
    char err[300];
    if (!(w->up = up_start(&uo, err, sizeof err))) {
      cli_err("%s", err);
      goto out;
    }
    w->to_srv = w->from_srv = -1;
  } else if ((rc = spawn(w, argv + optind))) {
    cli_err("cannot run %s: %s", argv[optind], strerror(rc));
    goto out;
  } else {
    /* an attempt runs in the server's process group as well as here: once
    ** this process and that group are gone, none can land (SPEC §6a) */
    idem_guard_set(w->g_guarded, IDEM_GUARD_SHARED_PGID, (long long)w->child);
    idem_guard_set(w->g_user, IDEM_GUARD_SHARED_PGID, (long long)w->child);
  }
  if (listen) {
    const char *token = getenv("IDEM_MCP_TOKEN");
    char loop_addr[64];
    if (!strchr(listen, ':')) { /* a port alone: on loopback */
      snprintf(loop_addr, sizeof loop_addr, "127.0.0.1:%.20s", listen);
      listen = loop_addr;
    }
    front_opts fo = {.listen = listen,
                     .max_body = max_message,
                     .max_connections = (int)max_conns,
                     .request_s = (int)request_s,
                     .origins = origins,
                     .norigins = norigins,
                     .caller_header = caller_header,
                     .token = token && *token ? token : NULL,
                     .pass_auth = !own_auth,
                     .public_url = public_url,
                     .upstream_url = upstream_url,
                     .nonce = w->nonce,
                     .wake_fd = w->wake[1]};
    if (!(w->front = front_start(&fo))) goto out;
    fprintf(stderr, "idem mcp: listening on %s\n", front_url(w->front));
    fflush(stderr);
  }
  pthread_mutex_init(&w->mu, NULL);
  pthread_cond_init(&w->cv, NULL);
  for (w->nth = 0; w->nth < WORKERS; w->nth++)
    if (pthread_create(&w->th[w->nth], NULL, gw_worker, w)) break;
  if (!w->nth) {
    cli_err("cannot start a thread");
    if (w->child) {
      kill(w->child, SIGTERM);
      waitpid(w->child, NULL, 0);
    }
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
      if (w->buckets[i]->kind == P_LATE) gw_gcall_free(w->buckets[i]->c);
      gw_pend_remove(w, w->buckets[i]);
    }
  while (w->live) {
    gcall *c = w->live;
    gw_live_remove(w, c);
    gw_gcall_free(c);
  }
  gw_settle(w, 1);
  pthread_mutex_destroy(&w->mu);
  pthread_cond_destroy(&w->cv);
out:
  front_stop(w->front);
  up_free(w->up);
  free_headers(headers, nheaders);
  free(id_keys);
  free(origins);
  serve_stop(con);
  the_gw = NULL;
  mcp_lines_free(&w->cin);
  mcp_lines_free(&w->sin);
  cli_outbuf_free(&w->cout);
  cli_outbuf_free(&w->sout);
  json_decref(w->learned);
  json_decref(w->weakened);
  idem_guard_close(w->g_user);
  idem_guard_close(w->g_guarded);
  idem_policy_free(w->policy);
  idem_policy_free(w->gpolicy);
  free(w);
  return code;
}

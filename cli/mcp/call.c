/*
** call.c - guarded tools/call in `idem mcp` (SPEC §10): each call walks
** the guard's two-phase API (include/idem.h).  While other guarded calls
** are in flight, every step that touches the attempt log runs as a job on
** a worker thread; a lone call's steps run on the loop itself (step()).
** Either way the loop (gateway.c) then asks the step what next: EXECUTE
** sends the call to the server and arms its deadline, CHECK calls the
** status tool (or runs the status command on a worker), WAIT arms a timer,
** ANSWER marks it delivered - only while the client is there (its input
** not at EOF, our output open) - then writes the client's tool result; a
** delivery whose write fails is undone (gw_hold, gw_settle).  One call
** has at most one job or one server request outstanding, so a step is only
** ever used by one thread at a time.
*/
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "gw.h"

void gw_gcall_free(gcall *c) {
  if (!c) return;
  idem_step_free(c->s);
  free(c->cid);
  json_decref(c->cidv);
  free(c->session);
  free(c->call_id);
  free(c->tool);
  free(c->turn);
  free(c->args);
  json_decref(c->meta);
  gw_who_unref(c->who);
  free(c->result);
  free(c->error);
  free(c->fresh_text);
  free(c);
}

void gw_hold(gw *w, gcall *c) {
  c->out_end = w->cout_out + w->cout.len;
  if (w->front) front_pin(w->front, c->who ? c->who->frid : 0);
  c->hnext = w->held;
  w->held = c;
}

void gw_settle(gw *w, int at_end) {
  gcall **pc = &w->held;
  while (*pc) {
    gcall *c = *pc;
    int lost = w->cout_dead || (at_end && c->out_end > w->cout_out);
    if (w->front) { /* the front says when its answer was written */
      int told = front_told(w->front, c->who ? c->who->frid : 0, at_end);
      lost = told < 0;
      if (!told) {
        pc = &c->hnext;
        continue;
      }
    } else if (!lost && c->out_end > w->cout_out) {
      pc = &c->hnext;
      continue;
    }
    *pc = c->hnext;
    if (lost && idem_step_undelivered(c->s) != IDEM_OK)
      cli_err("undoing the delivery of %s/%s: %s; it counts as told",
              c->session, c->call_id, idem_guard_errmsg(c->g));
    gw_gcall_free(c);
  }
}

static void run_job(gcall *c) {
  int rc = IDEM_OK;
  switch (c->job) {
  case J_BEGIN: {
    idem_call call = {sizeof call, c->session,  c->call_id, c->tool,
                      c->args,     c->args_len, c->turn, 0};
    rc = idem_guard_begin(c->g, &call, &c->s);
    break;
  }
  case J_FINISH:
    /* the server answered: the attempt ended (settle_ms counts from now);
    ** the outcome says whether that is a verdict */
    if (c->ended) rc = idem_step_attempt_ended(c->s);
    if (!rc)
      rc = idem_step_finish(c->s, c->outcome, c->result, c->result_len,
                            c->error);
    break;
  case J_RESOLVE:
    rc = idem_step_resolve(c->s, c->outcome, c->result, c->result_len);
    break;
  case J_POLL: rc = idem_step_poll(c->s); break;
  case J_DELIVER:
    if (c->stamp) rc = idem_step_delivered(c->s);
    break;
  case J_CMD: {
    /* the policy's status command (as for idem exec), then its verdict */
    char *out = NULL;
    size_t len = 0;
    int outcome = cli_status_check(c->s, idem_step_check_command(c->s),
                                   c->session, c->call_id, c->tool, &out, &len);
    c->checked = outcome == IDEM_OUTCOME_APPLIED;
    rc = idem_step_resolve(c->s, outcome, out, out ? len : 0);
    free(out);
    break;
  }
  case J_LATE:
    rc = idem_guard_late(c->g, c->session, c->call_id, c->token, c->outcome,
                         c->result, c->result_len, c->error, c->ended);
    break;
  }
  c->rc = rc;
  if (rc) snprintf(c->errmsg, sizeof c->errmsg, "%s", idem_guard_errmsg(c->g));
}

void *gw_worker(void *arg) {
  gw *w = arg;
  pthread_mutex_lock(&w->mu);
  for (;;) {
    gcall *c;
    while (!w->qhead && !w->stop) pthread_cond_wait(&w->cv, &w->mu);
    if (!w->qhead) break;
    c = w->qhead;
    w->qhead = c->qnext;
    if (!w->qhead) w->qtail = NULL;
    w->busy++; /* neither queued nor done: still the loop's to wait for */
    pthread_mutex_unlock(&w->mu);
    run_job(c);
    pthread_mutex_lock(&w->mu);
    w->busy--;
    c->qnext = w->done;
    w->done = c;
    if (write(w->wake[1], "j", 1) < 0) { /* the pipe is full: already woken */
    }
  }
  pthread_mutex_unlock(&w->mu);
  return NULL;
}

void gw_submit(gw *w, gcall *c, int job) {
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

/*
** Take a call's next log step.  A lone call (no other guarded call in
** flight) runs it on the loop itself: the store finds the log idle and
** commits at once, and the call saves two thread hand-overs per step (a
** wake-up of a worker and one of the loop, each as dear as a commit on a
** virtual machine).  With company, steps go to the workers, so begins share
** their syncs (group commit) and the loop stays free for the other calls.
** A status command (it blocks) and a late result always go to a worker.
** c may be freed when this returns.
*/
static void step(gw *w, gcall *c, int job) {
  if (w->nlive > 1 || job == J_CMD || job == J_LATE) {
    gw_submit(w, c, job);
    return;
  }
  c->job = job;
  run_job(c);
  gw_job_done(w, c);
}

void gw_set_input(gcall *c, int outcome, const char *result, size_t len,
                  const char *error) {
  free(c->result);
  free(c->error);
  c->result = result ? gw_dupn(result, len) : NULL;
  c->result_len = result ? len : 0;
  c->error = error ? gw_dupn(error, strlen(error)) : NULL;
  c->outcome = outcome;
  c->ended = 0;
}

void gw_live_add(gw *w, gcall *c) {
  c->next = w->live;
  c->prev = NULL;
  if (w->live) w->live->prev = c;
  w->live = c;
  w->nlive++;
}

void gw_live_remove(gw *w, gcall *c) {
  if (c->prev)
    c->prev->next = c->next;
  else
    w->live = c->next;
  if (c->next) c->next->prev = c->prev;
  w->nlive--;
}

static void put_json_string(cli_outbuf *b, const char *s) {
  json_t *v = json_string(s);
  char *d = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT) : NULL;
  if (!d || cli_outbuf_str(b, d)) gw_oom();
  free(d);
  json_decref(v);
}

/* Send tools/call name(args) with _meta to the server as request gid. */
static void send_call(gw *w, gw_who *who, long long gid, const char *tool,
                      const char *args, size_t alen, const json_t *meta) {
  gw_who *was = w->who;
  cli_outbuf m;
  char head[96];
  cli_outbuf_init(&m, (size_t)-1);
  snprintf(head, sizeof head,
           "{\"jsonrpc\":\"2.0\",\"id\":%lld,\"method\":\"tools/call\","
           "\"params\":{\"name\":",
           gid);
  if (cli_outbuf_str(&m, head)) gw_oom();
  put_json_string(&m, tool);
  if (cli_outbuf_str(&m, ",\"arguments\":") || cli_outbuf_put(&m, args, alen))
    gw_oom();
  if (meta) {
    char *d = json_dumps(meta, JSON_COMPACT);
    if (!d || cli_outbuf_str(&m, ",\"_meta\":") || cli_outbuf_str(&m, d))
      gw_oom();
    free(d);
  }
  if (cli_outbuf_str(&m, "}}\n")) gw_oom();
  w->who = who; /* on its caller's behalf (HTTP: its session, credential) */
  gw_to_server(w, m.p, m.len);
  w->who = was;
  cli_outbuf_free(&m);
}

static void send_exec(gw *w, gcall *c) {
  size_t alen;
  const char *args = idem_step_args(c->s, &alen);
  json_t *meta = json_deep_copy(c->meta);
  pend *p;
  if (gw_server_gone(w)) {
    /* a verdict: this attempt certainly never reached the server */
    char why[160];
    snprintf(why, sizeof why, "%s; the call was not sent", gw_gone_why(w));
    json_decref(meta);
    gw_set_input(c, IDEM_OUTCOME_NOT_APPLIED, NULL, 0, why);
    step(w, c, J_FINISH);
    return;
  }
  if (!meta || json_object_set_new(meta, "io.idem/key",
                                   json_string(idem_step_key(c->s))))
    gw_oom();
  p = gw_pend_add(w, P_EXEC);
  p->c = c;
  c->gid = p->gid;
  c->token = idem_step_token(c->s);
  c->fresh = 0;
  send_call(w, c->who, p->gid, c->tool, args, alen, meta);
  json_decref(meta);
  c->timer = T_DEADLINE;
  c->due = cli_mono_ms() + idem_step_deadline_ms(c->s);
}

static void send_check(gw *w, gcall *c) {
  const char *tool = idem_step_check_tool(c->s);
  size_t alen;
  const char *args = idem_step_check_args(c->s, &alen);
  pend *p;
  c->checked = 0;
  if (!tool && idem_step_check_command(c->s)) {
    gw_submit(w, c, J_CMD); /* a shell command: on a worker, it blocks */
    return;
  }
  if (!tool || gw_server_gone(w)) {
    gw_set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
    step(w, c, J_RESOLVE);
    return;
  }
  p = gw_pend_add(w, P_CHECK);
  p->c = c;
  c->gid = p->gid;
  send_call(w, c->who, p->gid, tool, args ? args : "{}", args ? alen : 2,
            NULL);
  c->timer = T_DEADLINE;
  c->due = cli_mono_ms() + idem_step_deadline_ms(c->s);
}

/* The envelope as a tool result: isError, structuredContent, the message. */
static void put_envelope_result(cli_outbuf *b, const char *env, size_t elen,
                                const char *message, const char *status,
                                int replayed, int is_error) {
  if (cli_outbuf_str(b, "{\"content\":[{\"type\":\"text\",\"text\":")) gw_oom();
  put_json_string(b, message ? message : status);
  if (cli_outbuf_str(b, "}],\"structuredContent\":") ||
      cli_outbuf_put(b, env, elen) ||
      cli_outbuf_str(b,
                     is_error ? ",\"isError\":true" : ",\"isError\":false") ||
      cli_outbuf_str(b, ",\"_meta\":{\"io.idem/status\":"))
    gw_oom();
  put_json_string(b, status);
  if (cli_outbuf_str(b, replayed ? ",\"io.idem/replayed\":true}}"
                                 : ",\"io.idem/replayed\":false}}"))
    gw_oom();
}

/* Append the tool result text res with item added at the end of its
** "content" array (its other bytes unchanged); -1 when it has none. */
static int put_with_item(cli_outbuf *b, const char *res, size_t len,
                         const char *item) {
  size_t vs, ve, i;
  if (mcp_member(res, len, "content", &vs, &ve) != 1 || ve - vs < 2 ||
      res[vs] != '[' || res[ve - 1] != ']')
    return -1;
  for (i = ve - 1; i > vs + 1 && strchr(" \t\r\n", res[i - 1]); i--) {
  }
  return cli_outbuf_put(b, res, ve - 1) ||
                 (i > vs + 1 && cli_outbuf_put(b, ",", 1)) ||
                 cli_outbuf_str(b, item) ||
                 cli_outbuf_put(b, res + ve - 1, len - (ve - 1))
             ? -1
             : 0;
}

/* A text content item, as JSON text (to be freed). */
static char *text_item(const char *text) {
  json_t *v = json_pack("{ssss}", "type", "text", "text", text);
  char *d = v ? json_dumps(v, JSON_COMPACT) : NULL;
  if (!d) gw_oom();
  json_decref(v);
  return d;
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
  char note[600];
  cli_outbuf b;
  if (!status) status = idem_answer_name(a);
  note[0] = '\0';
  if (a == IDEM_ANSWER_SUCCEEDED && c->checked) {
    /* the model gets the status check's result, not the tool's: say in
    ** words what happened, or it may take the call for unanswered */
    const char *how = idem_step_check_tool(c->s);
    snprintf(note, sizeof note,
             "The %s call went through (a status check%s%s found it "
             "applied); the check's result is included. Do not call %s "
             "again for this.",
             c->tool, how ? " with " : "", how ? how : "", c->tool);
    if (!message) message = note;
  }
  cli_outbuf_init(&b, (size_t)-1);
  if (cli_outbuf_str(&b, "{\"jsonrpc\":\"2.0\",\"id\":") ||
      cli_outbuf_put(&b, c->cid, c->cidlen))
    gw_oom();
  if (!replayed && c->fresh &&
      ((a == IDEM_ANSWER_SUCCEEDED && c->fresh == IDEM_OUTCOME_APPLIED) ||
       (a == IDEM_ANSWER_FAILED && c->fresh == IDEM_OUTCOME_REJECTED))) {
    /* the server's own answer to this very call, unchanged */
    if (cli_outbuf_str(&b,
                       c->fresh_is_error ? ",\"error\":" : ",\"result\":") ||
        cli_outbuf_put(&b, c->fresh_text, c->fresh_len))
      gw_oom();
  } else if (has_result &&
             (a == IDEM_ANSWER_SUCCEEDED || a == IDEM_ANSWER_ALREADY_APPLIED ||
              a == IDEM_ANSWER_FAILED)) {
    /* the recorded result, marked */
    json_t *add = json_pack("{sbss}", "io.idem/replayed",
                            replayed || a == IDEM_ANSWER_ALREADY_APPLIED,
                            "io.idem/status", status);
    if (!add) gw_oom();
    if (dup) json_object_set_new(add, "io.idem/duplicate_of", json_string(dup));
    if (message)
      json_object_set_new(add, "io.idem/message", json_string(message));
    if (cli_outbuf_str(&b, ",\"result\":")) gw_oom();
    if (json_is_array(
            json_object_get(json_object_get(e, "result"), "content"))) {
      /* the recorded result; a reconciled one with the words added as
      ** its last content item */
      cli_outbuf r;
      char *item = note[0] ? text_item(note) : NULL;
      cli_outbuf_init(&r, (size_t)-1);
      if (item && put_with_item(&r, env + rs, re - rs, item)) r.len = 0;
      if (r.len ? mcp_put_with_meta(&b, r.p, r.len, add)
                : mcp_put_with_meta(&b, env + rs, re - rs, add))
        gw_oom();
      cli_outbuf_free(&r);
      free(item);
    } else {
      /* not a tool result (a status command's output): its JSON as text */
      char *d = json_dumps(add, JSON_COMPACT), *t = gw_dupn(env + rs, re - rs);
      if (!d || !t ||
          cli_outbuf_str(&b, "{\"content\":[{\"type\":\"text\",\"text\":"))
        gw_oom();
      put_json_string(&b, t);
      if (cli_outbuf_str(&b, "}")) gw_oom();
      if (note[0]) {
        char *item = text_item(note);
        if (cli_outbuf_str(&b, ",") || cli_outbuf_str(&b, item)) gw_oom();
        free(item);
      }
      if (cli_outbuf_str(&b, "],\"_meta\":") || cli_outbuf_str(&b, d) ||
          cli_outbuf_str(&b, "}"))
        gw_oom();
      free(d);
      free(t);
    }
    json_decref(add);
  } else {
    if (cli_outbuf_str(&b, ",\"result\":")) gw_oom();
    put_envelope_result(&b, env, elen, message, status, replayed,
                        a != IDEM_ANSWER_SUCCEEDED &&
                            a != IDEM_ANSWER_ALREADY_APPLIED);
  }
  if (cli_outbuf_str(&b, "}\n")) gw_oom();
  gw_to_client(w, b.p, b.len);
  cli_outbuf_free(&b);
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
      c->due = cli_mono_ms() + d;
    } else {
      send_exec(w, c);
    }
    break;
  }
  case IDEM_NEXT_CHECK: send_check(w, c); break;
  case IDEM_NEXT_WAIT:
    c->timer = T_WAIT;
    c->due = cli_mono_ms() + idem_step_delay_ms(c->s);
    break;
  case IDEM_NEXT_ANSWER:
    /* the log says "told" before the client can read the answer (it is
    ** written when the job is done): a call the client sends the moment it
    ** has read it is a new decision, and must not find it untold.  Not for
    ** a client that is gone - its input at EOF, its end of our output
    ** closed: an answer nobody reads tells the model nothing */
    if (w->front) { /* an HTTP client: its own connection */
      c->deliver = !c->cancelled && c->who &&
                   front_alive(w->front, c->who->frid);
      c->stamp = c->deliver;
    } else {
      c->deliver = !c->cancelled && !w->cout_dead;
      c->stamp = c->deliver && !w->cin_eof && !cli_reader_gone(1);
    }
    step(w, c, J_DELIVER);
    break;
  default:
    gw_client_error(w, c->cid, c->cidlen, -32603,
                    "idem: the guard is confused");
    step(w, c, J_DELIVER);
  }
}

void gw_job_done(gw *w, gcall *c) {
  if (c->job == J_DELIVER || c->job == J_LATE) {
    if (c->rc)
      cli_err("recording %s of %s/%s: %s",
              c->job == J_LATE ? "a late result" : "the delivery", c->session,
              c->call_id, c->errmsg);
    if (c->job == J_DELIVER) {
      /* the answer stands even when its delivery could not be recorded:
      ** the fence is then only more careful with a repeat.  One recorded
      ** told is held until it is written: a failed write undoes it */
      int hold = c->stamp && !c->rc && c->deliver && !w->cout_dead;
      if (c->deliver && !w->cout_dead) answer(w, c);
      gw_live_remove(w, c);
      if (hold) gw_hold(w, c);
      gw_flush(w);
      gw_settle(w, 0);
      if (hold) return;
    }
    gw_gcall_free(c);
    return;
  }
  if (c->rc) {
    /* the log failed, and the client is told: before a downstream call
    ** (an outcome the log could not record is an answer of the guard) */
    if (!c->cancelled)
      gw_client_error(w, c->cid, c->cidlen, -32603, "idem: %s%s", c->errmsg,
                      c->job == J_BEGIN ? "; the tool was not called" : "");
    cli_err("%s (session %s, call %s)", c->errmsg, c->session, c->call_id);
    gw_live_remove(w, c);
    gw_gcall_free(c);
    return;
  }
  advance(w, c);
}

/* The raw text of member name of params (its span in line), or NULL. */
static const char *params_member(const char *line, size_t len, const char *name,
                                 size_t *n) {
  size_t ps, pe, vs, ve;
  if (mcp_member(line, len, "params", &ps, &pe) != 1) return NULL;
  if (mcp_member(line + ps, pe - ps, name, &vs, &ve) != 1) return NULL;
  *n = ve - vs;
  return line + ps + vs;
}

/*
** The session or call id that _meta member name gives (SPEC §10): a
** non-empty string as is, an integer as its decimal text, as sent.  0 with
** *out NULL when absent; -1 with the reason in why when it is there but
** names nothing (empty, or not a string or an integer): a call is never
** quietly given another identity than the one its harness meant.
*/
static int meta_id(const char *line, size_t len, const json_t *meta,
                   const char *name, char **out, char *why, size_t n) {
  const json_t *v = json_object_get(meta, name);
  size_t ml, vs, ve;
  const char *mt;
  *out = NULL;
  if (!v) return 0;
  if (json_is_string(v)) {
    if (!json_string_length(v)) {
      snprintf(why, n,
               "_meta \"%s\" is empty; give the %s, or leave it out", name,
               !strcmp(name, "io.idem/session") ? "harness's session id"
               : !strcmp(name, "io.idem/turn")  ? "model turn's id"
                                                : "model's tool-call id");
      return -1;
    }
    if (!(*out = gw_dupn(json_string_value(v), json_string_length(v))))
      gw_oom();
    return 0;
  }
  if (json_is_number(v)) {
    /* the number's own text (jansson read it as a double) */
    mt = params_member(line, len, "_meta", &ml);
    if (mt && mcp_member(mt, ml, name, &vs, &ve) == 1) {
      size_t i = vs + (mt[vs] == '-');
      while (i < ve && mt[i] >= '0' && mt[i] <= '9') i++;
      if (i == ve && ve > vs + (mt[vs] == '-')) {
        if (!(*out = gw_dupn(mt + vs, ve - vs))) gw_oom();
        return 0;
      }
    } else {
      double d = json_number_value(v);
      if (d == (double)(long long)d && d > -9e15 && d < 9e15) {
        char num[32];
        snprintf(num, sizeof num, "%lld", (long long)d);
        if (!(*out = gw_dupn(num, strlen(num)))) gw_oom();
        return 0;
      }
    }
  }
  snprintf(why, n,
           "_meta \"%s\" must be a non-empty string or an integer, not %s",
           name, json_is_number(v) ? "a fraction" : mcp_json_kind(v));
  return -1;
}

/* The JSON-RPC id of c as its client sent it (over HTTP the front gave
** the request a number of its own). */
static char *client_id(const gcall *c) {
  if (c->who && c->who->id) return gw_dupn(c->who->id, strlen(c->who->id));
  return gw_dupn(c->cid, c->cidlen);
}

/*
** Who c is (SPEC §10, §10b): its call id, session and turn, from what the
** client sent.  The call id is _meta "io.idem/call_id", else the client's
** own tool-call id (Claude Code's "claudecode/toolUseId", and the keys of
** --call-id-meta), else the JSON-RPC id scoped to the client's MCP
** session (over HTTP) or to this gateway process (stdio): ids restart at
** 1 in every client, so an id alone names no action beyond its
** connection, and a stateless request's names nothing beyond itself.  The
** session is _meta "io.idem/session", else the client's Mcp-Session-Id at
** idem, else --session; the turn is "io.idem/turn", else a client's own
** turn id (Codex's "x-codex-turn-metadata" turn_id).  Over HTTP a caller
** who presented a credential has its session scoped by its digest: two
** callers that say the same session and call id are two actions.
** 0, or -1 with why: a member that is there but names nothing.
*/
static int identify(gw *w, gcall *c, const char *line, size_t len,
                    const json_t *meta, char *why, size_t n) {
  char *sess = NULL;
  if (meta_id(line, len, meta, "io.idem/session", &sess, why, n) ||
      meta_id(line, len, meta, "io.idem/call_id", &c->call_id, why, n) ||
      meta_id(line, len, meta, "io.idem/turn", &c->turn, why, n)) {
    free(sess);
    return -1;
  }
  if (!c->call_id && meta_id(line, len, meta, "claudecode/toolUseId",
                             &c->call_id, why, n)) {
    free(sess);
    return -1;
  }
  for (int i = 0; !c->call_id && i < w->nid_keys; i++)
    if (meta_id(line, len, meta, w->id_keys[i], &c->call_id, why, n)) {
      free(sess);
      return -1;
    }
  if (!c->turn) {
    const json_t *t = json_object_get(meta, "x-codex-turn-metadata");
    json_t *parsed = NULL;
    const char *id;
    if (json_is_string(t)) /* sent as JSON text, or as an object */
      t = parsed = json_loads(json_string_value(t), 0, NULL);
    id = json_string_value(json_object_get(t, "turn_id"));
    if (id && *id) c->turn = gw_dupn(id, strlen(id));
    json_decref(parsed);
  }
  if (!sess) {
    const char *s = c->who && c->who->sid ? c->who->sid : w->session;
    sess = gw_dupn(s, strlen(s));
  }
  if (c->who && c->who->caller[0]) {
    size_t k = strlen(sess) + 48;
    char *scoped = malloc(k);
    if (!scoped) gw_oom();
    snprintf(scoped, k, "caller:%s/%s", c->who->caller, sess);
    free(sess);
    sess = scoped;
  }
  c->session = sess;
  if (!c->call_id) {
    char *id = client_id(c);
    const char *scope = c->who ? c->who->scope : w->nonce;
    size_t k = strlen(scope) + strlen(id) + 16;
    if ((c->call_id = malloc(k)))
      snprintf(c->call_id, k, "jsonrpc:%s:%s", scope, id);
    free(id);
  }
  return 0;
}

void gw_handle_call(gw *w, const char *line, size_t len, const mcp_msg *m) {
  const char *tool = json_string_value(json_object_get(m->params, "name"));
  json_t *meta = json_object_get(m->params, "_meta");
  const char *args;
  char why[200];
  size_t alen = 0;
  int cls;
  gcall *c;
  if (!tool || !*tool) {
    /* no tool to class, key or record: passed on, it would reach the
    ** server unguarded (a server that looks its handler up by whatever
    ** name it is given may act on it), so it stops here */
    const json_t *name = json_object_get(m->params, "name");
    const char *what = !m->params             ? "the call has no params"
                       : json_is_string(name) ? "params.name is empty"
                                              : NULL;
    char kind[64];
    if (!what) {
      snprintf(kind, sizeof kind, "params.name is %s", mcp_json_kind(name));
      what = kind;
    }
    gw_client_error(w, line + m->id_s, m->id_e - m->id_s, -32602,
                    "Invalid params: idem: a tools/call needs params.name, "
                    "the tool's name as a non-empty string, and %s; the tool "
                    "was not called",
                    what);
    cli_err("a tools/call was refused: %s (a tool's name must be a "
            "non-empty string); nothing was sent to the server",
            what);
    return;
  }
  cls = gw_tool_class(w, tool);
  if (cls == IDEM_CLASS_READ_ONLY || cls == IDEM_CLASS_IDEMPOTENT) {
    gw_forward_request(w, line, len, m);
    return;
  }
  if (!(c = calloc(1, sizeof *c))) gw_oom();
  c->gw = w;
  c->g = cls == IDEM_CLASS_REFUSED ? w->g_user : w->g_guarded;
  c->cidlen = m->id_e - m->id_s;
  c->cid = gw_dupn(line + m->id_s, c->cidlen);
  c->cidv = json_incref(m->id);
  c->who = gw_who_ref(w->who);
  if (identify(w, c, line, len, meta, why, sizeof why)) {
    gw_client_error(w, c->cid, c->cidlen, -32602,
                    "Invalid params: idem: %s; the tool was not called", why);
    cli_err("a tools/call of %s was refused: %s", tool, why);
    gw_gcall_free(c);
    return;
  }
  c->tool = gw_dupn(tool, strlen(tool));
  args = params_member(line, len, "arguments", &alen);
  if (args) {
    c->args = gw_dupn(args, alen);
    c->args_len = alen;
  } else if (json_object_get(m->params, "arguments")) {
    /* spelt with escapes the scanner does not unescape: jansson's text */
    c->args = json_dumps(json_object_get(m->params, "arguments"),
                         JSON_COMPACT | JSON_ENCODE_ANY);
    c->args_len = c->args ? strlen(c->args) : 0;
  } else {
    c->args = gw_dupn("{}", 2);
    c->args_len = 2;
  }
  c->meta = json_is_object(meta) ? json_deep_copy(meta) : json_object();
  if (!c->cid || !c->session || !c->call_id || !c->tool || !c->args || !c->meta)
    gw_oom();
  /* the gateway's own members are not the server's business */
  json_object_del(c->meta, "io.idem/session");
  json_object_del(c->meta, "io.idem/call_id");
  json_object_del(c->meta, "io.idem/turn");
  json_object_del(c->meta, "io.idem/key");
  gw_live_add(w, c);
  step(w, c, J_BEGIN);
}

/* A late result's record-keeper: a gcall without a step. */
static gcall *late_for(gw *w, gcall *c) {
  gcall *l = calloc(1, sizeof *l);
  if (!l) gw_oom();
  l->gw = w;
  l->g = c->g;
  l->session = gw_dupn(c->session, strlen(c->session));
  l->call_id = gw_dupn(c->call_id, strlen(c->call_id));
  l->tool = gw_dupn(c->tool, strlen(c->tool));
  l->token = c->token;
  if (!l->session || !l->call_id || !l->tool) gw_oom();
  return l;
}

/* t made one printable line of at most n-1 bytes (for a message): control
** characters become spaces, a run of spaces one (an SDK's message may be
** indented JSON), and a cut is marked "...". */
static void one_line(const char *t, char *out, size_t n) {
  size_t k = 0;
  for (; *t && k + 4 < n; t++) {
    char ch = (unsigned char)*t < 0x20 || *t == 0x7f ? ' ' : *t;
    if (ch != ' ' || !k || out[k - 1] != ' ') out[k++] = ch;
  }
  if (*t) memcpy(out + k, "...", 3), k += 3;
  out[k] = '\0';
}

/* The first text content item of a tool result as one_line(), or "" when
** it has none. */
static void first_text(const json_t *result, char *out, size_t n) {
  const json_t *item;
  size_t i;
  out[0] = '\0';
  json_array_foreach(json_object_get(result, "content"), i, item) {
    const char *t = json_string_value(json_object_get(item, "text"));
    if (t) {
      one_line(t, out, n);
      return;
    }
  }
}

/* What the server's answer to an execute says happened: the outcome, made
** the input of c's next job (finish, or a late result's record).  *text is
** the raw "result" (or "error", *is_error) member of the answer.
**
** Any answer ENDS the attempt (c->ended); only a verdict FINISHES it (SPEC
** §6a): a tool result (applied), a protocol error that proves the request
** was not processed (rejected: -32700, -32600, -32601 alone), or isError
** under an on_is_error that makes it one.  Everything else is UNKNOWN -
** an end without a verdict, after which the request may still land
** (settle_ms counts from the answer).
** A result must be a CallToolResult: an object, whose content (when there)
** is an array and isError (when there) a boolean.  Anything else is a
** protocol violation, and says nothing of what the tool did: unknown.
** isError true is what the tool's handler said, and SDKs say it for any
** exception in the handler - its own fetch to the provider timing out
** while the provider still holds the request included - so by
** itself it proves nothing: the tool's on_is_error says what it means
** (unknown unless the policy knows the server better). */
int gw_take_answer(gcall *c, const mcp_msg *m, const char *line, size_t len,
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
    const json_t *ie = json_object_get(result, "isError"),
                 *content = json_object_get(result, "content");
    if (mcp_member(line, len, "result", &vs, &ve) == 1) {
      *text = line + vs;
      *tlen = ve - vs;
    }
    outcome = IDEM_OUTCOME_APPLIED;
    if (!json_is_object(result) || (content && !json_is_array(content)) ||
        (ie && !json_is_boolean(ie))) {
      snprintf(err, sizeof err,
               "the server's answer is not a tool result (%s)",
               !json_is_object(result) ? "its result is not an object"
               : content ? "its content is not an array"
                         : "its isError is not true or false");
      outcome = IDEM_OUTCOME_UNKNOWN;
      *text = NULL; /* nothing of it is recorded or passed on */
      *tlen = 0;
    } else if (json_is_true(ie)) {
      idem_tool_info r = {.size = sizeof r};
      char said[240];
      idem_policy_tool(c->gw->gpolicy, c->tool, &r);
      first_text(result, said, sizeof said);
      snprintf(err, sizeof err, "the tool answered isError%s%s", *said ? ": " : "",
               said);
      outcome = r.on_is_error;
    }
  } else {
    json_t *e = json_object_get(m->root, "error");
    double code = json_number_value(json_object_get(e, "code"));
    const char *msg = json_string_value(json_object_get(e, "message"));
    char said[240];
    one_line(msg ? msg : "", said, sizeof said);
    snprintf(err, sizeof err, "the server answered error %.0f: %s", code,
             said);
    if (mcp_member(line, len, "error", &vs, &ve) == 1) {
      *text = line + vs;
      *tlen = ve - vs;
      *is_error = 1;
    }
    /* only a message the server could not read (-32700 parse error,
    ** -32600 invalid request) or a method it does not have (-32601) proves
    ** that nothing was processed.  -32602 does not: the official SDK
    ** answers it when it validates the handler's result AFTER the handler
    ** ran (an outputSchema, a result that is not a CallToolResult), and a
    ** server may use it for anything; -32603 and the rest are as unknown */
    outcome = code == -32700 || code == -32600 || code == -32601
                  ? IDEM_OUTCOME_REJECTED
                  : IDEM_OUTCOME_UNKNOWN;
  }
  gw_set_input(c, outcome,
               *is_error || outcome == IDEM_OUTCOME_UNKNOWN ? NULL : *text,
               *tlen, err[0] ? err : NULL);
  c->ended = 1; /* the answer ends the attempt; a verdict only if the */
                 /* outcome is one (SPEC §6a)                          */
  return outcome;
}

void gw_on_exec_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
                       size_t len) {
  const char *text;
  size_t tlen;
  int is_error,
      outcome = gw_take_answer(c, m, line, len, &text, &tlen, &is_error);
  c->gid = 0;
  c->timer = T_NONE;
  free(c->fresh_text);
  c->fresh_text = NULL;
  c->fresh = 0;
  if (text && outcome != IDEM_OUTCOME_UNKNOWN) {
    if (!(c->fresh_text = gw_dupn(text, tlen))) gw_oom();
    c->fresh_len = tlen;
    c->fresh = outcome;
    c->fresh_is_error = is_error;
  }
  step(w, c, J_FINISH);
}

static int step_verdict(void *ctx, const char *text, size_t len) {
  return idem_step_check_verdict(ctx, text, len);
}

void gw_on_check_answer(gw *w, gcall *c, const mcp_msg *m, const char *line,
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
    c->checked = outcome == IDEM_OUTCOME_APPLIED;
    gw_set_input(c, outcome, outcome == IDEM_OUTCOME_APPLIED ? line + vs : NULL,
                 ve - vs, NULL);
  } else {
    gw_set_input(c, outcome, NULL, 0, NULL);
  }
  step(w, c, J_RESOLVE);
}

void gw_fire(gw *w, gcall *c) {
  int t = c->timer;
  c->timer = T_NONE;
  if (t == T_DELAY) {
    send_exec(w, c);
  } else if (t == T_WAIT) {
    step(w, c, J_POLL);
  } else if (t == T_DEADLINE) {
    pend *p = gw_pend_find(w, c->gid);
    char why[96];
    long long ms = idem_step_deadline_ms(c->s);
    snprintf(why, sizeof why, "no answer within %lld ms", ms);
    c->gid = 0;
    if (p && p->kind == P_EXEC) {
      /* the deadline ends the wait, not the attempt: it is still in flight
      ** (unknown, not ended), and an answer may still come: record it then.
      ** The request is not cancelled: a server that honours
      ** notifications/cancelled drops the answer even when its handler
      ** went on to apply the action, and that answer settles it. */
      p->kind = P_LATE;
      p->c = late_for(w, c);
      gw_set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, why);
      step(w, c, J_FINISH);
    } else {
      if (p) p->kind = P_DROP;
      gw_set_input(c, IDEM_OUTCOME_UNKNOWN, NULL, 0, NULL);
      step(w, c, J_RESOLVE);
    }
  }
}

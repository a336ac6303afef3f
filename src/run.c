/*
** run.c - HTTP tools through the guard, for every front end and binding
** (idem.h, "HTTP tools"): idem_guard_run and idem_step_check_http.
**
** idem_guard_run is a front end of the guard written against the step API,
** as `idem exec` and `idem mcp` are: it walks one step to its answer, and
** the library itself carries out what the step asks -
**
**   EXECUTE  the tool's request (http.c) with the step's key, arguments
**            and deadline; the outcome, the body (applied or rejected) and
**            the reason go to idem_step_finish.  Ended is not finished
**            (SPEC §6a): a response ENDS the attempt
**            (idem_step_attempt_ended: settle_ms counts from now), but only
**            a VERDICT finishes it - a status the policy maps to applied,
**            rejected or not applied, or a request that was never sent.
**            A 5xx, 408, 409 or 1xx/3xx answer is an end without a verdict:
**            a proxy's 504 while the provider applies the request from its
**            queue later, say - the action stays in doubt, and a status
**            check's "not applied" then means "not yet".  A timeout or a
**            reset after sending is not reported as an end: the request
**            may still be at work at the provider, and the guard reconciles
**            it as an attempt in flight (no retry with the key even under
**            provider_dedupes: a retry's 409 would say nothing of it).
**   CHECK    the status tool's request, when the policy's status tool is
**            an HTTP tool, its 2xx answer read by applied_when
**            (idem_step_check_verdict); else the caller's check hook, else
**            UNKNOWN (the action stays in doubt and the model is told which
**            check to make).
**   WAIT     sleep, then poll.
**   ANSWER   mark it delivered, hand over a copy of the envelope (or the
**            caller's deliver hook hands it over, recording "told").
**
** Requests run on the calling thread: libcurl bounds each by the step's
** deadline (CURLOPT_TIMEOUT_MS), so unlike idem_guard_call no worker is
** needed to own the deadline - and a request abandoned at its deadline is
** closed by libcurl, not left running: nothing of this process can deliver
** a late result for it (the provider may still apply it: that is what
** settle_ms and the status check are for).
**
** Nothing is written before the call is known to be runnable here: a tool
** that is not refused must have an "http" rule, and HTTP must be available
** (idem__http_missing: built with it, libcurl loads) - else the run fails
** before idem_guard_begin, so no record is left for a call never sent.
*/
#include <stdio.h>
#include <string.h>

#include "http.h"

/* A status check as made by check_http. */
typedef struct checked {
  const char *tool;   /* the status tool                        */
  const char *method; /* its method                             */
  int outcome;        /* enum idem_outcome                      */
  idem__http_answer a; /* status; body (APPLIED: the result);   */
                       /* error: why, when UNKNOWN              */
} checked;

/* The status check of s over HTTP, into ck (free ck->a): IDEM_OK, or
** IDEM_POLICY (nothing sent) when the status tool is none or not an HTTP
** tool of policy p. */
static int check_http(idem_step *s, const idem_policy *p, checked *ck) {
  idem__tool_rule scratch;
  const idem__tool_rule *st;
  const char *args, *why;
  size_t alen;
  memset(ck, 0, sizeof *ck);
  ck->outcome = IDEM_OUTCOME_UNKNOWN;
  ck->method = "";
  if (!(ck->tool = idem_step_check_tool(s))) return IDEM_POLICY;
  st = idem__policy_rule(p, ck->tool, &scratch);
  if (st == &scratch || !st->has_http) return IDEM_POLICY;
  ck->method = st->http.method;
  if ((why = idem__http_missing()) != NULL) { /* say why it stays unknown */
    snprintf(ck->a.error, sizeof ck->a.error, "%s", why);
    return IDEM_OK;
  }
  args = idem_step_check_args(s, &alen);
  if (idem__http_request(&st->http, ck->tool, idem_step_check_key(s), args,
                         alen, idem_step_deadline_ms(s), &ck->a) != 0)
    return IDEM_OK; /* nothing sent; a->error says why */
  if (ck->a.status >= 200 && ck->a.status <= 299 && !ck->a.truncated) {
    ck->outcome = idem_step_check_verdict(s, ck->a.body, ck->a.body_len);
    ck->a.error[0] = '\0';
    if (ck->outcome == IDEM_OUTCOME_UNKNOWN)
      snprintf(ck->a.error, sizeof ck->a.error,
               "HTTP %ld: the answer is not JSON, so it cannot say whether "
               "the action took effect",
               ck->a.status);
  }
  /* any other answer leaves the action in doubt, a->error saying it */
  return IDEM_OK;
}

int idem_step_check_http(idem_step *s, int *outcome, char **result,
                         size_t *result_len, char **error) {
  idem_guard *g = idem__step_guard(s);
  const idem_policy *p = NULL;
  checked ck;
  int rc;
  if (outcome) *outcome = IDEM_OUTCOME_UNKNOWN;
  if (result) *result = NULL;
  if (result_len) *result_len = 0;
  if (error) *error = NULL;
  if (!g || !outcome || !result || !result_len ||
      idem__guard_policy(g, &p) != IDEM_OK)
    return IDEM_MISUSE;
  if (idem_step_next(s) != IDEM_NEXT_CHECK)
    return idem__guard_fail(g, IDEM_MISUSE,
                            "idem_step_check_http: the step is not at CHECK");
  if ((rc = check_http(s, p, &ck)) != IDEM_OK) {
    idem__http_answer_free(&ck.a);
    return idem__guard_fail(
        g, rc,
        ck.tool ? "the status tool %s has no \"http\" rule in the policy"
                : "the policy names no status tool%s",
        ck.tool ? ck.tool : "");
  }
  *outcome = ck.outcome;
  if (ck.outcome == IDEM_OUTCOME_APPLIED && ck.a.body) {
    *result = ck.a.body; /* idem__malloc'd: the caller's idem_free() */
    *result_len = ck.a.body_len;
    ck.a.body = NULL;
  }
  if (error && ck.a.error[0] && !(*error = idem__strdup(ck.a.error))) {
    idem__free(*result);
    *result = NULL;
    *result_len = 0;
    idem__http_answer_free(&ck.a);
    return idem__guard_fail(g, IDEM_NOMEM, "out of memory");
  }
  idem__http_answer_free(&ck.a);
  return IDEM_OK;
}

const char *idem_http_missing(void) { return idem__http_missing(); }

int idem_policy_http(const idem_policy *p, const char *tool) {
  idem__tool_rule scratch;
  if (!tool) return 0;
  return idem__policy_rule(p, tool, &scratch)->has_http;
}

/* ---- idem_guard_run --------------------------------------------------------- */

typedef struct run {
  idem_guard *g;
  const idem_policy *policy;
  const idem__tool_rule *rule; /* the call's tool */
  idem_run_hooks h;            /* the caller's, within its size */
} run;

static void tell(void (*hook)(void *, const idem_run_event *), void *ctx,
                 const char *tool, const char *method, const char *key,
                 int attempt, int outcome, long status, const char *error) {
  idem_run_event ev;
  if (!hook) return;
  memset(&ev, 0, sizeof ev);
  ev.size = sizeof ev;
  ev.tool = tool;
  ev.method = method ? method : "";
  ev.key = key ? key : "";
  ev.attempt = attempt;
  ev.outcome = outcome;
  ev.http_status = status;
  ev.error = error ? error : "";
  hook(ctx, &ev);
}

/* One attempt of the tool, reported to the step. */
static int execute(run *r, idem_step *s) {
  const idem__tool_rule *rule = r->rule;
  idem__http_answer a;
  const char *args, *result = NULL;
  size_t alen, rlen = 0;
  int rc = IDEM_OK;
  idem__sleep_ms(idem_step_delay_ms(s));
  args = idem_step_args(s, &alen);
  idem__http_request(&rule->http, rule->name, idem_step_key(s), args, alen,
                     idem_step_deadline_ms(s), &a);
  /* a response, whatever it says, ENDS the exchange (SPEC §6a); it is a
  ** verdict only when its status maps to applied, rejected or not applied
  ** (the guard clears the attempt then) - else the request may still land
  ** until settle_ms from now, and a check's "not applied" means "not yet" */
  if (a.status != 0) rc = idem_step_attempt_ended(s);
  tell(r->h.on_attempt, r->h.ctx, rule->name, rule->http.method,
       idem_step_key(s), idem_step_attempt(s), a.outcome, a.status, a.error);
  if ((a.outcome == IDEM_OUTCOME_APPLIED ||
       a.outcome == IDEM_OUTCOME_REJECTED) &&
      a.body_len) {
    result = a.body;
    rlen = a.body_len;
  }
  if (!rc)
    rc = idem_step_finish(s, a.outcome, result, rlen,
                          a.error[0] ? a.error : NULL);
  idem__http_answer_free(&a);
  return rc;
}

/* The status check the step asks for, resolved. */
static int check(run *r, idem_step *s) {
  checked ck;
  const char *result = NULL;
  size_t rlen = 0;
  int rc, outcome;
  if (check_http(s, r->policy, &ck) == IDEM_OK) {
    tell(r->h.on_check, r->h.ctx, ck.tool, ck.method, idem_step_check_key(s),
         idem_step_attempt(s), ck.outcome, ck.a.status, ck.a.error);
    if (ck.outcome == IDEM_OUTCOME_APPLIED && ck.a.body) {
      result = ck.a.body;
      rlen = ck.a.body_len;
    }
    rc = idem_step_resolve(s, ck.outcome, result, rlen);
    idem__http_answer_free(&ck.a);
    return rc;
  }
  idem__http_answer_free(&ck.a);
  if (r->h.check) { /* the caller's own: a status command, say */
    result = NULL;
    outcome = r->h.check(r->h.ctx, s, &result, &rlen);
    if (outcome == 0) return idem_step_no_check(s); /* nothing to check with */
    if (outcome < IDEM_OUTCOME_APPLIED || outcome > IDEM_OUTCOME_UNKNOWN)
      outcome = IDEM_OUTCOME_UNKNOWN;
    if (outcome != IDEM_OUTCOME_APPLIED || !result) result = NULL, rlen = 0;
    return idem_step_resolve(s, outcome, result, rlen);
  }
  tell(r->h.on_check, r->h.ctx, ck.tool ? ck.tool : "", "",
       idem_step_check_key(s), idem_step_attempt(s), IDEM_OUTCOME_UNKNOWN, 0,
       ck.tool ? "the status tool has no \"http\" rule, and no check hook "
                 "was given: the check was not made"
               : "the status check is a command, and no check hook was "
                 "given: the check was not made");
  return idem_step_no_check(s);
}

int idem_guard_run(idem_guard *g, const idem_call *call,
                   const idem_run_hooks *hooks, char **envelope, size_t *len) {
  idem__tool_rule scratch;
  idem_step *s = NULL;
  const char *why;
  run r;
  int rc;
  if (envelope) *envelope = NULL;
  if (len) *len = 0;
  memset(&r, 0, sizeof r);
  if (idem__guard_policy(g, &r.policy) != IDEM_OK) return IDEM_MISUSE;
  if (!call || !call->tool || !envelope)
    return idem__guard_fail(g, IDEM_MISUSE,
                            "idem_guard_run: %s is NULL",
                            !call       ? "the call"
                            : !envelope ? "envelope"
                                        : "the call's tool");
  if (hooks) {
    if (hooks->size == 0)
      return idem__guard_fail(g, IDEM_MISUSE,
                              "idem_run_hooks.size is 0: set it to "
                              "sizeof(idem_run_hooks)");
    memcpy(&r.h, hooks, hooks->size < sizeof r.h ? hooks->size : sizeof r.h);
  }
  r.g = g;
  r.rule = idem__policy_rule(r.policy, call->tool, &scratch);
  if (r.rule->cls != IDEM_CLASS_REFUSED) {
    if (!r.rule->has_http)
      return idem__guard_fail(
          g, IDEM_POLICY,
          "the tool %.200s has no \"http\" rule in the policy: "
          "idem_guard_run makes HTTP requests (give the tool to "
          "idem_guard_call as functions); nothing was sent or recorded",
          call->tool);
    if ((why = idem__http_missing()) != NULL)
      return idem__guard_fail(g, IDEM_ERROR,
                              "cannot run the HTTP tool %.200s: %s; nothing "
                              "was sent or recorded",
                              call->tool, why);
  }
  if ((rc = idem_guard_begin(g, call, &s)) != IDEM_OK) goto done;
  for (;;) {
    switch (idem_step_next(s)) {
    case IDEM_NEXT_EXECUTE: rc = execute(&r, s); break;
    case IDEM_NEXT_CHECK: rc = check(&r, s); break;
    case IDEM_NEXT_WAIT:
      idem__sleep_ms(idem_step_delay_ms(s));
      rc = idem_step_poll(s);
      break;
    case IDEM_NEXT_ANSWER: {
      size_t n;
      const char *env = idem_step_envelope(s, &n);
      /* told before it is handed over: a call made the moment the answer
      ** is read must not find this one untold (SPEC §6.4); a deliver hook
      ** hands it over itself, and knows whether its reader is there */
      rc = r.h.deliver ? r.h.deliver(r.h.ctx, s, env, n)
                       : idem_step_delivered(s);
      if (rc != IDEM_OK) goto done;
      if (!(*envelope = idem__strndup(env, n))) {
        rc = idem__guard_fail(g, IDEM_NOMEM, "out of memory");
        goto done;
      }
      if (len) *len = n;
      goto done;
    }
    default: rc = idem__guard_fail(g, IDEM_MISUSE, "a step with no next move");
    }
    if (rc) goto done;
  }
done:
  idem_step_free(s);
  return rc;
}

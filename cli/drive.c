/*
** drive.c - walking a step of the guard to its answer, for the verbs that
** call tools from the shell (`idem exec`, `idem call`), and running the
** status checks of the policy (those verbs and `idem recover`).
*/
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "run/run.h"

int cli_call_input(const char *verb, const char *args, idem_call *call,
                   char **owned) {
  *owned = NULL;
  if (!call->session) call->session = getenv("IDEM_SESSION");
  if (!call->session || !*call->session)
    return cli_usage(verb, "--session is required");
  if (!call->call_id || !*call->call_id)
    return cli_usage(verb, "--call is required");
  if (!call->tool || !*call->tool) return cli_usage(verb, "--tool is required");
  if (call->turn && !*call->turn)
    return cli_usage(verb, "--turn is empty: give the model turn's id, or "
                           "leave it out");
  if (!call->turn && (call->turn = getenv("IDEM_TURN")) && !*call->turn)
    call->turn = NULL; /* IDEM_TURN= : no turn */
  if (strcmp(args, "-") == 0) {
    int trunc, err = cli_read_all(NULL, IDEM_DEFAULT_MAX_BYTES, owned,
                                  &call->args_len, &trunc);
    if (err) {
      cli_err("stdin: %s", strerror(err));
      return EXIT_FAIL;
    }
    if (trunc) {
      cli_err("arguments: text larger than the limit of %u bytes",
              IDEM_DEFAULT_MAX_BYTES);
      free(*owned);
      *owned = NULL;
      return EXIT_DATA;
    }
    call->args = *owned;
  } else {
    call->args = args;
    call->args_len = strlen(args);
  }
  return EXIT_OK;
}

int cli_exit_for(int answer) {
  switch (answer) {
  case IDEM_ANSWER_SUCCEEDED:
  case IDEM_ANSWER_ALREADY_APPLIED: return 0;
  case IDEM_ANSWER_FAILED: return 1;
  case IDEM_ANSWER_INVALID_ARGUMENTS:
  case IDEM_ANSWER_CONFLICT: return 65;
  case IDEM_ANSWER_OUTCOME_UNKNOWN:
  case IDEM_ANSWER_IN_PROGRESS: return 75;
  case IDEM_ANSWER_REFUSED: return 77;
  default: return 1;
  }
}

/* The status tool of the policy, called over HTTP by the library; a
** check that could not be made says why on stderr (the action stays in
** doubt). */
static int check_http(idem_step *s, char **result) {
  char *res = NULL, *why = NULL;
  size_t len;
  int outcome = IDEM_OUTCOME_UNKNOWN;
  if (idem_step_check_http(s, &outcome, &res, &len, &why) != IDEM_OK)
    return 0; /* not an HTTP tool: nothing to call, no check made */
  if (outcome == IDEM_OUTCOME_APPLIED && res && !(*result = strdup(res)))
    outcome = IDEM_OUTCOME_UNKNOWN;
  if (outcome == IDEM_OUTCOME_UNKNOWN && why)
    cli_err("status check %s: %s", idem_step_check_tool(s), why);
  idem_free(res);
  idem_free(why);
  return outcome;
}

int cli_check(const idem_policy *p, idem_step *s, const char *cmd,
              const char *session, const char *call_id, const char *tool,
              char **result) {
  *result = NULL;
  if (!cmd) cmd = idem_step_check_command(s);
  if (cmd) {
    size_t len;
    char *out = NULL;
    int outcome = cli_status_check(s, cmd, session, call_id, tool, &out, &len);
    if (outcome == IDEM_OUTCOME_APPLIED) *result = cli_result_json(out, len);
    free(out);
    return outcome;
  }
  (void)p;
  if (idem_step_check_tool(s)) return check_http(s, result);
  return 0; /* nothing to check with */
}

int cli_resolve(idem_step *s, int outcome, const char *result) {
  if (!outcome) return idem_step_no_check(s);
  return idem_step_resolve(s, outcome, result, result ? strlen(result) : 0);
}

int cli_hand_over(idem_guard *g, idem_step *s, const char *env, size_t len) {
  int told = 0, e;
  /* "told" is recorded before the harness can read the answer: a call it
  ** makes the moment it has read it is a new decision, and must not find
  ** this one untold (and be fenced as its duplicate) */
  if (!cli_reader_gone(1)) {
    if (idem_step_delivered(s) == IDEM_OK)
      told = 1;
    else
      cli_err("recording the delivery: %s", idem_guard_errmsg(g));
  }
  if (fflush(stdout) == 0 && cli_write_all(1, env, len) == 0 &&
      cli_write_all(1, "\n", 1) == 0)
    return EXIT_OK;
  e = errno;
  if (told && idem_step_undelivered(s) != IDEM_OK)
    cli_err("undoing the delivery: %s; the outcome counts as told",
            idem_guard_errmsg(g));
  cli_err("writing standard output: %s; the answer did not reach the "
          "model, and its outcome fences a repeat",
          strerror(e));
  return EXIT_FAIL;
}

int cli_drive(idem_guard *g, idem_step *s, const cli_driver *d) {
  char *result = NULL, error[512];
  int rc, outcome;
  for (;;) {
    switch (idem_step_next(s)) {
    case IDEM_NEXT_EXECUTE:
      cli_sleep_ms(idem_step_delay_ms(s));
      error[0] = '\0';
      if (d->execute(d->ctx, s, &outcome, &result, error, sizeof error)) {
        /* a verdict: not even its runner started, nothing was sent */
        cli_err("cannot run the tool: %s", error[0] ? error : strerror(errno));
        outcome = IDEM_OUTCOME_NOT_APPLIED;
      }
      if (d->on_attempt) d->on_attempt(d->ctx, s, outcome, error);
      rc = idem_step_finish(s, outcome, result, result ? strlen(result) : 0,
                            error[0] ? error : NULL);
      break;
    case IDEM_NEXT_CHECK:
      outcome = cli_check(d->policy, s, d->status, d->call->session,
                          d->call->call_id, d->call->tool, &result);
      if (d->on_check) d->on_check(d->ctx, s, outcome);
      rc = cli_resolve(s, outcome, result);
      break;
    case IDEM_NEXT_WAIT:
      cli_sleep_ms(idem_step_delay_ms(s));
      rc = idem_step_poll(s);
      break;
    case IDEM_NEXT_ANSWER: {
      size_t len;
      const char *env = idem_step_envelope(s, &len);
      if (cli_hand_over(g, s, env, len) != EXIT_OK) return EXIT_FAIL;
      return cli_exit_for(idem_step_answer(s));
    }
    default: rc = IDEM_MISUSE;
    }
    free(result);
    result = NULL;
    if (rc) {
      cli_err("%s", idem_guard_errmsg(g));
      return EXIT_FAIL;
    }
  }
}

/*
** cmd_call.c - `idem call`: an HTTP tool of the policy, through the guard.
**
**   idem call --policy FILE [--log URL] --session S --call C --tool T
**             [--args JSON|-] [--verbose]
**
** The library runs the tool (idem_guard_run): the request its "http" rule
** says (docs/POLICY.md), retries, and the status check when the policy's
** status tool is an HTTP tool too.  A status command (idem exec's) is run
** here, through the check hook.  Prints the envelope (SPEC §7) through the
** deliver hook - told only when it reaches a reader still there
** (cli_hand_over) - and exits as `idem exec` does (SPEC §9).  --verbose tells each attempt and check
** on stderr.
*/
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "cli.h"
#include "run/run.h"

typedef struct call_ctx {
  const idem_call *call;
  idem_guard *g;
  int verbose;
  int written;        /* the answer reached stdout whole */
  char *check_result; /* the check hook's last result (it lends it) */
} call_ctx;

static const char *outcome_name(int o) {
  switch (o) {
  case IDEM_OUTCOME_APPLIED: return "applied";
  case IDEM_OUTCOME_REJECTED: return "rejected";
  case IDEM_OUTCOME_NOT_APPLIED: return "not applied";
  default: return "outcome unknown";
  }
}

static void tell_attempt(void *ctx, const idem_run_event *ev) {
  const call_ctx *x = ctx;
  if (!x->verbose) return;
  fprintf(stderr, "idem: %s %s, attempt %d: %s%s%s\n", ev->method, ev->tool,
          ev->attempt, outcome_name(ev->outcome), *ev->error ? " - " : "",
          ev->error);
}

static void tell_check(void *ctx, const idem_run_event *ev) {
  const call_ctx *x = ctx;
  if (!x->verbose) return;
  fprintf(stderr, "idem: status check %s of key %s: %s%s%s\n", ev->tool,
          ev->key, outcome_name(ev->outcome), *ev->error ? " - " : "",
          ev->error);
}

/* A status check the library does not make: the policy's status command
** (a status tool without an "http" rule cannot be called from here). */
static int check_other(void *ctx, const idem_step *s, const char **result,
                       size_t *len) {
  call_ctx *x = ctx;
  const char *cmd = idem_step_check_command(s);
  char *out = NULL;
  size_t n = 0;
  int outcome = IDEM_OUTCOME_UNKNOWN;
  free(x->check_result);
  x->check_result = NULL;
  if (cmd) {
    outcome = cli_status_check(s, cmd, x->call->session, x->call->call_id,
                               x->call->tool, &out, &n);
    if (outcome == IDEM_OUTCOME_APPLIED) x->check_result = cli_result_json(out, n);
    free(out);
  }
  if (x->verbose)
    fprintf(stderr, "idem: status check %s of key %s: %s\n",
            cmd ? "(command)" : idem_step_check_tool(s), idem_step_check_key(s),
            outcome_name(outcome));
  *result = x->check_result;
  *len = x->check_result ? strlen(x->check_result) : 0;
  return cmd ? outcome : 0; /* 0: nothing to check with */
}

/* The answer, handed over at ANSWER: "told" is recorded only for a reader
** that is still there (cli_hand_over). */
static int deliver(void *ctx, idem_step *s, const char *env, size_t len) {
  call_ctx *x = ctx;
  x->written = cli_hand_over(x->g, s, env, len) == EXIT_OK;
  return IDEM_OK;
}

/* The exit status of the envelope's answer (SPEC §9). */
static int exit_for_envelope(const char *env, size_t len) {
  json_error_t err;
  json_t *o = json_loadb(env, len, 0, &err);
  const char *st = json_string_value(json_object_get(o, "status"));
  int a, code = EXIT_FAIL;
  for (a = IDEM_ANSWER_SUCCEEDED; st && a <= IDEM_ANSWER_INVALID_ARGUMENTS; a++)
    if (strcmp(st, idem_answer_name(a)) == 0) code = cli_exit_for(a);
  json_decref(o);
  return code;
}

static int no_http(const char *policy_path, const char *tool) {
  cli_err("%s: the tool %s has no \"http\" rule; idem call makes HTTP "
          "calls (run a command with idem exec)",
          policy_path, tool);
  return EXIT_USAGE;
}

int cmd_call(int argc, char **argv) {
  static const struct option opts[] = {
      {"policy", required_argument, NULL, 'p'},
      {"log", required_argument, NULL, 'L'},
      {"session", required_argument, NULL, 's'},
      {"turn", required_argument, NULL, 'u'},
      {"call", required_argument, NULL, 'c'},
      {"tool", required_argument, NULL, 't'},
      {"args", required_argument, NULL, 'a'},
      {"verbose", no_argument, NULL, 'v'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *policy_path = NULL, *log = NULL, *args = "{}";
  idem_call call = {sizeof call, NULL, NULL, NULL, NULL, 0, NULL, 0};
  idem_run_hooks hooks;
  char *stdin_args = NULL, *env = NULL;
  idem_policy *policy = NULL;
  idem_guard *g = NULL;
  call_ctx x = {NULL, NULL, 0, 0, NULL};
  size_t len;
  int ch, rc, code = EXIT_FAIL;

  while ((ch = getopt_long(argc, argv, ":hv", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': policy_path = optarg; break;
    case 'L': log = optarg; break;
    case 's': call.session = optarg; break;
    case 'u': call.turn = optarg; break;
    case 'c': call.call_id = optarg; break;
    case 't': call.tool = optarg; break;
    case 'a': args = optarg; break;
    case 'v': x.verbose = 1; break;
    case 'h': cli_print_usage(stdout, "call"); return EXIT_OK;
    case ':':
      return cli_usage("call", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("call", "no option '%s' for call", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage("call", "too many arguments");
  if (!policy_path) return cli_usage("call", "--policy is required");
  if ((code = cli_call_input("call", args, &call, &stdin_args))) return code;
  code = EXIT_FAIL;
  if (idem_policy_load(policy_path, &policy) != IDEM_OK) {
    cli_err("%s: %s", policy_path,
            policy ? idem_policy_errmsg(policy) : "out of memory");
    code = EXIT_DATA;
    goto out;
  }
  if (idem_policy_class(policy, call.tool) != IDEM_CLASS_REFUSED &&
      !idem_policy_http(policy, call.tool)) {
    code = no_http(policy_path, call.tool); /* before any log is opened */
    goto out;
  }
  if (idem_guard_open(log, policy, &g) != IDEM_OK) {
    cli_err("%s; nothing was sent", idem_guard_errmsg(g));
    goto out;
  }
  x.call = &call;
  x.g = g;
  memset(&hooks, 0, sizeof hooks);
  hooks.size = sizeof hooks;
  hooks.ctx = &x;
  hooks.on_attempt = tell_attempt;
  hooks.on_check = tell_check;
  hooks.check = check_other;
  hooks.deliver = deliver;
  rc = idem_guard_run(g, &call, &hooks, &env, &len);
  if (rc == IDEM_POLICY) { /* a tool without an "http" rule: nothing ran */
    code = no_http(policy_path, call.tool);
  } else if (rc != IDEM_OK) {
    cli_err("%s", idem_guard_errmsg(g));
  } else {
    code = x.written ? exit_for_envelope(env, len) : EXIT_FAIL;
  }
out:
  idem_free(env);
  free(x.check_result);
  idem_guard_close(g);
  idem_policy_free(policy);
  free(stdin_args);
  return code;
}

/*
** cmd_call.c - `idem call`: an HTTP tool of the policy, through the guard.
**
**   idem call --policy FILE [--log URL] --session S --call C --tool T
**             [--args JSON|-] [--verbose]
**
** The tool's "http" rule says the request (docs/POLICY.md); its status
** check, when the policy names a status tool with an "http" rule, is an
** HTTP request too.  Prints the envelope (SPEC §7) and exits as `idem exec`
** does (SPEC §9).  --verbose tells each attempt and check on stderr.
*/
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "http.h"
#include "idemInt.h"

typedef struct call_ctx {
  const idem__tool_rule *rule;
  int verbose;
} call_ctx;

static int http_attempt(void *ctx, idem_step *s, int *outcome, char **result,
                        char *error, size_t errn) {
  const call_ctx *x = ctx;
  cli_http_answer a;
  size_t alen;
  const char *args = idem_step_args(s, &alen);
  cli_http_request(&x->rule->http, x->rule->name, idem_step_key(s), args, alen,
                   idem_step_deadline_ms(s), &a);
  *outcome = a.outcome;
  *result = NULL;
  /* a response, whatever it says, ends the exchange: nothing of this
  ** attempt can land later (SPEC §6a); a timeout or a reset may */
  if (a.status != 0) idem_step_attempt_ended(s);
  if ((a.outcome == IDEM_OUTCOME_APPLIED ||
       a.outcome == IDEM_OUTCOME_REJECTED) &&
      a.body_len) {
    *result = a.body;
    a.body = NULL;
  }
  snprintf(error, errn, "%s", a.error);
  cli_http_answer_free(&a);
  return 0;
}

static const char *outcome_name(int o) {
  switch (o) {
  case IDEM_OUTCOME_APPLIED: return "applied";
  case IDEM_OUTCOME_REJECTED: return "rejected";
  case IDEM_OUTCOME_NOT_APPLIED: return "not applied";
  default: return "outcome unknown";
  }
}

static void tell_attempt(void *ctx, const idem_step *s, int outcome,
                         const char *error) {
  const call_ctx *x = ctx;
  if (!x->verbose) return;
  fprintf(stderr, "idem: %s %s, attempt %d: %s%s%s\n", x->rule->http.method,
          x->rule->name, idem_step_attempt(s), outcome_name(outcome),
          *error ? " - " : "", error);
}

static void tell_check(void *ctx, const idem_step *s, int outcome) {
  const call_ctx *x = ctx;
  if (!x->verbose) return;
  fprintf(stderr, "idem: status check %s of key %s: %s\n",
          idem_step_check_tool(s) ? idem_step_check_tool(s) : "(command)",
          idem_step_check_key(s), outcome_name(outcome));
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
  idem_call call = {sizeof call, NULL, NULL, NULL, NULL, 0, NULL};
  char *stdin_args = NULL;
  idem_policy *policy = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem__tool_rule scratch;
  call_ctx x = {NULL, 0};
  char missing[400];
  cli_driver d;
  int ch, code = EXIT_FAIL;

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
  x.rule = idem__policy_rule(policy, call.tool, &scratch);
  if (x.rule->cls != IDEM_CLASS_REFUSED && !x.rule->has_http) {
    cli_err("%s: the tool %s has no \"http\" rule; idem call makes HTTP "
            "calls (run a command with idem exec)",
            policy_path, call.tool);
    code = EXIT_USAGE;
    goto out;
  }
  /* libcurl before the guard begins: without it no record is written (the
  ** call can be made again once it is installed) */
  if (x.rule->has_http && cli_http_load(missing, sizeof missing)) {
    cli_err("%s; nothing was sent", missing);
    goto out;
  }
  if (idem_guard_open(log, policy, &g) != IDEM_OK ||
      idem_guard_begin(g, &call, &s) != IDEM_OK) {
    cli_err("%s; nothing was sent", idem_guard_errmsg(g));
    goto out;
  }
  memset(&d, 0, sizeof d);
  d.execute = http_attempt;
  d.on_attempt = tell_attempt;
  d.on_check = tell_check;
  d.ctx = &x;
  d.policy = policy;
  d.call = &call;
  code = cli_drive(g, s, &d);
out:
  idem_step_free(s);
  idem_guard_close(g);
  idem_policy_free(policy);
  free(stdin_args);
  return code;
}

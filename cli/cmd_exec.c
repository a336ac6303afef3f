/*
** cmd_exec.c - `idem exec`: a command-line tool through the guard (SPEC §9).
**
**   idem exec [--policy FILE] [--log URL] --session S --call C --tool T
**             [--args JSON|-] [--timeout MS] [--status CMD] -- COMMAND...
**
** The command gets the key in IDEM_KEY (and IDEM_SESSION, IDEM_CALL_ID,
** IDEM_TOOL, IDEM_ATTEMPT) and the arguments on stdin.  Exit 0 -> applied
** (stdout is the result: JSON when it parses, else a string); 100 -> not
** applied; 101 -> rejected; anything else, a signal or the deadline ->
** unknown (the policy's exit_codes may map others).  The status command
** (sh -c) gets the same environment: 0 -> applied, 100 -> not applied,
** else unknown.
**
** The command does not run as our child but as the child of a runner,
** `idem __run`, so that its result is still recorded when it comes after
** the deadline - after this process has answered and exited.  The runner
** hands the result back over a pipe; if nobody reads it any more (EPIPE),
** it records it in the log itself as a late result.  If the runner's write
** races with our giving up, the action stays in doubt and reconciliation
** settles it: the safe direction.
*/
#include <errno.h>
#include <getopt.h>
#include <jansson.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run/run.h"

extern char **environ;

#define MAX_OUTPUT CLI_MAX_OUTPUT

/* ---- one attempt, through the runner ----------------------------------------- */

static void codes_arg(char *buf, size_t n, const idem_tool_info *r) {
  size_t k = 0;
  const int *lists[3] = {r->exit_applied, r->exit_not_applied,
                         r->exit_rejected};
  const int counts[3] = {r->n_exit_applied, r->n_exit_not_applied,
                         r->n_exit_rejected};
  buf[0] = '\0';
  for (int l = 0; l < 3; l++) {
    for (int i = 0; i < counts[l] && k < n; i++)
      k += (size_t)snprintf(buf + k, n - k, "%s%d", i ? "," : "", lists[l][i]);
    if (l < 2 && k < n) k += (size_t)snprintf(buf + k, n - k, ";");
  }
}

typedef struct exec_ctx {
  const char *log;
  const char *front; /* our owner id: the runner hands the lease back */
  char **command;
  int ncommand;
  const idem_call *call;
  const idem_tool_info *rule;
} exec_ctx;

/* Run the command once for step s; the outcome, result and error out. */
static int attempt(void *ctx, idem_step *s, int *outcome, char **result,
                   char *error, size_t errn) {
  const exec_ctx *x = ctx;
  const idem_call *call = x->call;
  const idem_tool_info *rule = x->rule;
  char token[32], codes[512], self[4096], lease[32], timeout[32], settle[32];
  char head[32];
  char **argv;
  cli_env env;
  cli_run_opts o;
  cli_run_result res;
  size_t alen, input_len;
  char *input;
  const char *args = idem_step_args(s, &alen);
  long long deadline = idem_step_deadline_ms(s);
  int k = 0, rc;
  ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
  *result = NULL;
  if (n <= 0) return -1;
  self[n] = '\0';
  snprintf(token, sizeof token, "%lld", idem_step_token(s));
  snprintf(lease, sizeof lease, "%lld", rule->lease_ms);
  snprintf(timeout, sizeof timeout, "%lld", deadline);
  snprintf(settle, sizeof settle, "%lld", (long long)rule->settle_ms);
  codes_arg(codes, sizeof codes, rule);
  if (!(argv = calloc((size_t)x->ncommand + 24, sizeof *argv))) return -1;
  argv[k++] = self;
  argv[k++] = (char *)"__run";
  argv[k++] = (char *)"--log";
  argv[k++] = (char *)(uintptr_t)x->log;
  argv[k++] = (char *)"--session";
  argv[k++] = (char *)(uintptr_t)call->session;
  argv[k++] = (char *)"--call";
  argv[k++] = (char *)(uintptr_t)call->call_id;
  argv[k++] = (char *)"--token";
  argv[k++] = token;
  argv[k++] = (char *)"--codes";
  argv[k++] = codes;
  argv[k++] = (char *)"--lease";
  argv[k++] = lease;
  argv[k++] = (char *)"--timeout";
  argv[k++] = timeout;
  argv[k++] = (char *)"--settle";
  argv[k++] = settle;
  argv[k++] = (char *)"--front";
  argv[k++] = (char *)(uintptr_t)x->front;
  argv[k++] = (char *)"--";
  for (int i = 0; i < x->ncommand; i++) argv[k++] = x->command[i];
  if (cli_env_build(&env, idem_step_key(s), call->session, call->call_id,
                    call->tool, idem_step_attempt(s))) {
    free(argv);
    cli_env_free(&env);
    return -1;
  }
  /* the input is "LEN\n" and the arguments: a runner whose input ends
  ** short (we died while writing it) runs nothing */
  {
    int hl = snprintf(head, sizeof head, "%zu\n", alen);
    if (!(input = malloc((size_t)hl + alen + 1))) {
      free(argv);
      cli_env_free(&env);
      return -1;
    }
    memcpy(input, head, (size_t)hl);
    if (alen) memcpy(input + hl, args, alen);
    input_len = (size_t)hl + alen;
  }
  memset(&o, 0, sizeof o);
  o.argv = argv;
  o.envp = env.envp;
  o.input = input;
  o.input_len = input_len;
  o.deadline_ms = deadline;
  o.max_output = MAX_OUTPUT + 4096;
  o.relay_stderr = 1;
  rc = cli_run(&o, &res);
  free(argv);
  free(input);
  cli_env_free(&env);
  if (rc != 0 || res.spawn_errno) {
    /* not even the runner started: nothing was sent */
    *outcome = IDEM_OUTCOME_NOT_APPLIED;
    snprintf(error, errn, "cannot start the runner: %s",
             strerror(res.spawn_errno ? res.spawn_errno : errno));
    free(res.out);
    return 0;
  }
  if (res.timed_out || !res.out || res.out_len < 2) {
    *outcome = IDEM_OUTCOME_UNKNOWN;
    if (res.timed_out)
      snprintf(error, errn, "no answer within %lld ms", deadline);
    else
      snprintf(error, errn, "the runner ended without a result");
    free(res.out);
    return 0;
  }
  /* runner protocol: "<outcome> <ended>\n<error line>\n<result>" */
  {
    char *p = res.out, *nl1 = strchr(p, '\n'), *nl2, *sp;
    *outcome = atoi(p);
    sp = strchr(p, ' ');
    if (sp && nl1 && sp < nl1 && sp[1] == '1') idem_step_attempt_ended(s);
    if (!nl1 || !(nl2 = strchr(nl1 + 1, '\n')) || *outcome < 1 ||
        *outcome > 4) {
      *outcome = IDEM_OUTCOME_UNKNOWN;
      snprintf(error, errn, "the runner's answer is garbled");
    } else {
      size_t el = (size_t)(nl2 - nl1 - 1);
      snprintf(error, errn, "%.*s", (int)el, nl1 + 1);
      if (res.out + res.out_len > nl2 + 1) {
        size_t rl = (size_t)(res.out + res.out_len - (nl2 + 1));
        if ((*result = malloc(rl + 1))) {
          memcpy(*result, nl2 + 1, rl);
          (*result)[rl] = '\0';
        }
      }
    }
  }
  free(res.out);
  return 0;
}

/* ---- policy overrides from the command line ------------------------------- */

/*
** The policy of the call: the file's, or without one, this tool guarded
** with the defaults.  --timeout and --status change what the policy says
** of the tool, so they are written into its text - the command is a client
** of the library and changes nothing of a loaded policy: the file is read
** and checked as it is (its messages name its own fields), then its tool's
** entry is changed and the whole checked again.
*/
static int load_policy(const char *path, const char *tool, long long timeout,
                       const char *status, idem_policy **out) {
  idem_policy *p = NULL;
  json_t *doc = NULL, *entry;
  json_error_t jerr;
  char *text;
  int rc;
  *out = NULL;
  if (path) {
    rc = idem_policy_load(path, &p);
    if (rc) {
      cli_err("%s: %s", path, p ? idem_policy_errmsg(p) : "out of memory");
      idem_policy_free(p);
      return rc == IDEM_POLICY ? EXIT_DATA : EXIT_FAIL;
    }
    if (timeout <= 0 && !status) {
      *out = p;
      return EXIT_OK;
    }
    /* the policy's decision comes first: a tool it refuses is answered
    ** refused by the guard, whatever the flags say */
    if (idem_policy_class(p, tool) == IDEM_CLASS_REFUSED) {
      *out = p;
      return EXIT_OK;
    }
    idem_policy_free(p);
    p = NULL;
    doc = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
  } else {
    doc = json_pack("{s:{s:{s:s}}}", "tools", tool, "class", "guarded");
  }
  entry = json_object_get(json_object_get(doc, "tools"), tool);
  if (!json_is_object(entry)) {
    json_decref(doc);
    if (!doc) {
      cli_err("the tool name is not valid UTF-8: %s", tool);
      return EXIT_USAGE;
    }
    cli_err("--timeout and --status need %s to be named in the policy", tool);
    return EXIT_USAGE;
  }
  if (timeout > 0) {
    json_t *t = json_object_get(entry, "timeout_ms");
    json_t *r = json_object_get(entry, "reconcile_timeout_ms");
    /* a reconcile bound that follows the timeout keeps following it */
    if (t && r && json_equal(t, r))
      json_object_set_new(entry, "reconcile_timeout_ms", json_integer(timeout));
    json_object_set_new(entry, "timeout_ms", json_integer(timeout));
  }
  if (status)
    json_object_set_new(entry, "status", json_pack("{s:s}", "command", status));
  text = json_dumps(doc, JSON_COMPACT);
  json_decref(doc);
  if (!text) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  rc = idem_policy_parse(text, strlen(text), path ? path : "the default policy",
                         &p);
  free(text);
  if (rc) {
    cli_err("%s with --timeout/--status: %s", path ? path : "the policy",
            p ? idem_policy_errmsg(p) : "out of memory");
    idem_policy_free(p);
    return rc == IDEM_POLICY ? EXIT_USAGE : EXIT_FAIL;
  }
  *out = p;
  return EXIT_OK;
}

int cmd_exec(int argc, char **argv) {
  static const struct option opts[] = {
      {"policy", required_argument, NULL, 'p'},
      {"log", required_argument, NULL, 'L'},
      {"session", required_argument, NULL, 's'},
      {"turn", required_argument, NULL, 'u'},
      {"call", required_argument, NULL, 'c'},
      {"tool", required_argument, NULL, 't'},
      {"args", required_argument, NULL, 'a'},
      {"timeout", required_argument, NULL, 'T'},
      {"status", required_argument, NULL, 'S'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  const char *policy_path = NULL, *log = NULL, *args = "{}", *status = NULL;
  idem_call call = {sizeof call, NULL, NULL, NULL, NULL, 0, NULL, 0};
  size_t timeout = 0;
  char *stdin_args = NULL;
  idem_policy *policy = NULL;
  idem_guard *g = NULL;
  idem_step *s = NULL;
  idem_tool_info rule = {.size = sizeof rule};
  exec_ctx x;
  cli_driver d;
  int ch, rc, code = EXIT_FAIL;

  while ((ch = getopt_long(argc, argv, "+:h", opts, NULL)) != -1) {
    switch (ch) {
    case 'p': policy_path = optarg; break;
    case 'L': log = optarg; break;
    case 's': call.session = optarg; break;
    case 'u': call.turn = optarg; break;
    case 'c': call.call_id = optarg; break;
    case 't': call.tool = optarg; break;
    case 'a': args = optarg; break;
    case 'T':
      if (cli_parse_size("--timeout", optarg, 1, 86400000, &timeout))
        return EXIT_USAGE;
      break;
    case 'S': status = optarg; break;
    case 'h': cli_print_usage(stdout, "exec"); return EXIT_OK;
    case ':':
      return cli_usage("exec", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("exec", "no option '%s' for exec", argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return cli_usage("exec", "the command to run is missing (after --)");
  x.command = argv + optind;
  x.ncommand = argc - optind;
  if ((rc = cli_call_input("exec", args, &call, &stdin_args))) return rc;
  if ((rc = load_policy(policy_path, call.tool, (long long)timeout, status,
                        &policy))) {
    free(stdin_args);
    return rc;
  }
  idem_policy_tool(policy, call.tool, &rule);

  if ((rc = idem_guard_open(log, policy, &g))) {
    cli_err("%s; the command was not run", idem_guard_errmsg(g));
    goto out;
  }
  /* the runner, not this process, executes each attempt (runner.c) */
  idem_guard_set(g, IDEM_GUARD_EXECUTOR_HANDS_IN, 1);
  if ((rc = idem_guard_begin(g, &call, &s))) {
    cli_err("%s; the command was not run", idem_guard_errmsg(g));
    goto out;
  }
  x.call = &call;
  x.rule = &rule;
  x.log = idem_guard_log(g); /* the runner opens the very log we use */
  x.front = idem_guard_owner(g);
  memset(&d, 0, sizeof d);
  d.execute = attempt;
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

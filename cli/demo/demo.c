/*
** demo.c - `idem demo`: the refund story of SPEC §1, end to end.
**
** A payment provider (the simulator idem-paysim, over real HTTP on
** loopback) and an agent harness (this program running `idem call` as
** child processes, one per tool call, on the embedded SQLite store) go
** through what makes agents refund twice: a refund that times out after
** the provider applied it, the transport's retry, the model re-issuing the
** call under a new call id, a harness killed mid-call and resumed, a
** provider that crashes, a refund that lands after its timeout at a
** provider that does not dedupe (SPEC §6a), a refund whose tool gives up
** on its own while the provider still applies it (ended is not
** finished), and a legitimate second refund.  Each step says
** what should happen and checks it; at the end the provider's own ledger
** is checked against what should have happened.  Exit 0 only when every
** step and the ledger match.
*/
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "cli.h"
#include "run/run.h"

extern char **environ;

#define SESSION "sess_demo"
#define TOOL "refund_payment"
#define LEGACY "legacy_refund" /* the same provider, without dedupe */

typedef struct demo {
  char dir[PATH_MAX], self[PATH_MAX], paysim[2 * PATH_MAX];
  char ledger[PATH_MAX + 32], portfile[PATH_MAX + 32], policy[PATH_MAX + 32];
  char log[PATH_MAX + 40], simlog[PATH_MAX + 32];
  int port;
  pid_t sim;
  int failures;
  const char *b, *g, *r, *d, *n; /* bold, green, red, dim, reset */
} demo;

static int remove_one(const char *path, const struct stat *st, int type,
                      struct FTW *ftw) {
  (void)st, (void)type, (void)ftw;
  remove(path);
  return 0;
}

/* ---- telling ------------------------------------------------------------------ */

/* Print text wrapped at 78 columns, each line indented by ind spaces. */
static void wrap(int ind, const char *text) {
  const char *p = text;
  while (*p) {
    size_t room = 78 - (size_t)ind, n = strlen(p), cut = n;
    if (n > room) {
      cut = room;
      while (cut > 0 && p[cut] != ' ') cut--;
      if (cut == 0) cut = room;
    }
    printf("%*s%.*s\n", ind, "", (int)cut, p);
    p += cut;
    while (*p == ' ') p++;
  }
}

static void step(demo *d, const char *title, const char *what) {
  printf("\n%s%s%s\n", d->b, title, d->n);
  wrap(3, what);
}

static void expect(demo *d, int ok, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void expect(demo *d, int ok, const char *fmt, ...) {
  char line[600];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(line, sizeof line, fmt, ap);
  va_end(ap);
  printf("   %s%s %s%s\n", ok ? d->g : d->r, ok ? "ok:" : "MISMATCH:", line,
         d->n);
  if (!ok) d->failures++;
  fflush(stdout);
}

/* ---- the provider ------------------------------------------------------------- */

static int find_paysim(demo *d, const char *given) {
  const char *slash = strrchr(d->self, '/');
  int len = slash ? (int)(slash - d->self) : 1;
  const char *env = getenv("IDEM_PAYSIM");
  if (env && !*env) env = NULL;
  const char *const rel[] = {"idem-paysim", "examples/paysim/idem-paysim",
                             "../examples/paysim/idem-paysim"};
  size_t i;
  if (given || env) {
    snprintf(d->paysim, sizeof d->paysim, "%s", given ? given : env);
    return access(d->paysim, X_OK) == 0 ? 0 : -1;
  }
  for (i = 0; i < sizeof rel / sizeof *rel; i++) {
    snprintf(d->paysim, sizeof d->paysim, "%.*s/%s", len, slash ? d->self : ".",
             rel[i]);
    if (access(d->paysim, X_OK) == 0) return 0;
  }
  snprintf(d->paysim, sizeof d->paysim, "idem-paysim"); /* from PATH */
  return 0;
}

static int read_port(const char *path) {
  FILE *f = fopen(path, "r");
  int port = 0;
  if (!f) return 0;
  if (fscanf(f, "%d", &port) != 1) port = 0;
  fclose(f);
  return port;
}

/* Start the provider (on d->port, or a free port when 0) and wait until it
** listens. */
static int sim_start(demo *d) {
  char port[16];
  char *argv[] = {d->paysim,      (char *)"--ledger",
                  d->ledger,      (char *)"--port",
                  port,           (char *)"--port-file",
                  d->portfile,    (char *)"--stall-ms",
                  (char *)"3000", NULL};
  posix_spawn_file_actions_t fa;
  long long until = cli_mono_ms() + 10000;
  int rc;
  snprintf(port, sizeof port, "%d", d->port);
  unlink(d->portfile);
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_addopen(&fa, 1, d->simlog,
                                   O_WRONLY | O_CREAT | O_APPEND, 0600);
  posix_spawn_file_actions_adddup2(&fa, 1, 2);
  rc = posix_spawnp(&d->sim, d->paysim, &fa, NULL, argv, environ);
  posix_spawn_file_actions_destroy(&fa);
  if (rc) {
    cli_err("cannot start the payment-provider simulator %s: %s", d->paysim,
            strerror(rc));
    d->sim = 0;
    return -1;
  }
  while (cli_mono_ms() < until) {
    int st, p = read_port(d->portfile);
    if (p > 0) {
      d->port = p;
      return 0;
    }
    if (waitpid(d->sim, &st, WNOHANG) == d->sim) {
      cli_err("the simulator exited at start; see %s", d->simlog);
      d->sim = 0;
      return -1;
    }
    cli_sleep_ms(20);
  }
  cli_err("the simulator did not start listening within 10 s; see %s",
          d->simlog);
  return -1;
}

/* Wait up to ms for the provider to end; 1 when it has (reaped). */
static int sim_reap(demo *d, int ms, int *status) {
  long long until = cli_mono_ms() + ms;
  while (d->sim > 0) {
    if (waitpid(d->sim, status, WNOHANG) == d->sim) {
      d->sim = 0;
      return 1;
    }
    if (cli_mono_ms() >= until) return 0;
    cli_sleep_ms(10);
  }
  return 1;
}

static void sim_stop(demo *d) {
  int st;
  if (d->sim <= 0) return;
  kill(d->sim, SIGTERM);
  if (!sim_reap(d, 5000, &st)) {
    kill(d->sim, SIGKILL);
    sim_reap(d, 5000, &st);
  }
}

/* POST /_mode: how the provider misbehaves on the next count refunds (0:
** until changed); dedupe 0 or 1 turns its dedupe on the key off or on
** (-1: as it is).  The control endpoint is a tool too: a read_only HTTP
** tool of a small policy of the demo's own, run in this process by the
** library (idem_guard_run) - the public API, the same executor as every
** refund of the story; a read_only call records nothing in the log. */
static int sim_mode_ex(demo *d, const char *mode, int count, int dedupe,
                       int stall_ms) {
  char policy[256], args[160], cnt[32] = "", stall[32] = "", call_id[32],
                                *env = NULL;
  static int n;
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  idem_call call;
  size_t len = 0;
  int ok = 0;
  snprintf(policy, sizeof policy,
           "{\"tools\": {\"paysim_mode\": {\"class\": \"read_only\", "
           "\"timeout_ms\": 5000, \"retries\": 0, \"http\": {\"method\": "
           "\"POST\", \"url\": \"http://127.0.0.1:%d/_mode\"}}}}",
           d->port);
  if (count > 0) snprintf(cnt, sizeof cnt, ",\"count\":%d", count);
  if (stall_ms > 0)
    snprintf(stall, sizeof stall, ",\"stall_ms\":%d", stall_ms);
  snprintf(args, sizeof args, "{\"mode\":\"%s\"%s%s%s}", mode, cnt, stall,
           dedupe < 0   ? ""
           : dedupe > 0 ? ",\"dedupe\":true"
                        : ",\"dedupe\":false");
  snprintf(call_id, sizeof call_id, "mode_%d", ++n);
  memset(&call, 0, sizeof call);
  call.size = sizeof call;
  call.session = "demo_control";
  call.call_id = call_id;
  call.tool = "paysim_mode";
  call.args = args;
  call.args_len = strlen(args);
  if (idem_policy_parse(policy, strlen(policy), "the demo's control policy",
                        &p) != IDEM_OK)
    cli_err("%s", p ? idem_policy_errmsg(p) : "out of memory");
  else if (idem_guard_open(d->log, p, &g) != IDEM_OK ||
           idem_guard_run(g, &call, NULL, &env, &len) != IDEM_OK)
    cli_err("the simulator's mode %s: %s", mode, idem_guard_errmsg(g));
  else if (!(ok = strstr(env, "\"status\":\"succeeded\"") != NULL))
    cli_err("the simulator refused mode %s: %.*s", mode, (int)len, env);
  idem_free(env);
  idem_guard_close(g);
  idem_policy_free(p);
  return ok ? 0 : -1;
}

static int sim_mode(demo *d, const char *mode, int count) {
  return sim_mode_ex(d, mode, count, -1, 0);
}

/* The provider's ledger: refunds of order (all when NULL), their amounts
** summed into *cents; keys that appear twice counted into *twice. */
static int ledger_count(demo *d, const char *order, long long *cents,
                        int *twice, int print) {
  FILE *f = fopen(d->ledger, "r");
  char line[4096], keys[64][300];
  int n = 0, nkeys = 0, i;
  if (cents) *cents = 0;
  if (twice) *twice = 0;
  if (!f) return 0;
  while (fgets(line, sizeof line, f)) {
    json_error_t err;
    json_t *o = json_loads(line, 0, &err);
    const char *oid = json_string_value(json_object_get(o, "order_id"));
    const char *key = json_string_value(json_object_get(o, "idempotency_key"));
    long long amt = json_integer_value(json_object_get(o, "amount_cents"));
    if (o && oid && (!order || strcmp(order, oid) == 0)) {
      n++;
      if (cents) *cents += amt;
      for (i = 0; key && i < nkeys; i++)
        if (strcmp(keys[i], key) == 0 && twice) (*twice)++;
      if (key && nkeys < 64) snprintf(keys[nkeys++], sizeof keys[0], "%s", key);
      if (print)
        printf("   %-10s %-9s %7lld.%02lld  %s\n",
               json_string_value(json_object_get(o, "id")), oid, amt / 100,
               amt % 100, key ? key : "(no key)");
    }
    json_decref(o);
  }
  fclose(f);
  return n;
}

/* ---- the harness ---------------------------------------------------------------- */

/* Run this program with argv (its own verbs) and envp (NULL: ours), its
** stdout and stderr together in res->out; killed after a minute. */
static int run_idem(char *const *argv, char *const *envp, cli_run_result *res) {
  cli_run_opts o;
  memset(&o, 0, sizeof o);
  o.argv = argv;
  o.envp = envp;
  o.deadline_ms = 60000;
  o.kill_on_deadline = 1;
  o.max_output = (size_t)1 << 20;
  o.merge_stderr = 1;
  return cli_run(&o, res);
}

/* One tool call of the harness: `idem call` in a child process (so that it
** can be killed at a crash point).  Prints what idem did and what the
** model gets back; returns the envelope's status ("killed" when the child
** was killed), in buf. */
static const char *harness_tool(demo *d, const char *tool, const char *call_id,
                                const char *args, const char *crash_at,
                                char *buf, size_t n) {
  char *argv[] = {d->self,
                  (char *)"call",
                  (char *)"--verbose",
                  (char *)"--policy",
                  d->policy,
                  (char *)"--log",
                  d->log,
                  (char *)"--session",
                  (char *)SESSION,
                  (char *)"--call",
                  (char *)call_id,
                  (char *)"--tool",
                  (char *)tool,
                  (char *)"--args",
                  (char *)args,
                  NULL};
  char crash[128], **envp = NULL;
  cli_run_result res;
  size_t ne = 0, i;
  char *line, *save = NULL;
  snprintf(buf, n, "?");
  if (crash_at) {
    while (environ[ne]) ne++;
    if (!(envp = calloc(ne + 2, sizeof *envp))) return buf;
    for (i = 0; i < ne; i++) envp[i] = environ[i];
    snprintf(crash, sizeof crash, "IDEM_CRASH_AT=%s", crash_at);
    envp[ne] = crash;
  }
  printf("   %s$ idem call --session %s --call %s --tool %s --args '%s'%s%s\n",
         d->d, SESSION, call_id, tool, args,
         crash_at ? "   # IDEM_CRASH_AT=" : "", crash_at ? crash_at : "");
  printf("%s", d->n);
  fflush(stdout);
  if (run_idem(argv, envp, &res) != 0) {
    cli_err("cannot run idem call: %s", strerror(errno));
    free(envp);
    return buf;
  }
  free(envp);
  for (line = strtok_r(res.out ? res.out : (char *)"", "\n", &save); line;
       line = strtok_r(NULL, "\n", &save)) {
    if (line[0] == '{') {
      json_error_t err;
      json_t *env = json_loads(line, 0, &err);
      const char *st = json_string_value(json_object_get(env, "status"));
      const char *msg = json_string_value(json_object_get(env, "message"));
      json_t *result = json_object_get(env, "result");
      snprintf(buf, n, "%s", st ? st : "?");
      printf("   the model gets: %s%s%s%s\n", d->b, buf,
             json_is_true(json_object_get(env, "replayed")) ? " (replayed)"
                                                            : "",
             d->n);
      if (json_is_object(result) && json_object_get(result, "id"))
        printf("     result: refund %s\n",
               json_string_value(json_object_get(result, "id")));
      if (msg) {
        char m[1200];
        snprintf(m, sizeof m, "message: \"%s\"", msg);
        wrap(5, m);
      }
      json_decref(env);
    } else {
      printf("     %s. %s%s\n", d->d,
             strncmp(line, "idem: ", 6) == 0 ? line + 6 : line, d->n);
    }
  }
  if (res.signal) {
    printf("     %s. the harness was killed (signal %d)%s\n", d->d, res.signal,
           d->n);
    snprintf(buf, n, "killed");
  }
  free(res.out);
  fflush(stdout);
  return buf;
}

static const char *harness(demo *d, const char *call_id, const char *args,
                           const char *crash_at, char *buf, size_t n) {
  return harness_tool(d, TOOL, call_id, args, crash_at, buf, n);
}

/* `idem recover` with the demo's log and policy; prints its answer. */
static int recover(demo *d, char *out, size_t n) {
  char *argv[] = {d->self, (char *)"recover",  (char *)"--log",
                  d->log,  (char *)"--policy", d->policy,
                  NULL};
  cli_run_result res;
  snprintf(out, n, "?");
  printf("   %s$ idem recover --policy policy.json%s\n", d->d, d->n);
  if (run_idem(argv, NULL, &res) != 0) return -1;
  if (res.out) {
    size_t len = strcspn(res.out, "\n");
    snprintf(out, n, "%.*s", (int)len, res.out);
    printf("     %s\n", out);
  }
  free(res.out);
  return res.exited && res.exit_code == 0 ? 0 : -1;
}

/* ---- the story ---------------------------------------------------------------- */

static int write_policy(demo *d) {
  FILE *f = fopen(d->policy, "w");
  if (!f) return -1;
  fprintf(
      f,
      "{\n"
      "  \"unknown_tools\": \"refuse\",\n"
      "  \"tools\": {\n"
      "    \"refund_payment\": {\n"
      "      \"class\": \"guarded\", \"timeout_ms\": 1000, \"retries\": 2,\n"
      "      \"backoff_ms\": 100, \"provider_dedupes\": true,\n"
      "      \"fence\": [\"order_id\"], \"reconcile_timeout_ms\": 2000,\n"
      "      \"http\": {\"method\": \"POST\",\n"
      "               \"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
      "      \"status\": {\"tool\": \"list_refunds\",\n"
      "                 \"arguments\": {\"order_id\": \"{order_id}\"},\n"
      "                 \"applied_when\": \"key_present\"}\n"
      "    },\n"
      "    \"legacy_refund\": {\n"
      "      \"class\": \"guarded\", \"timeout_ms\": 1000, \"retries\": 2,\n"
      "      \"backoff_ms\": 100, \"provider_dedupes\": false,\n"
      "      \"fence\": [\"order_id\"], \"reconcile_timeout_ms\": 2000,\n"
      "      \"http\": {\"method\": \"POST\",\n"
      "               \"url\": \"http://127.0.0.1:%d/v1/refunds\"},\n"
      "      \"status\": {\"tool\": \"list_refunds\",\n"
      "                 \"arguments\": {\"order_id\": \"{order_id}\"},\n"
      "                 \"applied_when\": \"key_present\"}\n"
      "    },\n"
      "    \"list_refunds\": {\n"
      "      \"class\": \"read_only\", \"timeout_ms\": 2000,\n"
      "      \"http\": {\"url\": "
      "\"http://127.0.0.1:%d/v1/refunds?order_id={order_id}\"}\n"
      "    }\n"
      "  }\n"
      "}\n",
      d->port, d->port, d->port);
  return fclose(f) == 0 ? 0 : -1;
}

/* Wait (15 s at most) for the provider to apply a refund of order that it
** held or queued since t0, and say when it did. */
static void await_landing(demo *d, const char *order, long long t0,
                          const char *how) {
  while (cli_mono_ms() - t0 < 15000 &&
         ledger_count(d, order, NULL, NULL, 0) == 0)
    cli_sleep_ms(50);
  printf("   %.1f s after it was sent, the provider applies the %s refund.\n",
         (double)(cli_mono_ms() - t0) / 1000, how);
}

static void check_ledger(demo *d, const char *order, int want,
                         const char *why) {
  int n = ledger_count(d, order, NULL, NULL, 0);
  expect(d, n == want, "the provider's ledger has %d refund%s for %s%s%s", n,
         n == 1 ? "" : "s", order, why ? " " : "", why ? why : "");
}

#define A1                                                                     \
  "{\"order_id\":\"ord_1001\",\"amount_cents\":6000,\"reason\":\"late "        \
  "delivery\"}"
#define A1_REFORMATTED                                                         \
  "{ \"reason\": \"late delivery\", \"amount_cents\": 6000.0, \"order_id\": "  \
  "\"ord_1001\" }"
#define A2                                                                     \
  "{\"order_id\":\"ord_1002\",\"amount_cents\":4500,\"reason\":\"damaged\"}"
#define A3                                                                     \
  "{\"order_id\":\"ord_1003\",\"amount_cents\":2599,\"reason\":\"missing "     \
  "item\"}"
#define A4                                                                     \
  "{\"order_id\":\"ord_1001\",\"amount_cents\":1000,\"reason\":\"goodwill\"}"
#define A5                                                                     \
  "{\"order_id\":\"ord_1004\",\"amount_cents\":3250,\"reason\":\"wrong "       \
  "size\"}"
#define A6                                                                     \
  "{\"order_id\":\"ord_1005\",\"amount_cents\":1875,\"reason\":\"late "        \
  "refund\"}"

static void story(demo *d) {
  char st[64], out[256];
  int status = 0, twice = 0, total;
  long long cents = 0;

  step(d, "1. The agent refunds order ord_1001 (60.00) - tool call toolu_01.",
       "The provider applies the refund, then stalls past idem's deadline of "
       "1 s. idem records the attempt before sending, and treats the timeout "
       "as 'outcome unknown', never as 'failed'. The transport retries with "
       "the same Idempotency-Key (the provider dedupes on it), then idem "
       "asks the provider's status endpoint.");
  if (sim_mode(d, "stall", 1)) d->failures++;
  harness(d, "toolu_01", A1, NULL, st, sizeof st);
  expect(d, strcmp(st, "succeeded") == 0,
         "succeeded, settled by the status check (got %s)", st);
  check_ledger(d, "ord_1001", 1, NULL);

  step(d, "2. The harness's transport repeats the same call.",
       "Same call id, arguments reformatted (members reordered, 6000.0): the "
       "same action under RFC 8785, so idem replays the recorded outcome and "
       "nothing goes downstream.");
  harness(d, "toolu_01", A1_REFORMATTED, NULL, st, sizeof st);
  expect(d, strcmp(st, "succeeded") == 0, "the recorded outcome, replayed");
  check_ledger(d, "ord_1001", 1, "(still)");

  step(d, "3. The harness crashes mid-call: order ord_1002 (45.00), toolu_02.",
       "The provider applies the refund and answers, but the harness is "
       "killed (SIGKILL) before idem can record the answer. The attempt log "
       "holds a pending record whose owner is dead.");
  harness(d, "toolu_02", A2, "after_downstream_return", st, sizeof st);
  expect(d, strcmp(st, "killed") == 0, "the harness died mid-call");
  check_ledger(d, "ord_1002", 1, "(applied before the crash)");

  step(d,
       "4. After context compaction the model asks again: a new call id, "
       "toolu_03.",
       "A new call id for the same order: the fence. idem finds the earlier "
       "action of toolu_02 unsettled, takes it over (its owner is gone), "
       "checks it with the provider, and answers already_applied.");
  harness(d, "toolu_03", A2, NULL, st, sizeof st);
  expect(d, strcmp(st, "already_applied") == 0,
         "already_applied, not a second refund (got %s)", st);
  check_ledger(d, "ord_1002", 1, "(still)");

  step(d,
       "5. The harness restarts and replays its interrupted turn (toolu_02).",
       "The record of toolu_02 was settled in step 4: a replay.");
  harness(d, "toolu_02", A2, NULL, st, sizeof st);
  expect(d, strcmp(st, "succeeded") == 0, "the settled outcome, replayed");
  check_ledger(d, "ord_1002", 1, "(still)");

  step(d, "6. The provider crashes: order ord_1003 (25.99), toolu_04.",
       "The provider writes the refund to its ledger and dies before "
       "answering. The retries find the port closed (that says nothing "
       "about the first attempt), and the status check cannot reach the "
       "provider either: the model is told the outcome is unknown and not "
       "to call again.");
  if (sim_mode(d, "crash", 1)) d->failures++;
  harness(d, "toolu_04", A3, NULL, st, sizeof st);
  sim_reap(d, 5000, &status);
  expect(d, strcmp(st, "outcome_unknown") == 0,
         "outcome_unknown, with what to do next (got %s)", st);
  check_ledger(d, "ord_1003", 1, "(applied before the crash)");

  step(
      d,
      "7. The model re-issues it anyway, toolu_05, while the provider is down.",
      "Fenced: the earlier refund of ord_1003 is still in doubt, so the new "
      "call does not go downstream.");
  harness(d, "toolu_05", A3, NULL, st, sizeof st);
  expect(d, strcmp(st, "outcome_unknown") == 0,
         "fenced, outcome_unknown naming the earlier call (got %s)", st);
  check_ledger(d, "ord_1003", 1, "(still)");

  step(d, "8. The provider comes back; the operator runs idem recover.",
       "Every record in doubt is checked against the provider's status "
       "endpoint and settled. Recovery never re-sends a refund.");
  if (sim_start(d) == 0) {
    recover(d, out, sizeof out);
    expect(d, strstr(out, "1 applied") != NULL,
           "the refund of toolu_04 "
           "is settled as applied");
  } else {
    d->failures++;
  }
  harness(d, "toolu_05", A3, NULL, st, sizeof st);
  expect(d, strcmp(st, "already_applied") == 0,
         "the model's re-issue is now answered already_applied (got %s)", st);
  check_ledger(d, "ord_1003", 1, "(still)");

  step(d,
       "9. A refund that lands after the timeout: order ord_1004 (32.50), "
       "toolu_06.",
       "This refund goes through legacy_refund, an endpoint of the provider "
       "that ignores the Idempotency-Key, so a second attempt would be a "
       "second refund (its policy says provider_dedupes false: no blind "
       "retry). The provider holds the request past idem's deadline and "
       "applies it only later. At the deadline the status check finds "
       "nothing yet, which proves only that the refund has not landed YET: "
       "idem does not send it again, and the model is told the outcome is "
       "unknown.");
  if (sim_mode_ex(d, "late", 1, 0, 0)) d->failures++;
  {
    long long t0 = cli_mono_ms();
    harness_tool(d, LEGACY, "toolu_06", A5, NULL, st, sizeof st);
    expect(d, strcmp(st, "outcome_unknown") == 0,
           "outcome_unknown, and nothing sent again (got %s)", st);
    check_ledger(d, "ord_1004", 0, "(not yet: the provider still holds it)");
    await_landing(d, "ord_1004", t0, "held");
    check_ledger(d, "ord_1004", 1, "(it landed after the timeout)");
  }
  wrap(3, "The model re-issues the refund under a new call id, toolu_07. "
          "The fence: idem checks the earlier call with the provider first, "
          "and it has landed now.");
  harness_tool(d, LEGACY, "toolu_07", A5, NULL, st, sizeof st);
  expect(d, strcmp(st, "already_applied") == 0,
         "already_applied, not a second refund (got %s)", st);
  check_ledger(d, "ord_1004", 1, "(still)");

  step(d,
       "10. The refund tool gives up on its own: order ord_1005 (18.75), "
       "toolu_09.",
       "A client deadline can expire long after the processor accepted. "
       "Here the provider's gateway answers 504 Gateway Timeout at once, "
       "while the refund waits in the provider's queue and is applied a "
       "moment later. The attempt has ended, but with no verdict: a 504 "
       "says nothing about the refund. The status check finds nothing yet, "
       "so idem neither sends it again nor says failed: outcome unknown.");
  if (sim_mode_ex(d, "queued", 1, 0, 1500)) d->failures++;
  {
    long long t0 = cli_mono_ms();
    harness_tool(d, LEGACY, "toolu_09", A6, NULL, st, sizeof st);
    expect(d, strcmp(st, "outcome_unknown") == 0,
           "outcome_unknown, not failed, and nothing sent again (got %s)", st);
    check_ledger(d, "ord_1005", 0, "(not yet: it waits in the queue)");
    wrap(3, "The model re-issues it at once, toolu_10: fenced, since the "
            "first attempt may still land.");
    harness_tool(d, LEGACY, "toolu_10", A6, NULL, st, sizeof st);
    expect(d, strcmp(st, "outcome_unknown") == 0,
           "outcome_unknown naming toolu_09, nothing sent (got %s)", st);
    await_landing(d, "ord_1005", t0, "queued");
    check_ledger(d, "ord_1005", 1, "(it landed after the 504)");
  }
  wrap(3, "The model asks once more, toolu_11: the status check finds the "
          "refund now.");
  harness_tool(d, LEGACY, "toolu_11", A6, NULL, st, sizeof st);
  expect(d, strcmp(st, "already_applied") == 0,
         "already_applied, not a second refund (got %s)", st);
  check_ledger(d, "ord_1005", 1, "(still)");
  if (sim_mode_ex(d, "normal", 0, 1, 0)) d->failures++; /* dedupe again */

  step(d,
       "11. A genuinely new decision: a goodwill refund of 10.00 on "
       "ord_1001, toolu_08.",
       "The model was told the first refund of ord_1001 succeeded (step 1), "
       "so a new refund of that order is a new decision, and it goes through.");
  harness(d, "toolu_08", A4, NULL, st, sizeof st);
  expect(d, strcmp(st, "succeeded") == 0, "succeeded (got %s)", st);
  check_ledger(d, "ord_1001", 2, "(60.00 and 10.00)");

  printf("\n%sThe provider's ledger%s (%s)\n", d->b, d->n, d->ledger);
  total = ledger_count(d, NULL, &cents, &twice, 1);
  expect(d,
         total == 6 && cents == 6000 + 4500 + 2599 + 3250 + 1875 + 1000 &&
             twice == 0,
         "%d refunds, %lld.%02lld in all, no key applied twice (want 6, "
         "192.24)",
         total, cents / 100, cents % 100);
}

int cmd_demo(int argc, char **argv) {
  static const struct option opts[] = {{"paysim", required_argument, NULL, 'P'},
                                       {"keep", no_argument, NULL, 'k'},
                                       {"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  const char *paysim = NULL, *tmp = getenv("TMPDIR");
  demo d;
  long long t0 = cli_mono_ms();
  ssize_t n;
  int ch, keep = 0, color = isatty(1) && !getenv("NO_COLOR");

  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'P': paysim = optarg; break;
    case 'k': keep = 1; break;
    case 'h': cli_print_usage(stdout, "demo"); return EXIT_OK;
    case ':':
      return cli_usage("demo", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("demo", "no option '%s' for demo", argv[optind - 1]);
    }
  }
  if (optind < argc) return cli_usage("demo", "too many arguments");
  memset(&d, 0, sizeof d);
  if (idem_http_missing()) { /* the demo is HTTP calls */
    cli_err("%s", idem_http_missing());
    return EXIT_FAIL;
  }
  d.b = color ? "\033[1m" : "";
  d.g = color ? "\033[32m" : "";
  d.r = color ? "\033[31m" : "";
  d.d = color ? "\033[2m" : "";
  d.n = color ? "\033[0m" : "";
  if ((n = readlink("/proc/self/exe", d.self, sizeof d.self - 1)) <= 0) {
    cli_err("cannot find this program: %s", strerror(errno));
    return EXIT_FAIL;
  }
  d.self[n] = '\0';
  if (find_paysim(&d, paysim)) {
    cli_err("the simulator %s is not an executable (--paysim PATH, or "
            "IDEM_PAYSIM)",
            d.paysim);
    return EXIT_USAGE;
  }
  snprintf(d.dir, sizeof d.dir, "%s/idem-demo.XXXXXX",
           tmp && *tmp ? tmp : "/tmp");
  if (!mkdtemp(d.dir)) {
    cli_err("cannot make a directory in %s: %s", tmp && *tmp ? tmp : "/tmp",
            strerror(errno));
    return EXIT_FAIL;
  }
  snprintf(d.ledger, sizeof d.ledger, "%s/ledger.jsonl", d.dir);
  snprintf(d.portfile, sizeof d.portfile, "%s/paysim.port", d.dir);
  snprintf(d.policy, sizeof d.policy, "%s/policy.json", d.dir);
  snprintf(d.log, sizeof d.log, "sqlite:%s/attempts.db", d.dir);
  snprintf(d.simlog, sizeof d.simlog, "%s/paysim.log", d.dir);
  signal(SIGPIPE, SIG_IGN);

  printf("%sidem demo%s: an agent refunds a customer, and everything that "
         "usually\nmakes it refund twice happens.\n",
         d.b, d.n);
  if (sim_start(&d) != 0 || write_policy(&d) != 0) {
    sim_stop(&d);
    cli_err("the demo could not start; its files are in %s", d.dir);
    return EXIT_FAIL;
  }
  printf("   payment provider: idem-paysim on 127.0.0.1:%d (its ledger: %s)\n"
         "   attempt log:      %s (the embedded SQLite store)\n"
         "   policy:           %s\n",
         d.port, d.ledger, d.log + 7, d.policy);
  story(&d);
  sim_stop(&d);

  printf("\n");
  if (d.failures == 0)
    printf("%s%sEvery step as expected: each refund applied exactly once, "
           "the goodwill refund too.%s (%.1f s)\n",
           d.b, d.g, d.n, (double)(cli_mono_ms() - t0) / 1000);
  else
    printf("%s%s%d step%s did not go as expected.%s Files kept in %s\n", d.b,
           d.r, d.failures, d.failures == 1 ? "" : "s", d.n, d.dir);
  if (d.failures == 0 && !keep) {
    nftw(d.dir, remove_one, 16, FTW_DEPTH | FTW_PHYS);
  } else if (keep) {
    printf("Files kept in %s\n"
           "See the story's actions in the console:\n"
           "   %s serve --log %s --policy %s\n",
           d.dir, d.self, d.log, d.policy);
  }
  fflush(stdout);
  return d.failures == 0 ? EXIT_OK : EXIT_FAIL;
}

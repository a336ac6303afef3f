/*
** turn_race.c - one model turn, one refund (SPEC §6.4): N identical calls
** of one turn, each under its own call id, started at once against a tool
** that applies in microseconds, must apply once, whatever their order.
**
**   turn_race LOG threads|procs RUNS [N]
**
** Each run takes a fresh session and makes, in order:
**   1. N calls of turn "t1" (call ids c0 .. cN-1), all released at once:
**      by threads of one guard, or by N processes with a guard each;
**      exactly one applies (succeeded) and the others answer
**      already_applied with duplicate_of naming it and its result;
**   2. one call of turn "t2", after the model was told: it applies (a
**      later turn's repeat is a new decision);
**   3. in a second session, N calls without a turn id, released at once:
**      one application (they began within coalesce_ms, 1000 here: wide,
**      so that 16 processes of a sanitizer build on 2 busy cores still
**      begin inside it), and one more call without a turn id after
**      1100 ms: it applies.
** The tool appends one line per application to a ledger file (O_APPEND);
** after every run the ledger is counted.  Exit 0 when every run held; 1,
** with what did not, when one did not.
*/
#define _GNU_SOURCE
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

#define MAX_N 64

static const char POLICY[] =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\",\"timeout_ms\":"
    "10000,\"wait_ms\":10000,\"coalesce_ms\":1000}}}";
static const char ARGS[] = "{\"order_id\":\"ord_1\",\"amount_cents\":6000}";

static int g_ledger = -1;
static const char *g_log;
static char g_self[4096];
static int failures;

static int refund(void *ctx, const char *key, const char *args, size_t len,
                  char **result, char **error) {
  char line[400];
  int n = snprintf(line, sizeof line, "%s\n", key);
  (void)ctx, (void)args, (void)len, (void)error;
  if (write(g_ledger, line, (size_t)n) != n) return IDEM_OUTCOME_UNKNOWN;
  static const char res[] = "{\"refund_id\":\"re_1\"}";
  if ((*result = idem_malloc(sizeof res))) memcpy(*result, res, sizeof res);
  return IDEM_OUTCOME_APPLIED;
}

static void fail(const char *what, const char *detail, int run) {
  fprintf(stderr, "run %d: %s%s%s\n", run, what, detail ? ": " : "",
          detail ? detail : "");
  failures++;
}

/* One call; its envelope (free()) or NULL. */
static char *one(idem_guard *g, const char *session, const char *call_id,
                 const char *turn) {
  idem_call c = {sizeof c, session,      call_id, "refund_payment",
                 ARGS,     strlen(ARGS), turn, 0};
  idem_tool t = {sizeof t, refund, NULL, NULL};
  char *env = NULL, *copy;
  size_t len;
  if (idem_guard_call(g, &c, &t, &env, &len) != IDEM_OK) {
    fprintf(stderr, "%s/%s: %s\n", session, call_id, idem_guard_errmsg(g));
    return NULL;
  }
  copy = strdup(env);
  idem_free(env);
  return copy;
}

static long ledger_lines(void) {
  char buf[65536];
  long n = 0;
  ssize_t k;
  lseek(g_ledger, 0, SEEK_SET);
  while ((k = read(g_ledger, buf, sizeof buf)) > 0)
    for (ssize_t i = 0; i < k; i++) n += buf[i] == '\n';
  lseek(g_ledger, 0, SEEK_END);
  return n;
}

/* ---- N callers at once ------------------------------------------------------ */

typedef struct caller {
  idem_guard *g;
  const char *session, *turn;
  char call_id[16];
  char *env;
  pthread_barrier_t *go;
} caller;

static void *caller_main(void *arg) {
  caller *c = arg;
  pthread_barrier_wait(c->go);
  c->env = one(c->g, c->session, c->call_id, c->turn);
  return NULL;
}

/* N identical calls of turn (NULL: none) released together; their
** envelopes into envs[]. */
static void burst(idem_guard *g, int procs, const char *session,
                  const char *turn, int n, char **envs) {
  caller cs[MAX_N];
  pthread_t th[MAX_N];
  pthread_barrier_t go;
  int i;
  if (!procs) {
    pthread_barrier_init(&go, NULL, (unsigned)n);
    for (i = 0; i < n; i++) {
      cs[i].g = g;
      cs[i].session = session;
      cs[i].turn = turn;
      cs[i].go = &go;
      snprintf(cs[i].call_id, sizeof cs[i].call_id, "c%d", i);
      pthread_create(&th[i], NULL, caller_main, &cs[i]);
    }
    for (i = 0; i < n; i++) {
      pthread_join(th[i], NULL);
      envs[i] = cs[i].env;
    }
    pthread_barrier_destroy(&go);
    return;
  }
  {
    /* processes: each is this program again (exec: a fork of a process
    ** whose log threads run may take no lock), opens its own guard, says
    ** so on the ready pipe, waits for the word (EOF on its stdin), makes
    ** its call and prints its envelope.  The word is given when every
    ** child is ready (or dead): a slow open would otherwise start a
    ** caller after the window its peers opened. */
    int start[2], ready[2], out[MAX_N][2], got_ready = 0;
    pid_t pid[MAX_N];
    char rfd[16], b;
    if (pipe(start) || pipe(ready)) exit(2);
    snprintf(rfd, sizeof rfd, "%d", ready[1]);
    setenv("TURN_RACE_READY_FD", rfd, 1);
    for (i = 0; i < n; i++) {
      char cid[16];
      snprintf(cid, sizeof cid, "c%d", i);
      if (pipe(out[i])) exit(2);
      if ((pid[i] = fork()) == 0) {
        char *av[] = {g_self,        (char *)g_log, "child", (char *)session,
                      cid,           (char *)(turn ? turn : "-"), NULL};
        close(start[1]);
        close(ready[0]);
        close(out[i][0]);
        if (dup2(start[0], 0) < 0 || dup2(out[i][1], 1) < 0) _exit(3);
        execv(g_self, av);
        _exit(3);
      }
      close(out[i][1]);
    }
    close(start[0]);
    close(ready[1]);
    while (got_ready < n && read(ready[0], &b, 1) == 1) got_ready++;
    close(ready[0]);
    if (got_ready < n) fail("burst", "a caller did not open its guard", -1);
    close(start[1]); /* EOF: go */
    for (i = 0; i < n; i++) {
      char buf[8192];
      size_t got = 0;
      ssize_t k;
      while ((k = read(out[i][0], buf + got, sizeof buf - 1 - got)) > 0)
        got += (size_t)k;
      buf[got] = '\0';
      close(out[i][0]);
      waitpid(pid[i], NULL, 0);
      envs[i] = got ? strdup(buf) : NULL;
    }
  }
}

/* The burst's envelopes: one succeeded, the others already_applied naming
** it with its result. */
static void check_burst(char **envs, int n, int run, const char *what) {
  int i, ok = 0, dup = 0, who = -1;
  char want[64];
  for (i = 0; i < n; i++) {
    if (!envs[i]) {
      fail(what, "a call got no answer", run);
      continue;
    }
    if (strstr(envs[i], "{\"status\":\"succeeded\"")) {
      ok++;
      who = i;
    }
  }
  if (ok != 1) fail(what, "not exactly one call succeeded", run);
  snprintf(want, sizeof want, "\"duplicate_of\":\"c%d\"", who);
  for (i = 0; i < n; i++) {
    if (!envs[i] || i == who) continue;
    if (strstr(envs[i], "{\"status\":\"already_applied\"") &&
        strstr(envs[i], want) && strstr(envs[i], "\"refund_id\":\"re_1\""))
      dup++;
    else
      fail(what, envs[i], run); /* not already_applied naming the one */
  }
  if (dup != n - 1) fail(what, "not every other call was deduplicated", run);
  for (i = 0; i < n; i++) free(envs[i]);
}

int main(int argc, char **argv) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  char path[] = "/tmp/idem-turn-ledger-XXXXXX", session[64], *envs[MAX_N], *e;
  int runs, n = 16, procs, run;
  long before;
  if (argc < 4) {
    fprintf(stderr, "usage: turn_race LOG threads|procs RUNS [N]\n");
    return 2;
  }
  g_log = argv[1];
  if (strcmp(argv[2], "child") == 0 && argc == 6) {
    /* one caller of a burst: open, say ready, wait for the word, call,
    ** print */
    char b = 'r', *env;
    const char *fd = getenv("TURN_RACE_LEDGER_FD"); /* inherited */
    const char *ready = getenv("TURN_RACE_READY_FD");
    g_ledger = fd ? atoi(fd) : -1;
    if (idem_policy_parse(POLICY, strlen(POLICY), "policy", &p) ||
        idem_guard_open(g_log, p, &g))
      return 3;
    if (!ready || write(atoi(ready), &b, 1) != 1) return 3;
    close(atoi(ready));
    while (read(0, &b, 1) > 0) {
    }
    env = one(g, argv[3], argv[4], strcmp(argv[5], "-") ? argv[5] : NULL);
    if (env) fputs(env, stdout);
    free(env);
    idem_guard_close(g);
    idem_policy_free(p);
    return env ? 0 : 4;
  }
  {
    ssize_t k = readlink("/proc/self/exe", g_self, sizeof g_self - 1);
    if (k <= 0) return 2;
    g_self[k] = '\0';
  }
  procs = strcmp(argv[2], "procs") == 0;
  runs = atoi(argv[3]);
  if (argc > 4) n = atoi(argv[4]);
  if (n < 2 || n > MAX_N || runs < 1) return 2;
  if ((g_ledger = mkstemp(path)) < 0) return 2;
  unlink(path);
  fcntl(g_ledger, F_SETFL, O_APPEND | O_RDWR);
  {
    char fd[16];
    snprintf(fd, sizeof fd, "%d", g_ledger);
    setenv("TURN_RACE_LEDGER_FD", fd, 1);
  }
  if (idem_policy_parse(POLICY, strlen(POLICY), "policy", &p) ||
      idem_guard_open(g_log, p, &g)) {
    fprintf(stderr, "%s\n", idem_guard_errmsg(g));
    return 2;
  }
  for (run = 0; run < runs; run++) {
    snprintf(session, sizeof session, "turns-%d-%d-%s", (int)getpid(), run,
             argv[2]);
    /* 1. one turn, N calls at once */
    before = ledger_lines();
    burst(g, procs, session, "t1", n, envs);
    if (ledger_lines() - before != 1) fail("t1", "applied twice or never", run);
    check_burst(envs, n, run, "t1");
    /* 2. the next turn: a new decision.  Made a beat later, as a model's
    ** next turn is: each process reads a PostgreSQL log's clock once a
    ** second and credits the reading to the middle of its round trip, so
    ** two processes' clocks may differ by half a round trip - tens of ms
    ** on two loaded cores - and a call that seems to begin before the
    ** last burst's delivery is fenced (the safe side, SPEC §6.4) */
    if (procs) usleep(150000);
    before = ledger_lines();
    if (!(e = one(g, session, "d1", "t2")) ||
        !strstr(e, "{\"status\":\"succeeded\""))
      fail("t2: the next turn's repeat did not run", e, run);
    if (ledger_lines() - before != 1) fail("t2", "not one application", run);
    free(e);
    /* 3. no turn ids: the coalescing window */
    strcat(session, "-w");
    before = ledger_lines();
    burst(g, procs, session, NULL, n, envs);
    if (ledger_lines() - before != 1)
      fail("no turn, within coalesce_ms", "applied twice or never", run);
    check_burst(envs, n, run, "no turn, within coalesce_ms");
    if (run == 0 || run == runs - 1) { /* the window closes: twice is enough */
      /* past coalesce_ms by more than a PostgreSQL clock reading's error
      ** (half a round trip, which under ASan on two busy cores passed the
      ** 100 ms this margin once was) */
      usleep(1500000);
      before = ledger_lines();
      if (!(e = one(g, session, "late", NULL)) ||
          !strstr(e, "{\"status\":\"succeeded\""))
        fail("after coalesce_ms: the repeat did not run", e, run);
      if (ledger_lines() - before != 1)
        fail("after coalesce_ms", "not one application", run);
      free(e);
    }
  }
  idem_guard_close(g);
  idem_policy_free(p);
  printf("%d runs of %d %s: %s\n", runs, n, argv[2],
         failures ? "FAILED" : "one application per turn, every run");
  return failures ? 1 : 0;
}

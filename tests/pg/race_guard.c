/*
** race_guard.c - processes x threads racing the same actions and the same
** fence scopes through the guard (idem_guard_call) on one shared log.
**
**   race_guard LOG LEDGER PROCS THREADS ACTIONS
**
** Each of PROCS processes opens its own guard on LOG; each of its THREADS
** threads calls, for every action i, refund_payment on order o_i twice:
** once with the shared call id "a<i>" (the same action racing on every
** thread and host) and once with a call id of its own (a re-issue: the
** same fence scope, order_id, fence_scope global, a repeat window).  The
** tool appends the order to LEDGER (O_APPEND, one write per application).
** At the end the ledger must hold each order exactly once: one
** application per action and per fence scope, whoever raced.  Exit 0 when
** so, 1 with the counts when not.
*/
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "idem.h"

static const char POLICY[] =
    "{\"tools\":{\"refund_payment\":{\"class\":\"guarded\","
    "\"fence\":[\"order_id\"],\"fence_scope\":\"global\","
    "\"repeat_window_s\":3600,\"wait_ms\":20000}}}";

static int g_ledger = -1;

static int refund(void *ctx, const char *key, const char *args, size_t args_len,
                  char **result, char **error) {
  const char *o = strstr(args, "\"order_id\":\"");
  char line[64];
  int n;
  struct timespec t = {0, 2000000}; /* 2 ms: a window for the racers */
  (void)ctx, (void)key, (void)args_len, (void)error;
  if (!o) return IDEM_OUTCOME_REJECTED;
  o += strlen("\"order_id\":\"");
  n = snprintf(line, sizeof line, "%.*s\n", (int)strcspn(o, "\""), o);
  if (write(g_ledger, line, (size_t)n) != n) return IDEM_OUTCOME_UNKNOWN;
  nanosleep(&t, NULL);
  static const char res[] = "{\"refund_id\":\"re\"}";
  if ((*result = idem_malloc(sizeof res))) memcpy(*result, res, sizeof res);
  return IDEM_OUTCOME_APPLIED;
}

typedef struct worker {
  idem_guard *g;
  int proc, thread, actions, failures;
} worker;

static int one(worker *w, const char *call_id, int i) {
  idem_tool tool = {sizeof tool, refund, NULL, NULL};
  char args[96], *env = NULL;
  size_t len = 0;
  idem_call c = {
      .size = sizeof c}; /* every field, the ones a later version adds too */
  int rc;
  snprintf(args, sizeof args, "{\"order_id\":\"o_%d\",\"amount_cents\":6000}",
           i);
  c.session = "race";
  c.call_id = call_id;
  c.tool = "refund_payment";
  c.args = args;
  c.args_len = strlen(args);
  rc = idem_guard_call(w->g, &c, &tool, &env, &len);
  if (rc != IDEM_OK) {
    fprintf(stderr, "race_guard: %s: %s\n", call_id, idem_guard_errmsg(w->g));
    idem_free(env);
    return 1;
  }
  idem_free(env);
  return 0;
}

static void *worker_main(void *arg) {
  worker *w = arg;
  char call[64];
  int i;
  for (i = 0; i < w->actions; i++) {
    /* half the threads re-issue first, half race the shared id first */
    int k = (w->thread + i) % 2;
    snprintf(call, sizeof call, k ? "a%d" : "a%d-p%d-t%d", i, w->proc,
             w->thread);
    w->failures += one(w, call, i);
    snprintf(call, sizeof call, k ? "a%d-p%d-t%d" : "a%d", i, w->proc,
             w->thread);
    w->failures += one(w, call, i);
  }
  return NULL;
}

static int child(const char *log, int proc, int threads, int actions) {
  idem_policy *p = NULL;
  idem_guard *g = NULL;
  pthread_t th[64];
  worker w[64];
  int i, failures = 0;
  if (idem_policy_parse(POLICY, strlen(POLICY), "race", &p) != IDEM_OK) {
    fprintf(stderr, "race_guard: policy: %s\n", idem_policy_errmsg(p));
    return 2;
  }
  if (idem_guard_open(log, p, &g) != IDEM_OK) {
    fprintf(stderr, "race_guard: open: %s\n", idem_guard_errmsg(g));
    return 2;
  }
  for (i = 0; i < threads; i++) {
    w[i].g = g;
    w[i].proc = proc;
    w[i].thread = i;
    w[i].actions = actions;
    w[i].failures = 0;
    pthread_create(&th[i], NULL, worker_main, &w[i]);
  }
  for (i = 0; i < threads; i++) {
    pthread_join(th[i], NULL);
    failures += w[i].failures;
  }
  idem_guard_close(g);
  idem_policy_free(p);
  return failures ? 3 : 0;
}

int main(int argc, char **argv) {
  int procs, threads, actions, i, status, bad = 0, *count;
  pid_t pids[64];
  char line[64];
  FILE *f;
  if (argc != 6) {
    fprintf(stderr, "usage: race_guard LOG LEDGER PROCS THREADS ACTIONS\n");
    return 2;
  }
  procs = atoi(argv[3]);
  threads = atoi(argv[4]);
  actions = atoi(argv[5]);
  if (procs < 1 || procs > 64 || threads < 1 || threads > 64 || actions < 1)
    return 2;
  g_ledger = open(argv[2], O_WRONLY | O_CREAT | O_APPEND | O_TRUNC, 0644);
  if (g_ledger < 0) {
    perror(argv[2]);
    return 2;
  }
  for (i = 0; i < procs; i++)
    if ((pids[i] = fork()) == 0) _exit(child(argv[1], i, threads, actions));
  for (i = 0; i < procs; i++) {
    if (waitpid(pids[i], &status, 0) != pids[i] || !WIFEXITED(status) ||
        WEXITSTATUS(status) != 0) {
      fprintf(stderr, "race_guard: process %d ended with status %d\n", i,
              status);
      bad = 1;
    }
  }
  close(g_ledger);
  if (!(count = calloc((size_t)actions, sizeof *count)) ||
      !(f = fopen(argv[2], "r")))
    return 2;
  while (fgets(line, sizeof line, f)) {
    int o = -1;
    if (sscanf(line, "o_%d", &o) == 1 && o >= 0 && o < actions)
      count[o]++;
    else
      bad = 1;
  }
  fclose(f);
  for (i = 0; i < actions; i++)
    if (count[i] != 1) {
      fprintf(stderr, "race_guard: order o_%d applied %d times\n", i, count[i]);
      bad = 1;
    }
  printf("race_guard: %d processes x %d threads x %d actions (x2 call ids): "
         "%s\n",
         procs, threads, actions, bad ? "FAILED" : "each applied once");
  free(count);
  return bad;
}

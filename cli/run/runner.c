/*
** runner.c - `idem __run`: the executor of one attempt of `idem exec`
** (SPEC §6a).
**
** `idem exec` (the front end) answers its caller at the deadline; the
** command may go on running after that, and its result must still be
** recorded.  So the command is not the front end's child but the child of
** this runner, which holds the attempt from its start to its end:
**
**   1. It leaves the caller's world: a session of its own (setsid), no
**      file descriptor but the three pipes of the front end, so a caller
**      that reads its pipes to EOF is never held by the runner or the
**      command.  It reaps orphans of the command (a child subreaper).
**   2. It reads its input, "LEN\n" and LEN bytes of arguments; a front end
**      that died while writing it leaves it short, and nothing runs.
**   3. It forks the command into a process group of its own (pgid = its
**      pid), which dies with the runner (PR_SET_PDEATHSIG; its own
**      children do not, hence the group) and waits on a pipe for the word
**      to start.
**   4. It hands itself in as the attempt's executor and lease holder
**      (idem_guard_executor_lease): durably, under the front end's fencing
**      token, with the pgid.  If the action was taken over meanwhile (the
**      front end died, someone resumed), the command is killed before it
**      ever ran, and nothing was sent.  A read_only or idempotent tool has
**      no record (its token is 0): the hand-over, the renewals and the
**      late result are then nothing, and the command runs.
**   5. It says go, feeds the command its arguments, keeps its stdout (the
**      result), relays its stderr to the front end (dropped once the front
**      end is gone), and renews the lease while the command runs.  With a
**      settle_ms in the policy it kills what is left of the command's
**      group when the deadline plus settle_ms has passed: the policy says
**      nothing of it can land after that, and the runner makes it so.
**   6. When the command exits it hands the lease back to the front end
**      (which records the outcome: the action must not wait under a runner
**      that is gone meanwhile) and answers it on stdout,
**      "OUTCOME ENDED\nERROR\nRESULT" - ENDED is 1 when the command's
**      process group is empty, so nothing of the attempt can still run.
**      If nobody reads that any more, it records the result in the log
**      itself as a late result.
**
** A runner killed at any point leaves its record pending under its lease
** (or in doubt): whoever resumes finds the runner gone and the command's
** process group in the record; only when that group is empty does the
** attempt count as ended (§6a).
*/
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run/run.h"

#define MAX_OUTPUT CLI_MAX_OUTPUT

/* ---- small helpers ---------------------------------------------------------- */

static int sigchld_pipe[2] = {-1, -1};

static void on_sigchld(int sig) {
  int e = errno;
  (void)sig;
  if (write(sigchld_pipe[1], "c", 1) < 0) {
  } /* full: a wake-up is pending anyway */
  errno = e;
}

/* Close every descriptor from 3 up: the caller's files are not ours. */
static void close_from_3(void) {
  long max = sysconf(_SC_OPEN_MAX);
  if (max < 0 || max > 65536) max = 65536;
#ifdef SYS_close_range
  if (syscall(SYS_close_range, 3, ~0U, 0) == 0) return;
#endif
  for (long fd = 3; fd < max; fd++) close((int)fd);
}

/* Read exactly n bytes from fd: 0, or -1 (short). */
static int read_full(int fd, char *p, size_t n) {
  while (n > 0) {
    ssize_t got = read(fd, p, n);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return -1;
    p += got;
    n -= (size_t)got;
  }
  return 0;
}

/* The input: "LEN\n" then LEN bytes.  0 and *buf (malloc), or -1. */
static int read_input(char **buf, size_t *len) {
  char head[32];
  size_t k = 0;
  unsigned long long n;
  char *end;
  *buf = NULL;
  *len = 0;
  for (;;) { /* byte by byte: nothing of the body is read ahead */
    if (k + 1 >= sizeof head || read_full(0, head + k, 1)) return -1;
    if (head[k] == '\n') break;
    k++;
  }
  head[k] = '\0';
  n = strtoull(head, &end, 10);
  if (end == head || *end || n > MAX_OUTPUT) return -1;
  if (!(*buf = malloc(n + 1))) return -1;
  if (read_full(0, *buf, n)) {
    free(*buf);
    *buf = NULL;
    return -1;
  }
  (*buf)[n] = '\0';
  *len = n;
  return 0;
}

/* ---- the command ------------------------------------------------------------ */

typedef struct cmd {
  pid_t pid;    /* the command, leader of its own group */
  int go;       /* write end: one byte starts it          */
  int exec_err; /* read end: errno if exec failed, EOF if it ran */
  int in, out, err;
} cmd;

/* Fork the command into its own process group; it waits for the word. */
static int cmd_fork(cmd *c, char **argv) {
  int in[2], out[2], err[2], go[2], ee[2];
  pid_t runner = getpid();
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC) ||
      pipe2(go, O_CLOEXEC) || pipe2(ee, O_CLOEXEC))
    return -1;
  c->pid = fork();
  if (c->pid < 0) return -1;
  if (c->pid == 0) {
    char word;
    int e;
    setpgid(0, 0);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() != runner) _exit(126); /* the runner is gone already */
    signal(SIGPIPE, SIG_DFL);
    signal(SIGCHLD, SIG_DFL);
    dup2(in[0], 0);
    dup2(out[1], 1);
    dup2(err[1], 2);
    if (read(go[0], &word, 1) != 1) _exit(126); /* told not to start */
    execvp(argv[0], argv);
    e = errno;
    if (write(ee[1], &e, sizeof e) < 0) {
    }
    _exit(127);
  }
  setpgid(c->pid, c->pid); /* both sides: no race with the kill below */
  close(in[0]);
  close(out[1]);
  close(err[1]);
  close(go[0]);
  close(ee[1]);
  c->in = in[1];
  c->out = out[0];
  c->err = err[0];
  c->go = go[1];
  c->exec_err = ee[0];
  return 0;
}

static void cmd_kill(cmd *c) {
  kill(-c->pid, SIGKILL);
  kill(c->pid, SIGKILL);
}

/* Reap whatever has exited: our command (*status, 1 once) and any orphan
** of its that came to us as the subreaper. */
static int reap(const cmd *c, int *status) {
  int st, got = 0;
  pid_t p;
  while ((p = waitpid(-1, &st, WNOHANG)) > 0)
    if (p == c->pid) {
      *status = st;
      got = 1;
    }
  return got;
}

/* ---- what an exit means ------------------------------------------------------- */

static int in_list(const int *codes, int n, int code) {
  for (int i = 0; i < n; i++)
    if (codes[i] == code) return 1;
  return 0;
}

int cli_exec_outcome(const idem_tool_info *r, const cli_run_result *res) {
  if (res->timed_out || !res->exited) return IDEM_OUTCOME_UNKNOWN;
  if (in_list(r->exit_applied, r->n_exit_applied, res->exit_code))
    return IDEM_OUTCOME_APPLIED;
  if (in_list(r->exit_not_applied, r->n_exit_not_applied, res->exit_code))
    return IDEM_OUTCOME_NOT_APPLIED;
  if (in_list(r->exit_rejected, r->n_exit_rejected, res->exit_code))
    return IDEM_OUTCOME_REJECTED;
  return IDEM_OUTCOME_UNKNOWN;
}

void cli_exec_describe(const cli_run_result *res, long long deadline,
                       char *buf, size_t n) {
  if (res->too_big) {
    /* the pipe was closed on it: a SIGPIPE death is ours, not the tool's */
    int k = snprintf(buf, n,
                     "the command's output passed the limit of %zu bytes and "
                     "was cut off",
                     CLI_MAX_OUTPUT);
    if (k < 0 || (size_t)k >= n) return;
    if (res->signal)
      snprintf(buf + k, n - (size_t)k, "; it was then killed by signal %d%s",
               res->signal, res->signal == SIGPIPE ? " (SIGPIPE)" : "");
    else if (res->exited)
      snprintf(buf + k, n - (size_t)k, "; it then exited with status %d",
               res->exit_code);
  } else if (res->spawn_errno)
    snprintf(buf, n, "the command could not be started: %s",
             strerror(res->spawn_errno));
  else if (res->timed_out)
    snprintf(buf, n, "no answer within %lld ms", deadline);
  else if (res->signal)
    snprintf(buf, n, "the command was killed by signal %d", res->signal);
  else
    snprintf(buf, n, "the command exited with status %d", res->exit_code);
}

/* ---- the runner -------------------------------------------------------------- */

typedef struct run_args {
  const char *log, *session, *call;
  const char *front; /* the front end's owner id: the lease goes back */
  long long token, lease_ms, timeout_ms, settle_ms;
  idem_tool_info rule; /* exit codes */
} run_args;

static int parse_codes(const char *s, idem_tool_info *r) {
  int *lists[3] = {r->exit_applied, r->exit_not_applied, r->exit_rejected};
  int *counts[3] = {&r->n_exit_applied, &r->n_exit_not_applied,
                    &r->n_exit_rejected};
  int l = 0;
  for (int i = 0; i < 3; i++) *counts[i] = 0;
  while (*s && l < 3) {
    if (*s == ';') {
      l++;
      s++;
    } else if (*s == ',') {
      s++;
    } else {
      char *end;
      long v = strtol(s, &end, 10);
      if (end == s) return -1;
      if (*counts[l] < IDEM_MAX_EXIT_CODES) lists[l][(*counts[l])++] = (int)v;
      s = end;
    }
  }
  return 0;
}

/* Hand the outcome to the front end; when it is gone, record it. */
static void report(const run_args *a, idem_guard *g, int outcome, int ended,
                   const char *error, const char *result) {
  char head[640];
  int n = snprintf(head, sizeof head, "%d %d\n%s\n", outcome, ended,
                   error ? error : "");
  int failed = cli_write_all(1, head, (size_t)n) != 0 ||
               (result && cli_write_all(1, result, strlen(result)) != 0);
  close(1);
  if (failed && g)
    idem_guard_late(g, a->session, a->call, a->token, outcome, result,
                    result ? strlen(result) : 0, error, ended);
}

/* Run the command under the guard's record; the outcome is reported.  The
** command is forked before the log is opened: the store's threads must not
** exist at the fork. */
static void run(const run_args *a, char **argv, const char *input,
                size_t in_len) {
  idem_guard *g = NULL;
  cmd c = {0, -1, -1, -1, -1, -1};
  cli_run_result res;
  char error[512], *result = NULL;
  size_t sent = 0, cap = 0;
  long long start = cli_mono_ms(), next_renew, kill_at = -1;
  int status = 0, exited = 0, stderr_open = 1, e = 0, outcome, ended, rc;

  memset(&res, 0, sizeof res);
  error[0] = '\0';
  if (cmd_fork(&c, argv) != 0) {
    snprintf(error, sizeof error, "the command could not be started: %s",
             strerror(errno));
    report(a, g, IDEM_OUTCOME_NOT_APPLIED, 1, error, NULL);
    return;
  }
  if ((rc = idem_guard_open(a->log, NULL, &g)) == IDEM_OK)
    rc =
        idem_guard_executor_lease(g, a->session, a->call, a->token, a->lease_ms,
                                  (long long)c.pid, a->timeout_ms, NULL);
  if (rc != IDEM_OK) {
    /* the command never ran: nothing was sent */
    cmd_kill(&c);
    while (!reap(&c, &status)) usleep(1000);
    snprintf(error, sizeof error, "%s; the command was not run",
             idem_guard_errmsg(g));
    report(a, NULL, IDEM_OUTCOME_NOT_APPLIED, 1, error, NULL);
    idem_guard_close(g);
    return;
  }
  idem_crash_point("runner_after_handover");
  if (cli_write_all(c.go, "g", 1) != 0) { /* it died before it started */
  }
  close(c.go);
  if (read(c.exec_err, &e, sizeof e) == (ssize_t)sizeof e) {
    while (!reap(&c, &status)) usleep(1000);
    snprintf(error, sizeof error, "the command could not be started: %s",
             strerror(e));
    report(a, g, IDEM_OUTCOME_NOT_APPLIED, 1, error, NULL);
    idem_guard_close(g);
    return;
  }
  close(c.exec_err);
  if (a->settle_ms >= 0) kill_at = start + a->timeout_ms + a->settle_ms;
  next_renew = start + a->lease_ms / 3;
  fcntl(c.in, F_SETFL, O_NONBLOCK);
  if (in_len == 0) {
    close(c.in);
    c.in = -1;
  }
  while (!exited) {
    struct pollfd pf[4];
    long long now = cli_mono_ms(), wake = next_renew;
    int n = 0;
    if (kill_at >= 0 && now >= kill_at) {
      cmd_kill(&c); /* settle_ms is up: nothing of it may land later */
      kill_at = -1;
    }
    if (now >= next_renew) {
      if (idem_guard_executor_lease(g, a->session, a->call, a->token,
                                    a->lease_ms, 0, 0, NULL) == IDEM_STALE)
        next_renew = LLONG_MAX; /* someone took it over: stop renewing */
      else
        next_renew = now + a->lease_ms / 3;
      wake = next_renew;
    }
    if (kill_at >= 0 && kill_at < wake) wake = kill_at;
    pf[n++] = (struct pollfd){sigchld_pipe[0], POLLIN, 0};
    if (c.out >= 0) pf[n++] = (struct pollfd){c.out, POLLIN, 0};
    if (c.err >= 0) pf[n++] = (struct pollfd){c.err, POLLIN, 0};
    if (c.in >= 0) pf[n++] = (struct pollfd){c.in, POLLOUT, 0};
    wake = wake == LLONG_MAX ? -1 : wake - now < 0 ? 0 : wake - now;
    if (poll(pf, (nfds_t)n, wake > 1000000 ? 1000000 : (int)wake) < 0 &&
        errno != EINTR)
      break;
    for (int i = 0; i < n; i++) {
      if (!pf[i].revents) continue;
      if (pf[i].fd == sigchld_pipe[0]) {
        char drain[64];
        while (read(sigchld_pipe[0], drain, sizeof drain) > 0) {
        }
        if (reap(&c, &status)) exited = 1;
      } else if (pf[i].fd == c.in) {
        ssize_t w = write(c.in, input + sent, in_len - sent);
        if (w > 0) sent += (size_t)w;
        if ((w < 0 && errno != EAGAIN && errno != EINTR) || sent == in_len) {
          close(c.in);
          c.in = -1;
        }
      } else if (pf[i].fd == c.err) {
        char buf[4096];
        ssize_t got = read(c.err, buf, sizeof buf);
        if (got <= 0 && !(got < 0 && errno == EINTR)) {
          close(c.err);
          c.err = -1;
        } else if (got > 0 && stderr_open && cli_write_all(2, buf, (size_t)got))
          stderr_open = 0; /* the front end is gone: drop the rest */
      } else { /* stdout */
        if (res.out_len + 65536 > cap) {
          char *p;
          if (cap >= MAX_OUTPUT) {
            res.too_big = 1;
            close(c.out);
            c.out = -1;
            continue;
          }
          cap = cap ? cap * 2 : 65536;
          if (cap > MAX_OUTPUT) cap = MAX_OUTPUT;
          if (!(p = realloc(res.out, cap + 1))) {
            res.too_big = 1;
            close(c.out);
            c.out = -1;
            continue;
          }
          res.out = p;
        }
        {
          ssize_t got = read(c.out, res.out + res.out_len, cap - res.out_len);
          if (got > 0)
            res.out_len += (size_t)got;
          else if (got == 0 || errno != EINTR) {
            close(c.out);
            c.out = -1;
          }
        }
      }
    }
  }
  /* what it wrote before it exited is in the pipe: take it, not more
  ** (a child it left behind may hold the pipe open) */
  if (c.out >= 0 && res.out_len < MAX_OUTPUT) {
    fcntl(c.out, F_SETFL, O_NONBLOCK);
    for (;;) {
      ssize_t got;
      if (res.out_len + 4096 > cap) {
        char *p;
        size_t ncap = cap ? cap * 2 : 65536;
        if (ncap > MAX_OUTPUT) ncap = MAX_OUTPUT;
        if (ncap <= cap || !(p = realloc(res.out, ncap + 1))) break;
        res.out = p;
        cap = ncap;
      }
      got = read(c.out, res.out + res.out_len, cap - res.out_len);
      if (got <= 0) break;
      res.out_len += (size_t)got;
    }
  }
  if (res.out) res.out[res.out_len] = '\0';
  res.exited = WIFEXITED(status);
  res.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  res.signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  outcome = cli_exec_outcome(&a->rule, &res);
  if (res.too_big) outcome = IDEM_OUTCOME_UNKNOWN;
  if (outcome != IDEM_OUTCOME_APPLIED)
    cli_exec_describe(&res, -1, error, sizeof error);
  if (outcome == IDEM_OUTCOME_APPLIED || outcome == IDEM_OUTCOME_REJECTED)
    result = cli_result_json(res.out, res.out_len);
  /* ended: nothing of the command can still run */
  reap(&c, &status);
  ended = idem_process_group_empty((long long)c.pid);
  /* the front end records what we answer: the lease goes back to it
  ** first, so the action never waits under a runner that is gone */
  if (a->front)
    idem_guard_executor_lease(g, a->session, a->call, a->token, a->lease_ms, 0,
                              0, a->front);
  report(a, g, outcome, ended, error, result);
  free(result);
  free(res.out);
  if (c.in >= 0) close(c.in);
  if (c.out >= 0) close(c.out);
  if (c.err >= 0) close(c.err);
  idem_guard_close(g);
}

int cmd_run(int argc, char **argv) {
  static const struct option opts[] = {
      {"log", required_argument, NULL, 'L'},
      {"session", required_argument, NULL, 's'},
      {"call", required_argument, NULL, 'c'},
      {"token", required_argument, NULL, 'k'},
      {"codes", required_argument, NULL, 'C'},
      {"lease", required_argument, NULL, 'l'},
      {"timeout", required_argument, NULL, 'T'},
      {"settle", required_argument, NULL, 'S'},
      {"front", required_argument, NULL, 'F'},
      {NULL, 0, NULL, 0}};
  run_args a;
  char *input = NULL;
  size_t in_len = 0;
  struct sigaction sa;
  int ch;

  memset(&a, 0, sizeof a);
  a.rule.size = sizeof a.rule;
  idem_policy_tool(NULL, "run", &a.rule); /* the default exit codes */
  a.lease_ms = 60000;
  a.timeout_ms = 30000;
  a.settle_ms = -1;
  while ((ch = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
    switch (ch) {
    case 'L': a.log = optarg; break;
    case 's': a.session = optarg; break;
    case 'c': a.call = optarg; break;
    case 'k': a.token = strtoll(optarg, NULL, 10); break;
    case 'l': a.lease_ms = strtoll(optarg, NULL, 10); break;
    case 'T': a.timeout_ms = strtoll(optarg, NULL, 10); break;
    case 'S': a.settle_ms = strtoll(optarg, NULL, 10); break;
    case 'F': a.front = optarg; break;
    case 'C':
      if (parse_codes(optarg, &a.rule)) return EXIT_USAGE;
      break;
    default: return EXIT_USAGE;
    }
  }
  if (!a.log || !a.session || !a.call || optind >= argc || a.lease_ms < 3)
    return EXIT_USAGE;
  close_from_3();
  setsid();
  signal(SIGPIPE, SIG_IGN);
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  if (pipe2(sigchld_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return EXIT_FAIL;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigchld;
  sa.sa_flags = SA_RESTART | SA_NOCLDSTOP;
  sigaction(SIGCHLD, &sa, NULL);

  if (read_input(&input, &in_len) != 0) {
    report(&a, NULL, IDEM_OUTCOME_NOT_APPLIED, 1,
           "the runner's input was cut short; the command was not run", NULL);
    return EXIT_FAIL;
  }
  run(&a, argv + optind, input, in_len);
  free(input);
  return EXIT_OK;
}

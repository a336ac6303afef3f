/*
** proc.c - running a command with input, captured output and a deadline.
**
** The command gets its input on stdin from a pipe and writes its output to
** another; both are served with poll() so neither side can block the other.
** Past the deadline the caller chooses: kill the command (a status check),
** or leave it running and return (a tool run, whose late result someone
** else records).  Output beyond the cap is an error, not a crash.
*/
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "run/run.h"

extern char **environ;

/* Copy what is waiting on fd to our stderr (a relayed stderr); 0 at its
** end. */
static int relay(int fd) {
  char buf[4096];
  ssize_t got = read(fd, buf, sizeof buf);
  if (got < 0 && errno == EINTR) return 1;
  if (got <= 0) return 0;
  for (ssize_t off = 0; off < got;) {
    ssize_t w = cli_write_pipe(2, buf + off, (size_t)(got - off));
    if (w <= 0) break; /* our stderr is gone: drop it */
    off += w;
  }
  return 1;
}

int cli_run(const cli_run_opts *o, cli_run_result *r) {
  int in[2] = {-1, -1}, out[2] = {-1, -1}, err[2] = {-1, -1}, status = 0;
  int rc = -1;
  posix_spawn_file_actions_t fa;
  posix_spawnattr_t sa;
  size_t sent = 0, cap = 0;
  long long until = o->deadline_ms >= 0 ? cli_mono_ms() + o->deadline_ms : -1;
  pid_t pid;
  memset(r, 0, sizeof *r);
  r->exit_code = -1;
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0 ||
      (o->relay_stderr && pipe2(err, O_CLOEXEC) != 0))
    goto fail;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  if (o->merge_stderr) posix_spawn_file_actions_adddup2(&fa, out[1], 2);
  if (o->relay_stderr) posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  posix_spawnattr_init(&sa);
  if (o->new_group) {
    posix_spawnattr_setpgroup(&sa, 0);
    posix_spawnattr_setflags(&sa, POSIX_SPAWN_SETPGROUP);
  }
  errno = posix_spawnp(&pid, o->argv[0], &fa, &sa, o->argv,
                       o->envp ? o->envp : environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&sa);
  if (errno) {
    r->spawn_errno = errno;
    goto fail;
  }
  r->pid = pid;
  close(in[0]);
  close(out[1]);
  in[0] = out[1] = -1;
  if (err[1] >= 0) {
    close(err[1]);
    err[1] = -1;
  }
  fcntl(in[1], F_SETFL, O_NONBLOCK);
  if (o->input_len == 0) {
    close(in[1]);
    in[1] = -1;
  }
  for (;;) {
    struct pollfd pf[3];
    int n = 0, wait_ms = -1, k;
    if (out[0] >= 0) pf[n++] = (struct pollfd){out[0], POLLIN, 0};
    if (in[1] >= 0) pf[n++] = (struct pollfd){in[1], POLLOUT, 0};
    if (n == 0) break;
    if (err[0] >= 0) pf[n++] = (struct pollfd){err[0], POLLIN, 0};
    if (until >= 0) {
      long long left = until - cli_mono_ms();
      if (left <= 0) {
        r->timed_out = 1;
        break;
      }
      wait_ms = left > 1000000 ? 1000000 : (int)left;
    }
    k = poll(pf, (nfds_t)n, wait_ms);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) goto fail;
    for (int i = 0; i < n; i++) {
      if (!pf[i].revents) continue;
      if (pf[i].fd == err[0]) {
        if (!relay(err[0])) {
          close(err[0]);
          err[0] = -1;
        }
      } else if (pf[i].fd == in[1]) {
        ssize_t w = cli_write_pipe(in[1], o->input + sent, o->input_len - sent);
        if (w > 0) sent += (size_t)w;
        if ((w < 0 && errno != EAGAIN) || sent == o->input_len) {
          close(in[1]); /* done, or the command does not read: fine */
          in[1] = -1;
        }
      } else {
        ssize_t got;
        if (r->out_len + 65536 > cap) {
          char *p;
          if (cap >= o->max_output) {
            r->too_big = 1;
            close(out[0]);
            out[0] = -1;
            continue;
          }
          cap = cap ? cap * 2 : 65536;
          if (cap > o->max_output) cap = o->max_output;
          if (!(p = realloc(r->out, cap + 1))) goto fail;
          r->out = p;
        }
        got = read(out[0], r->out + r->out_len, cap - r->out_len);
        if (got > 0)
          r->out_len += (size_t)got;
        else if (got == 0 || errno != EINTR) {
          close(out[0]);
          out[0] = -1;
        }
      }
    }
  }
  if (r->out) r->out[r->out_len] = '\0';
  if (r->timed_out) {
    if (o->kill_on_deadline) {
      kill(o->new_group ? -pid : pid, SIGKILL);
      waitpid(pid, &status, 0);
    }
    rc = 0;
    goto fail;
  }
  /* output closed: the command is ending; wait for it within the deadline */
  for (;;) {
    pid_t w = waitpid(pid, &status, until >= 0 ? WNOHANG : 0);
    if (w == pid) break;
    if (w < 0 && errno != EINTR) goto fail;
    if (until >= 0 && cli_mono_ms() >= until) {
      r->timed_out = 1;
      if (o->kill_on_deadline) {
        kill(o->new_group ? -pid : pid, SIGKILL);
        waitpid(pid, &status, 0);
      }
      rc = 0;
      goto fail;
    }
    if (until >= 0) cli_sleep_ms(2);
  }
  r->exited = WIFEXITED(status);
  r->exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  r->signal = WIFSIGNALED(status) ? WTERMSIG(status) : 0;
  rc = 0;
fail:
  if (in[0] >= 0) close(in[0]);
  if (in[1] >= 0) close(in[1]);
  if (out[0] >= 0) close(out[0]);
  if (out[1] >= 0) close(out[1]);
  if (err[0] >= 0) { /* what it wrote before it exited */
    struct pollfd pe = {err[0], POLLIN, 0};
    while (rc == 0 && !r->timed_out && poll(&pe, 1, 0) == 1 && relay(err[0]))
      ;
    close(err[0]);
  }
  if (err[1] >= 0) close(err[1]);
  return rc;
}

/* ---- the environment of a tool or a status check ----------------------- */

int cli_env_build(cli_env *e, const char *key, const char *session,
                  const char *call, const char *tool, int attempt) {
  const char *names[] = {"IDEM_KEY=", "IDEM_SESSION=", "IDEM_CALL_ID=",
                         "IDEM_TOOL=", "IDEM_ATTEMPT="};
  char num[16];
  const char *vals[5];
  size_t n = 0, k = 0, i;
  snprintf(num, sizeof num, "%d", attempt);
  vals[0] = key;
  vals[1] = session;
  vals[2] = call;
  vals[3] = tool;
  vals[4] = num;
  while (environ[n]) n++;
  memset(e, 0, sizeof *e);
  if (!(e->envp = calloc(n + 6, sizeof *e->envp))) return -1;
  for (i = 0; i < n; i++) /* ours replace any inherited IDEM_* of the same */
    if (strncmp(environ[i], "IDEM_KEY=", 9) &&
        strncmp(environ[i], "IDEM_SESSION=", 13) &&
        strncmp(environ[i], "IDEM_CALL_ID=", 13) &&
        strncmp(environ[i], "IDEM_TOOL=", 10) &&
        strncmp(environ[i], "IDEM_ATTEMPT=", 13))
      e->envp[k++] = environ[i];
  for (i = 0; i < 5; i++) {
    size_t a = strlen(names[i]), b = strlen(vals[i]);
    if (!(e->own[i] = malloc(a + b + 1))) return -1;
    memcpy(e->own[i], names[i], a);
    memcpy(e->own[i] + a, vals[i], b + 1);
    e->envp[k++] = e->own[i];
  }
  return 0;
}

void cli_env_free(cli_env *e) {
  for (int i = 0; i < 6; i++) free(e->own[i]);
  free(e->envp);
}

int cli_status_check(const idem_step *s, const char *cmd, const char *session,
                     const char *call_id, const char *tool, char **out,
                     size_t *out_len) {
  char *argv[] = {(char *)"sh", (char *)"-c", (char *)(uintptr_t)cmd, NULL};
  size_t tlen;
  const char *target = idem_step_check_target(s, &tlen);
  cli_env env;
  cli_run_opts o;
  cli_run_result res;
  int outcome = IDEM_OUTCOME_UNKNOWN;
  *out = NULL;
  *out_len = 0;
  if (!cmd) return outcome;
  if (cli_env_build(&env, idem_step_check_key(s), session, call_id, tool,
                    idem_step_attempt(s)) == 0) {
    memset(&o, 0, sizeof o);
    o.argv = argv;
    o.envp = env.envp;
    o.input = target;
    o.input_len = tlen;
    o.deadline_ms = idem_step_deadline_ms(s);
    o.kill_on_deadline = 1;
    o.new_group = 1;
    o.max_output = (size_t)16 << 20;
    if (cli_run(&o, &res) == 0 && !res.timed_out && res.exited) {
      if (res.exit_code == 0) {
        outcome = IDEM_OUTCOME_APPLIED;
        *out = res.out;
        *out_len = res.out_len;
        res.out = NULL;
      } else if (res.exit_code == 100)
        outcome = IDEM_OUTCOME_NOT_APPLIED;
    }
    free(res.out);
  }
  cli_env_free(&env);
  return outcome;
}

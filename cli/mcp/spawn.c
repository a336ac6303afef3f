/*
** spawn.c - starting an MCP server over stdio: the child of `idem mcp`
** (gateway.c) and of `idem mcp --suggest-policy` (suggest.c).
**
** The server runs in a process group of its own (the gateway signals it,
** and an attempt in it may still land: SPEC §6a) and dies with us
** (PR_SET_PDEATHSIG).  The attempt log may be open and its threads
** running, so between fork and exec the child calls only
** async-signal-safe functions (no malloc, no lock another thread may
** hold): the program is found on PATH before the fork.
*/
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include "mcp.h"

extern char **environ;

/* The file to run for command name (found on PATH when it has no slash),
** into buf; 0 or an errno. */
static int find_program(const char *name, char *buf, size_t n) {
  const char *path = getenv("PATH"), *p, *e;
  int err = ENOENT;
  if (!*name) return ENOENT;
  if (strchr(name, '/')) {
    snprintf(buf, n, "%s", name);
    return 0;
  }
  for (p = path && *path ? path : "/usr/local/bin:/usr/bin:/bin";; p = e + 1) {
    size_t dl;
    e = strchr(p, ':');
    if (!e) e = p + strlen(p);
    dl = (size_t)(e - p);
    if ((size_t)snprintf(buf, n, "%.*s%s%s", (int)dl, p, dl ? "/" : "",
                         name) < n) {
      if (access(buf, X_OK) == 0) return 0;
      if (errno == EACCES) err = EACCES;
    }
    if (!*e) return err;
  }
}

int mcp_spawn(char **argv, pid_t *child, int *to, int *from) {
  int in[2], out[2], err[2], e = 0;
  pid_t pid, parent = getpid();
  ssize_t k;
  char prog[4096];
  struct sigaction dfl;
  if ((e = find_program(argv[0], prog, sizeof prog))) return e;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  if (pipe2(in, O_CLOEXEC) || pipe2(out, O_CLOEXEC) || pipe2(err, O_CLOEXEC))
    return errno;
  pid = fork();
  if (pid < 0) return errno;
  if (pid == 0) {
    /* the server dies with us, and is signalled by us alone */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != parent) _exit(127); /* we died before the prctl */
    setpgid(0, 0);
    sigaction(SIGPIPE, &dfl, NULL);
    if (dup2(in[0], 0) < 0 || dup2(out[1], 1) < 0) _exit(127);
    execve(prog, argv, environ);
    e = errno;
    if (write(err[1], &e, sizeof e) < 0) _exit(127);
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  close(err[1]);
  do k = read(err[0], &e, sizeof e);
  while (k < 0 && errno == EINTR);
  close(err[0]);
  if (k == (ssize_t)sizeof e) {
    waitpid(pid, NULL, 0);
    close(in[1]);
    close(out[0]);
    return e;
  }
  *child = pid;
  *to = in[1];
  *from = out[0];
  return 0;
}

/*
** owner.c - who holds a lease, whether that process still lives, and the
** crash points of SPEC §11.
**
** An owner is "HOST:PID:START": HOST is this machine's id (/etc/machine-id,
** else the host name), START the process start time in clock ticks since
** boot (field 22 of /proc/PID/stat), so a reused pid is not mistaken for
** the owner.  A pending record whose owner is a process of this machine
** that is gone can be taken over at once; an owner on another machine is
** trusted until its lease ends.
**
** IDEM_HOST_ID, when set and non-empty, replaces the machine's id: tests
** play harnesses on several machines sharing one PostgreSQL log with it,
** and containers that share a machine id can be told apart.
*/
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "idemInt.h"

static void read_host_id(char *buf, size_t n) {
  const char *env = getenv("IDEM_HOST_ID");
  FILE *f = NULL;
  size_t len = 0;
  if (env && *env) {
    snprintf(buf, n, "%s", env);
    len = strlen(buf);
  } else if ((f = fopen("/etc/machine-id", "r")) != NULL) {
    if (fgets(buf, (int)n, f)) len = strcspn(buf, "\r\n");
    fclose(f);
  }
  if (len < 8 && !(env && *env) && gethostname(buf, n) == 0) {
    buf[n - 1] = '\0';
    len = strlen(buf);
  }
  if (len == 0) {
    snprintf(buf, n, "unknown");
    len = strlen(buf);
  }
  if (len > 32) len = 32;
  buf[len] = '\0';
  /* ':' separates the parts; keep it out of the host part */
  for (size_t i = 0; i < len; i++)
    if (buf[i] == ':') buf[i] = '_';
}

/* This machine's id, read once: liveness checks run on every poll. */
static pthread_once_t host_once = PTHREAD_ONCE_INIT;
static char host[64];

static void host_init(void) { read_host_id(host, sizeof host); }

static const char *host_id(void) {
  pthread_once(&host_once, host_init);
  return host;
}

/* What /proc/PID/stat says of a process: its state (field 3: 'R', 'S',
** ... 'Z' for a zombie), process group (field 5) and start time in clock
** ticks since boot (field 22).  0 when it cannot be read (no such pid). */
static int proc_stat(long pid, char *state, long *pgrp,
                     unsigned long long *start) {
  char path[64], buf[1024], *p;
  size_t n;
  int field;
  FILE *f;
  snprintf(path, sizeof path, "/proc/%ld/stat", pid);
  if (!(f = fopen(path, "r"))) return 0;
  n = fread(buf, 1, sizeof buf - 1, f);
  fclose(f);
  buf[n] = '\0';
  /* the command name (field 2) may hold spaces and parentheses: skip to
  ** the last ')' */
  if (!(p = strrchr(buf, ')')) || p[1] != ' ') return 0;
  *state = p[2];
  *pgrp = 0;
  *start = 0;
  for (field = 2; field < 22 && *p; p++) {
    if (*p != ' ') continue;
    field++;
    if (field == 5) *pgrp = strtol(p + 1, NULL, 10);
  }
  if (field == 22) *start = strtoull(p, NULL, 10);
  return 1;
}

/* The start time of pid in clock ticks since boot; 0 when unknown. */
static unsigned long long start_time(long pid) {
  char state;
  long pgrp;
  unsigned long long t;
  return proc_stat(pid, &state, &pgrp, &t) ? t : 0;
}

void idem__owner_self(char *buf, size_t n) {
  long pid = (long)getpid();
  snprintf(buf, n, "%s:%ld:%llu", host_id(), pid, start_time(pid));
}

int idem__owner_alive(const char *owner) {
  char owner_host[64];
  const char *c1, *c2;
  long pid;
  unsigned long long start;
  if (!owner || !(c1 = strchr(owner, ':')) || !(c2 = strchr(c1 + 1, ':')))
    return -1;
  if ((size_t)(c1 - owner) >= sizeof owner_host) return -1;
  memcpy(owner_host, owner, (size_t)(c1 - owner));
  owner_host[c1 - owner] = '\0';
  if (strcmp(owner_host, host_id()) != 0) return -1; /* another machine */
  pid = strtol(c1 + 1, NULL, 10);
  start = strtoull(c2 + 1, NULL, 10);
  if (pid <= 0) return -1;
  if (kill((pid_t)pid, 0) != 0 && errno == ESRCH) return 0;
  /* the pid exists, but is it the same process, and not a zombie (dead,
  ** waiting for a parent - or an init - to reap it)? */
  {
    char state = 0;
    long pgrp;
    unsigned long long t = 0;
    if (!proc_stat(pid, &state, &pgrp, &t)) return 0;
    if (state == 'Z' || state == 'X') return 0;
    if (start && t != start) return 0;
  }
  return 1;
}

int idem_owner_alive(const char *owner) { return idem__owner_alive(owner); }

int idem_process_group_empty(long long pgid) {
  DIR *d;
  struct dirent *e;
  int empty = 1;
  if (pgid <= 1) return 1;
  if (kill(-(pid_t)pgid, 0) != 0 && errno == ESRCH) return 1;
  /* kill() counts zombies too: a member that is dead but not yet reaped
  ** runs nothing.  Look for a live one. */
  if (!(d = opendir("/proc"))) return 0;
  while (empty && (e = readdir(d)) != NULL) {
    char state, *end;
    long pgrp, pid = strtol(e->d_name, &end, 10);
    unsigned long long t;
    if (pid <= 0 || *end) continue;
    if (proc_stat(pid, &state, &pgrp, &t) && pgrp == (long)pgid &&
        state != 'Z' && state != 'X')
      empty = 0;
  }
  closedir(d);
  return empty;
}

void idem_crash_point(const char *name) {
  const char *at = getenv("IDEM_CRASH_AT");
  if (IDEM__UNLIKELY(at != NULL) && strcmp(at, name) == 0) {
    /* SIGKILL: no handler, no flush, no cleanup - what a crash is */
    kill(getpid(), SIGKILL);
    for (;;) pause();
  }
}

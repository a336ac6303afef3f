/*
** run.h - running commands (proc.c) and the executor of `idem exec`
** (runner.c, SPEC §6a): what the verbs that run commands - exec, its status
** checks, recover, the MCP gateway's status commands, the demo - use.
*/
#ifndef IDEM_CLI_RUN_H
#define IDEM_CLI_RUN_H

#include <stddef.h>

#include "idem.h"

/* ---- proc.c: running a command ------------------------------------------ */

typedef struct cli_run_opts {
  char *const *argv; /* the command, argv[0] looked up in PATH      */
  char *const *envp; /* its environment, or NULL for ours           */
  const char *input; /* written to its stdin                        */
  size_t input_len;
  long long deadline_ms; /* -1: none                                    */
  int kill_on_deadline;  /* SIGKILL it (its group) past the deadline    */
  int new_group;         /* run it in a process group of its own        */
  size_t max_output;     /* stdout cap                                  */
  int merge_stderr;      /* its stderr goes where its stdout goes       */
  int relay_stderr;      /* its stderr is a pipe of ours, copied to our */
                         /* stderr while we watch it (never the        */
                         /* caller's own, which it could hold open)    */
} cli_run_opts;

typedef struct cli_run_result {
  int pid;
  int spawn_errno; /* it could not be started                         */
  int timed_out;   /* the deadline passed first                       */
  int exited;      /* it exited (else killed by signal, or timed out) */
  int exit_code;   /* when exited                                     */
  int signal;      /* when killed                                     */
  int too_big;     /* stdout beyond the cap was dropped               */
  char *out;       /* stdout, NUL-terminated; free()                  */
  size_t out_len;
} cli_run_result;

/* Run a command; 0 when it ran (whatever it did), -1 when it could not be
** started or watched (errno, r->spawn_errno). */
int cli_run(const cli_run_opts *o, cli_run_result *r);

/* The environment of a tool or a status check: ours, with IDEM_KEY,
** IDEM_SESSION, IDEM_CALL_ID, IDEM_TOOL and IDEM_ATTEMPT set. */
typedef struct cli_env {
  char **envp;
  char *own[6];
} cli_env;

int cli_env_build(cli_env *e, const char *key, const char *session,
                  const char *call, const char *tool, int attempt);
void cli_env_free(cli_env *e);

/* runner.c: a command's exit (res) -> outcome under the tool's exit_codes,
** and in words (deadline: the one it missed, if it did). */
int cli_exec_outcome(const idem_tool_info *r, const cli_run_result *res);
void cli_exec_describe(const cli_run_result *res, long long deadline,
                       char *buf, size_t n);

/* The largest output of a tool or a status command that is kept. */
#define CLI_MAX_OUTPUT ((size_t)16 << 20)

/* Run the status command cmd of the action step s is checking: sh -c cmd,
** the environment above, the action's arguments on stdin, killed past the
** step's deadline.  Exit 0 -> APPLIED (*out its stdout, free()), 100 ->
** NOT_APPLIED, anything else (or no cmd) -> UNKNOWN. */
int cli_status_check(const idem_step *s, const char *cmd, const char *session,
                     const char *call_id, const char *tool, char **out,
                     size_t *out_len);

#endif /* IDEM_CLI_RUN_H */

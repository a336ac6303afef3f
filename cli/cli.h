/*
** cli.h - what the idem command's verbs share.
**
** The command is a thin layer over the public API (include/idem.h): it
** parses options, reads input, prints results, and maps outcomes to the exit
** codes of SPEC §9.
*/
#ifndef IDEM_CLI_H
#define IDEM_CLI_H

#include <stddef.h>
#include <stdio.h>
#include <sys/types.h>

#include "buf.h"
#include "idem.h"

/* Exit codes (SPEC §9). */
enum {
  EXIT_OK = 0,
  EXIT_FAIL = 1,  /* anything else that went wrong          */
  EXIT_USAGE = 2, /* a bad command line                     */
  EXIT_DATA = 65  /* bad input data                         */
};

/* One verb: its name, entry point, one-line summary and usage text. */

/* "idem: " + message + newline on stderr. */
void cli_err(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* ---- jsonw.c: JSON objects, member by member -------------------------- */
/* Members appended to b; a failure to grow sets err (checked once, at the
** end, so that a short buffer never shows as bad JSON).  Strings are made
** with c. */
typedef struct cli_jsonw {
  cli_outbuf b;
  idem_canon *c;
  int first, err;
} cli_jsonw;
void cli_jsonw_init(cli_jsonw *w, idem_canon *c, size_t cap);
/* "{" and "}" of a (nested) object. */
void cli_jsonw_open(cli_jsonw *w);
void cli_jsonw_close(cli_jsonw *w);
/* A member's name, then its value: a string (NULL: null), JSON text as it
** is (NULL: null), a number. */
void cli_jsonw_key(cli_jsonw *w, const char *k);
void cli_jsonw_str(cli_jsonw *w, const char *k, const char *v);
void cli_jsonw_raw(cli_jsonw *w, const char *k, const char *v);
void cli_jsonw_num(cli_jsonw *w, const char *k, long long v);
/* Every field of r as members (idem show --json, idem serve). */
void cli_jsonw_record(cli_jsonw *w, const idem_record *r);

/* ---- usage.c: what idem help says ---------------------------------------- */

/* Print a usage error and the verb's usage to stderr; returns EXIT_USAGE. */
int cli_usage(const char *verb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Print the usage text of verb to f; -1 when there is no such verb. */
int cli_print_usage(FILE *f, const char *verb);
/* The list of verbs with their summaries (idem help). */
void cli_print_help(FILE *f);

/* ---- util.c ---------------------------------------------------------------- */

/* Milliseconds of CLOCK_MONOTONIC, for the command's deadlines and waits. */
long long cli_mono_ms(void);
/* Milliseconds since the epoch (CLOCK_REALTIME), as the log's times are. */
long long cli_wall_ms(void);
/* ms since the epoch as 2026-12-05T01:02:03Z into buf ("-" for 0). */
void cli_when(long long ms, char *buf, size_t n);
/* Sleep ms milliseconds, through signals. */
void cli_sleep_ms(long long ms);

/* Parse a decimal size option value in [lo, hi]; 0 on success. */
/* The enum idem_state named name ("in_doubt"), or 0. */
int cli_state_by_name(const char *name);
/* The n bytes at p as 2n lowercase hex digits and a NUL into out. */
void cli_hex(const void *p, size_t n, char *out);
int cli_parse_size(const char *opt, const char *s, size_t lo, size_t hi,
                   size_t *out);

/* Read all of a file (or stdin when path is NULL or "-") into a new buffer,
** up to max bytes; *truncated says that there was more.  0 on success, else
** an errno value. */
int cli_read_all(const char *path, size_t max, char **out, size_t *len,
                 int *truncated);

/* ---- lines.c: --lines modes on every core -------------------------------- */

/* Append the JSON string of the UTF-8 text s (NULL: null), canonical, made
** with c; nonzero when s is not UTF-8 or memory ran out. */
int cli_outbuf_json(cli_outbuf *o, idem_canon *c, const char *s);

/* Is [p, p+n) text: valid UTF-8 without a NUL byte? */
int cli_utf8_text(const char *p, size_t n);

/* Turn one input line (without its newline) into output: append the
** answer and its newline to out and return NULL, or return the error
** message (valid until the next call with this state) and append nothing -
** the caller prints an empty line and the message with the line number. */
typedef const char *(*cli_line_fn)(void *state, const char *line, size_t len,
                                   cli_outbuf *out);

/* How many workers to use: the online CPUs ($IDEM_THREADS overrides). */
int cli_workers(void);

/* Run fn over every line of fd on nstates workers (states[i] is worker
** i's).  Returns EXIT_OK, EXIT_DATA when a line was rejected, EXIT_FAIL on
** an I/O error. */
int cli_map_lines(int fd, size_t max, cli_line_fn fn, void **states,
                  int nstates);

/* Apply --max-depth / --max-bytes to a canon handle; 0 on success. */
int cli_canon_limits(idem_canon *c, size_t depth, size_t bytes);

/* Flush stdout and report a write error; returns EXIT_OK or EXIT_FAIL. */
int cli_flush(void);
/* write() to a pipe whose reader may be gone without dying of SIGPIPE: the
** signal is blocked in this thread for the write, and one the write raised
** is taken back before the mask is restored; the caller sees EPIPE.  (The
** process's disposition is left alone: `idem ... | head` still ends
** quietly.) */
ssize_t cli_write_pipe(int fd, const void *p, size_t n);
/* All n bytes to fd, as cli_write_pipe; 0, or -1 with errno. */
int cli_write_all(int fd, const void *p, size_t n);
/* 1 when the reader of fd is gone: poll() says its end of the pipe or
** socket is closed (POLLERR, POLLHUP) or fd is not open.  A file or a
** terminal always has its reader. */
int cli_reader_gone(int fd);

/* ---- util.c: text for a terminal ------------------------------------------ */

/*
** Session and call ids, tool names, keys and error texts come from clients:
** printed as they are, an ESC sequence in one would drive the reader's
** terminal, a CR or a bidi override would hide what is printed before it.
** cli_text appends s (NUL-terminated; NULL as "-") to o with every such
** byte or character written out, so that what is shown is what is stored,
** and nothing else:
**
**   a control byte (0x00-0x1F, 0x7F)      \xNN
**   a byte that is not UTF-8              \xNN
**   a C1 control (U+0080-U+009F), a bidi  \uNNNN
**   control (U+200E/F, U+202A-E, U+2066-9)
**   a backslash                           \\ (so that the above are
**                                         unambiguous)
**   any other character, UTF-8 included   as it is
**
** With json set, s is a JSON text (the log's args and results, canonical):
** its backslashes are left alone and the rest is written \u00NN or \uNNNN,
** JSON's own escapes, so that it stays the same JSON value.  Returns 0, or
** nonzero when memory ran out.
*/
int cli_text(cli_outbuf *o, const char *s, int json);

/* cli_text, cut to at most width columns (a character or an escape is
** never split; a character counts one column) and padded with spaces to
** width: one cell of a table. */
int cli_text_cell(cli_outbuf *o, const char *s, size_t width);

/* The result of a command as JSON: its stdout when that is a JSON text,
** else stdout as a string (one trailing newline dropped) - when stdout is
** text, valid UTF-8 without a NUL.  Other bytes are no string: they are
** kept exactly, all of them, as {"io.idem/base64": "..."} (RFC 4648
** base64), which a replay answers with as it is, so that the bytes the
** command wrote can always be had back.  NULL for empty output.  free()
** it. */
#define CLI_RESULT_BYTES "io.idem/base64"
char *cli_result_json(const char *out, size_t len);

/* Verbs. */
/* ---- drive.c: a step walked to its answer ---------------------------------- */

/* The call of `idem exec` / `idem call` from its options: session (else
** $IDEM_SESSION), call id and tool required, the arguments from args or,
** for "-", stdin (then *owned holds them: free()).  EXIT_OK or the exit
** status of the error, already reported. */
int cli_call_input(const char *verb, const char *args, idem_call *call,
                   char **owned);

/* The exit status of an answer (SPEC §9). */
int cli_exit_for(int answer);

/* The status check of the action step s is checking (CHECK): cmd, else the
** policy's status command, else its status tool when that is an HTTP tool.
** Returns the outcome, or 0 when there is nothing to check with; *result
** is the applied result (free()) or NULL. */
int cli_check(const idem_policy *p, idem_step *s, const char *cmd,
              const char *session, const char *call_id, const char *tool,
              char **result);
/* Give the step cli_check's answer: idem_step_resolve, or for 0
** idem_step_no_check (no check ran, none is recorded). */
int cli_resolve(idem_step *s, int outcome, const char *result);

/* How a verb calls its tool.  execute makes one attempt (returns -1 when it
** could not even start, with the reason in error); the hooks, when set, see
** each attempt's and each check's outcome (idem demo tells them). */
typedef struct cli_driver {
  int (*execute)(void *ctx, idem_step *s, int *outcome, char **result,
                 char *error, size_t errn);
  void (*on_attempt)(void *ctx, const idem_step *s, int outcome,
                     const char *error);
  void (*on_check)(void *ctx, const idem_step *s, int outcome);
  void *ctx;
  const idem_policy *policy;
  const idem_call *call;
  const char *status; /* a status command over the policy's, or NULL */
} cli_driver;

/* Hand the envelope to the model: one line on stdout, and what it was told
** recorded as SPEC §10 says - nothing when stdout's reader is gone, "told"
** just before the write, undone when the write fails (the reader went
** meanwhile).  Returns EXIT_OK when the line was written, else EXIT_FAIL,
** saying why on stderr (a log that failed to record it too: the answer
** stands, and the fence is only more careful with a repeat). */
int cli_hand_over(idem_guard *g, idem_step *s, const char *env, size_t len);

/* Walk s to its answer, print the envelope on stdout, mark it delivered;
** returns the exit status of SPEC §9 (EXIT_FAIL when the log failed). */
int cli_drive(idem_guard *g, idem_step *s, const cli_driver *d);

int cmd_canon(int argc, char **argv);
int cmd_key(int argc, char **argv);
int cmd_policy(int argc, char **argv);
int cmd_bench(int argc, char **argv);
/* bench/guard.c: the guard's figures, into dir. */
int bench_guard(const char *dir, int quick);
int cmd_exec(int argc, char **argv);
int cmd_call(int argc, char **argv);
int cmd_demo(int argc, char **argv);
int cmd_run(int argc, char **argv); /* idem __run: exec's runner, hidden */
int cmd_mcp(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_show(int argc, char **argv);
int cmd_recover(int argc, char **argv);
int cmd_resolve(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_stats(int argc, char **argv);

#endif /* IDEM_CLI_H */

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

#include "idem.h"

/* Exit codes (SPEC §9). */
enum {
  EXIT_OK = 0,
  EXIT_FAIL = 1,  /* anything else that went wrong          */
  EXIT_USAGE = 2, /* a bad command line                     */
  EXIT_DATA = 65  /* bad input data                         */
};

/* One verb: its name, entry point, one-line summary and usage text. */
typedef struct cli_verb {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *summary;
  const char *usage;
} cli_verb;

extern const cli_verb cli_verbs[];

/* "idem: " + message + newline on stderr. */
void cli_err(const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 1, 2)))
#endif
    ;

/* Print a usage error and the verb's usage to stderr; returns EXIT_USAGE. */
int cli_usage(const char *verb, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Print the usage text of verb to f. */
void cli_print_usage(FILE *f, const char *verb);

/* Parse a decimal size option value in [lo, hi]; 0 on success. */
int cli_parse_size(const char *opt, const char *s, size_t lo, size_t hi,
                   size_t *out);

/* Read all of a file (or stdin when path is NULL or "-") into a new buffer,
** up to max bytes; *truncated says that there was more.  0 on success, else
** an errno value. */
int cli_read_all(const char *path, size_t max, char **out, size_t *len,
                 int *truncated);

/* A reader of newline-terminated lines that never holds more than about
** max bytes of one line: a longer line is skipped and flagged. */
typedef struct cli_lines {
  int fd;
  char *buf;
  size_t cap, start, end;
  size_t max;
  size_t lineno;
  int eof;
} cli_lines;

int cli_lines_open(cli_lines *r, int fd, size_t max);
/* Next line (without its '\n'): 1 and the line, 0 at the end, -1 on a read
** error (errno set).  *too_long is set when the line was longer than max
** and skipped; then *len is 0. */
int cli_lines_next(cli_lines *r, const char **line, size_t *len, int *too_long);
void cli_lines_close(cli_lines *r);

/* Apply --max-depth / --max-bytes to a canon handle; 0 on success. */
int cli_canon_limits(idem_canon *c, size_t depth, size_t bytes);

/* Flush stdout and report a write error; returns EXIT_OK or EXIT_FAIL. */
int cli_flush(void);

/* Verbs. */
int cmd_canon(int argc, char **argv);
int cmd_key(int argc, char **argv);
int cmd_bench(int argc, char **argv);

#endif /* IDEM_CLI_H */

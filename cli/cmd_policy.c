/*
** cmd_policy.c - `idem policy check FILE` and `idem policy explain FILE TOOL`.
**
** check validates a policy (SPEC §8) and names its tools, with a line on
** standard error for each warning (idem_policy_warning); explain prints,
** in words, what "the same action" means for one tool and what happens on a
** timeout (idem_policy_explain), wrapped to 76 columns.  Exit 0 when all is
** well, 65 for an invalid policy, 1 when the file cannot be read, 2 for a
** bad command line.
*/
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

#define WRAP 76

#define NAME_MAX_SHOWN 64 /* bytes of a name echoed; then "... (N bytes)" */

/* A name as is when it is printable, plain and short, else as a JSON string
** cut at NAME_MAX_SHOWN bytes (at a UTF-8 boundary) with the length it had,
** so a name never breaks the one-line report nor floods it. */
static void put_name(FILE *f, const char *s) {
  const unsigned char *p = (const unsigned char *)s;
  size_t n = strlen(s), lim = n > NAME_MAX_SHOWN ? NAME_MAX_SHOWN : n, i;
  int plain = n > 0 && n == lim;
  for (; *p && plain; p++)
    if (*p <= ' ' || *p == 0x7f || *p == ',' || *p == '"' || *p == '\\')
      plain = 0;
  if (plain) {
    fputs(s, f);
    return;
  }
  while (lim < n && lim > 0 && ((unsigned char)s[lim] & 0xC0) == 0x80) lim--;
  putc('"', f);
  for (i = 0, p = (const unsigned char *)s; i < lim; i++, p++) {
    if (*p == '"' || *p == '\\')
      fprintf(f, "\\%c", *p);
    else if (*p < 0x20 || *p == 0x7f)
      fprintf(f, "\\u%04x", *p);
    else
      putc(*p, f);
  }
  if (lim < n)
    fprintf(f, "...\" (%zu bytes)", n);
  else
    putc('"', f);
}

/* Print a paragraph wrapped at WRAP columns (counting bytes, so a line of
** UTF-8 may come out a little shorter); a word longer than a line stands
** alone, and a number stays with the word after it ("200 ms"). */
static void print_wrapped(const char *s, size_t n) {
  size_t col = 0;
  while (n > 0) {
    size_t w = 0, digits = 0;
    for (; w < n && s[w] != ' '; w++)
      if (s[w] >= '0' && s[w] <= '9') digits++;
    if (digits == w && w + 1 < n && s[w + 1] != ' ')
      for (w++; w < n && s[w] != ' ';) w++;
    if (col > 0 && col + 1 + w > WRAP) {
      putchar('\n');
      col = 0;
    } else if (col > 0) {
      putchar(' ');
      col++;
    }
    fwrite(s, 1, w, stdout);
    col += w;
    s += w;
    n -= w;
    while (n > 0 && *s == ' ') s++, n--;
  }
  putchar('\n');
}

static void print_text(const char *t) {
  while (*t) {
    const char *nl = strchr(t, '\n');
    size_t n = nl ? (size_t)(nl - t) : strlen(t);
    if (n == 0)
      putchar('\n');
    else
      print_wrapped(t, n);
    t += n + (nl ? 1 : 0);
  }
}

/* Load path; on failure print `idem: PATH: message` and return the exit
** status (65 invalid, 1 unreadable or out of memory). */
static int load(const char *path, idem_policy **p) {
  const char *msg;
  size_t n = strlen(path);
  int rc = idem_policy_load(path, p);
  if (rc == IDEM_OK) return EXIT_OK;
  msg = *p ? idem_policy_errmsg(*p) : "out of memory";
  /* syntax and I/O messages start with the file name already */
  if (strncmp(msg, path, n) == 0 && msg[n] == ':')
    cli_err("%s", msg);
  else
    cli_err("%s: %s", path, msg);
  idem_policy_free(*p);
  *p = NULL;
  return rc == IDEM_POLICY ? EXIT_DATA : EXIT_FAIL;
}

static int check(const char *path) {
  idem_policy *p;
  size_t i, n;
  int rc = load(path, &p);
  if (rc) return rc;
  fputs(path, stdout);
  n = idem_policy_tool_count(p);
  printf(": ok (%zu tool%s", n, n == 1 ? "" : "s");
  for (i = 0; i < n; i++) {
    fputs(i ? ", " : ": ", stdout);
    put_name(stdout, idem_policy_tool_name(p, i));
  }
  puts(")");
  for (i = 0; idem_policy_warning(p, i); i++)
    cli_err("%s: warning: %s", path, idem_policy_warning(p, i));
  idem_policy_free(p);
  return cli_flush();
}

static int explain(const char *path, const char *tool) {
  idem_policy *p;
  char *text;
  int rc = load(path, &p);
  if (rc) return rc;
  rc = idem_policy_explain(p, tool, &text);
  idem_policy_free(p);
  if (rc != IDEM_OK) {
    fputs("idem: explain ", stderr);
    put_name(stderr, tool);
    fprintf(stderr, ": %s\n", idem_strerror(rc));
    return EXIT_FAIL;
  }
  print_text(text);
  idem_free(text);
  return cli_flush();
}

int cmd_policy(int argc, char **argv) {
  static const struct option opts[] = {{"help", no_argument, NULL, 'h'},
                                       {NULL, 0, NULL, 0}};
  const char *sub;
  int ch, n;
  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'h': cli_print_usage(stdout, "policy"); return cli_flush();
    case ':':
      return cli_usage("policy", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("policy", "no option '%s' for policy", argv[optind - 1]);
    }
  }
  if (optind >= argc)
    return cli_usage("policy", "policy needs a sub-verb: check or explain");
  sub = argv[optind];
  n = argc - optind - 1;
  if (strcmp(sub, "check") == 0) {
    if (n != 1)
      return cli_usage("policy",
                       "policy check takes one FILE, not %d "
                       "arguments",
                       n);
    return check(argv[optind + 1]);
  }
  if (strcmp(sub, "explain") == 0) {
    if (n != 2)
      return cli_usage("policy",
                       "policy explain takes FILE and TOOL, not %d "
                       "argument%s",
                       n, n == 1 ? "" : "s");
    if (!argv[optind + 2][0])
      return cli_usage("policy", "policy explain: TOOL must not be empty");
    return explain(argv[optind + 1], argv[optind + 2]);
  }
  return cli_usage("policy", "no sub-verb '%s' for policy (check or explain)",
                   sub);
}

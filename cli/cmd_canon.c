/*
** cmd_canon.c - `idem canon [FILE]` and `idem canon --lines`.
*/
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static const char *canon_line(void *state, const char *line, size_t len,
                              cli_outbuf *out) {
  idem_canon *c = state;
  const char *canon;
  size_t n;
  if (idem_canon_json(c, line, len, &canon, &n) != IDEM_OK)
    return idem_canon_errmsg(c);
  return cli_outbuf_put(out, canon, n) || cli_outbuf_put(out, "\n", 1)
             ? "out of memory"
             : NULL;
}

/* Canonicalize stdin line by line, on every core: a rejected line prints
** an empty line on stdout and its error, with the line number, on stderr. */
static int canon_lines(size_t depth, size_t bytes) {
  void *states[16];
  int n = cli_workers(), k, rc = EXIT_FAIL;
  if (n > 16) n = 16;
  for (k = 0; k < n; k++) {
    idem_canon *c = NULL;
    if (idem_canon_open(&c) != IDEM_OK || cli_canon_limits(c, depth, bytes)) {
      idem_canon_close(c);
      break;
    }
    states[k] = c;
  }
  if (k == n)
    rc = cli_map_lines(0, bytes, canon_line, states, n);
  else
    cli_err("out of memory");
  while (k-- > 0) idem_canon_close(states[k]);
  return rc;
}

int cmd_canon(int argc, char **argv) {
  static const struct option opts[] = {
      {"lines", no_argument, NULL, 'l'},
      {"max-depth", required_argument, NULL, 'd'},
      {"max-bytes", required_argument, NULL, 'b'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  size_t depth = IDEM_DEFAULT_MAX_DEPTH, bytes = IDEM_DEFAULT_MAX_BYTES;
  const char *path = NULL, *what, *out;
  size_t len, out_len;
  char *text;
  int lines = 0, ch, err, truncated, rc;
  idem_canon *c;

  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 'l': lines = 1; break;
    case 'd':
      if (cli_parse_size("--max-depth", optarg, 1, 1000000, &depth))
        return EXIT_USAGE;
      break;
    case 'b':
      if (cli_parse_size("--max-bytes", optarg, 1, SIZE_MAX / 16, &bytes))
        return EXIT_USAGE;
      break;
    case 'h': cli_print_usage(stdout, "canon"); return EXIT_OK;
    case ':':
      return cli_usage("canon", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("canon", "no option '%s' for canon", argv[optind - 1]);
    }
  }
  if (optind < argc) path = argv[optind++];
  if (optind < argc) return cli_usage("canon", "too many arguments");
  if (lines && path)
    return cli_usage("canon", "--lines reads standard input, not a file");

  if (idem_canon_open(&c) != IDEM_OK) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  if (cli_canon_limits(c, depth, bytes)) {
    idem_canon_close(c);
    return EXIT_USAGE;
  }
  if (lines) {
    idem_canon_close(c);
    return canon_lines(depth, bytes);
  }

  what = path && strcmp(path, "-") != 0 ? path : "stdin";
  if ((err = cli_read_all(path, bytes, &text, &len, &truncated))) {
    cli_err("%s: %s", what, strerror(err));
    idem_canon_close(c);
    return EXIT_FAIL;
  }
  if (truncated) {
    cli_err("%s: text larger than the limit of %zu bytes at byte %zu", what,
            bytes, bytes);
    rc = EXIT_DATA;
  } else if (idem_canon_json(c, text, len, &out, &out_len) != IDEM_OK) {
    cli_err("%s: %s", what, idem_canon_errmsg(c));
    rc = EXIT_DATA;
  } else {
    fwrite(out, 1, out_len, stdout);
    fputc('\n', stdout);
    rc = cli_flush();
  }
  free(text);
  idem_canon_close(c);
  return rc;
}

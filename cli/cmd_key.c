/*
** cmd_key.c - `idem key`: mint idempotency keys from the shell.
*/
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

static void print_key(const idem_key *k, int json) {
  if (json) {
    fputs("{\"fingerprint\":\"", stdout);
    fwrite(k->fingerprint, 1, 64, stdout);
    /* keys are percent-encoded ASCII: safe inside a JSON string as is */
    fputs("\",\"key\":\"", stdout);
    fwrite(k->key, 1, k->key_len, stdout);
    fputs("\",\"payload\":", stdout);
    fwrite(k->payload, 1, k->payload_len, stdout);
    fputs("}\n", stdout);
  } else {
    fwrite(k->key, 1, k->key_len, stdout);
    fputc('\n', stdout);
  }
}

static int key_lines(idem_canon *c, const idem_keyspec *spec, int json,
                     size_t max_bytes) {
  cli_lines r;
  const char *line;
  size_t len, rejected = 0;
  int too_long, rc, got;
  idem_key k;
  if (cli_lines_open(&r, 0, max_bytes)) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  while ((got = cli_lines_next(&r, &line, &len, &too_long)) == 1) {
    if (too_long) {
      fflush(stdout);
      cli_err("line %zu: text larger than the limit of %zu bytes at byte %zu",
              r.lineno, max_bytes, max_bytes);
      rejected++;
      fputc('\n', stdout);
      continue;
    }
    if (idem_key_mint_json(c, line, len, spec, &k) != IDEM_OK) {
      fflush(stdout);
      cli_err("line %zu: %s", r.lineno, idem_canon_errmsg(c));
      rejected++;
      fputc('\n', stdout);
      continue;
    }
    print_key(&k, json);
  }
  if (got < 0) cli_err("reading standard input: %s", strerror(errno));
  cli_lines_close(&r);
  rc = cli_flush();
  if (got < 0 || rc) return EXIT_FAIL;
  return rejected ? EXIT_DATA : EXIT_OK;
}

int cmd_key(int argc, char **argv) {
  static const struct option opts[] = {
      {"session", required_argument, NULL, 's'},
      {"call", required_argument, NULL, 'c'},
      {"tool", required_argument, NULL, 't'},
      {"key-arg", required_argument, NULL, 'k'},
      {"key-max-len", required_argument, NULL, 'm'},
      {"json", no_argument, NULL, 'j'},
      {"lines", no_argument, NULL, 'l'},
      {"max-depth", required_argument, NULL, 'd'},
      {"max-bytes", required_argument, NULL, 'b'},
      {"help", no_argument, NULL, 'h'},
      {NULL, 0, NULL, 0}};
  size_t depth = IDEM_DEFAULT_MAX_DEPTH, bytes = IDEM_DEFAULT_MAX_BYTES;
  idem_keyspec spec = {NULL, 0};
  idem_call call = {NULL, NULL, NULL, NULL, 0};
  int json = 0, lines = 0, ch, rc, err, truncated;
  char *text = NULL;
  idem_canon *c;
  idem_key k;

  while ((ch = getopt_long(argc, argv, ":h", opts, NULL)) != -1) {
    switch (ch) {
    case 's': call.session = optarg; break;
    case 'c': call.call_id = optarg; break;
    case 't': call.tool = optarg; break;
    case 'k': spec.key_arg = optarg; break;
    case 'm':
      if (cli_parse_size("--key-max-len", optarg, 66, SIZE_MAX / 4,
                         &spec.key_max_len))
        return EXIT_USAGE;
      break;
    case 'j': json = 1; break;
    case 'l': lines = 1; break;
    case 'd':
      if (cli_parse_size("--max-depth", optarg, 1, 1000000, &depth))
        return EXIT_USAGE;
      break;
    case 'b':
      if (cli_parse_size("--max-bytes", optarg, 1, SIZE_MAX / 16, &bytes))
        return EXIT_USAGE;
      break;
    case 'h': cli_print_usage(stdout, "key"); return EXIT_OK;
    case ':':
      return cli_usage("key", "option '%s' needs a value", argv[optind - 1]);
    default:
      return cli_usage("key", "no option '%s' for key", argv[optind - 1]);
    }
  }
  if (lines) {
    if (call.session || call.call_id || call.tool || optind < argc)
      return cli_usage("key", "--lines takes the calls from standard input, "
                              "not from --session/--call/--tool or ARGS");
  } else {
    if (!call.session) return cli_usage("key", "--session is required");
    if (!call.call_id) return cli_usage("key", "--call is required");
    if (!call.tool) return cli_usage("key", "--tool is required");
    if (argc - optind > 1) return cli_usage("key", "too many arguments");
  }

  if (idem_canon_open(&c) != IDEM_OK) {
    cli_err("out of memory");
    return EXIT_FAIL;
  }
  if (cli_canon_limits(c, depth, bytes)) {
    idem_canon_close(c);
    return EXIT_USAGE;
  }
  if (lines) {
    rc = key_lines(c, &spec, json, bytes);
    idem_canon_close(c);
    return rc;
  }

  if (optind < argc) {
    call.args = argv[optind];
    call.args_len = strlen(argv[optind]);
  } else {
    if ((err = cli_read_all(NULL, bytes, &text, &call.args_len, &truncated))) {
      cli_err("stdin: %s", strerror(err));
      idem_canon_close(c);
      return EXIT_FAIL;
    }
    if (truncated) {
      cli_err("arguments: text larger than the limit of %zu bytes at byte %zu",
              bytes, bytes);
      free(text);
      idem_canon_close(c);
      return EXIT_DATA;
    }
    call.args = text;
  }
  rc = idem_key_mint(c, &call, &spec, &k);
  if (rc == IDEM_OK) {
    print_key(&k, json);
    rc = cli_flush();
  } else {
    cli_err("%s", idem_canon_errmsg(c));
    rc = rc == IDEM_NOMEM ? EXIT_FAIL : EXIT_DATA;
  }
  free(text);
  idem_canon_close(c);
  return rc;
}

/*
** cmd_key.c - `idem key`: mint idempotency keys from the shell.
*/
#include <getopt.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"

/* The key, or {"fingerprint","key","payload"} with --json, and a newline. */
static int put_key(cli_outbuf *o, const idem_key *k, int json) {
  if (!json)
    return cli_outbuf_put(o, k->key, k->key_len) || cli_outbuf_put(o, "\n", 1);
  /* keys are percent-encoded ASCII: safe inside a JSON string as they are */
  return cli_outbuf_put(o, "{\"fingerprint\":\"", 16) ||
         cli_outbuf_put(o, k->fingerprint, 64) ||
         cli_outbuf_put(o, "\",\"key\":\"", 9) ||
         cli_outbuf_put(o, k->key, k->key_len) ||
         cli_outbuf_put(o, "\",\"payload\":", 12) ||
         cli_outbuf_put(o, k->payload, k->payload_len) ||
         cli_outbuf_put(o, "}\n", 2);
}

typedef struct key_worker {
  idem_canon *c;
  const idem_keyspec *spec;
  int json;
} key_worker;

static const char *key_line(void *state, const char *line, size_t len,
                            cli_outbuf *out) {
  key_worker *w = state;
  idem_key k;
  if (idem_key_mint_json(w->c, line, len, w->spec, &k) != IDEM_OK)
    return idem_canon_errmsg(w->c);
  return put_key(out, &k, w->json) ? "out of memory" : NULL;
}

/* Mint the keys of stdin's call lines, on every core. */
static int key_lines(const idem_keyspec *spec, int json, size_t depth,
                     size_t bytes) {
  key_worker w[16];
  void *states[16];
  int n = cli_workers(), k, rc = EXIT_FAIL;
  if (n > 16) n = 16;
  for (k = 0; k < n; k++) {
    w[k].c = NULL;
    w[k].spec = spec;
    w[k].json = json;
    if (idem_canon_open(&w[k].c) != IDEM_OK ||
        cli_canon_limits(w[k].c, depth, bytes)) {
      idem_canon_close(w[k].c);
      break;
    }
    states[k] = &w[k];
  }
  if (k == n)
    rc = cli_map_lines(0, bytes, key_line, states, n);
  else
    cli_err("out of memory");
  while (k-- > 0) idem_canon_close(w[k].c);
  return rc;
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
  idem_keyspec spec = {sizeof spec, NULL, 0};
  idem_call call = {sizeof call, NULL, NULL, NULL, NULL, 0, NULL, 0};
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
    idem_canon_close(c);
    return key_lines(&spec, json, depth, bytes);
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
    cli_outbuf o;
    cli_outbuf_init(&o, SIZE_MAX);
    if (put_key(&o, &k, json) == 0) fwrite(o.p, 1, o.len, stdout);
    cli_outbuf_free(&o);
    rc = cli_flush();
  } else {
    cli_err("%s", idem_canon_errmsg(c));
    rc = rc == IDEM_NOMEM ? EXIT_FAIL : EXIT_DATA;
  }
  free(text);
  idem_canon_close(c);
  return rc;
}

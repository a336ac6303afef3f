/*
** main.c - the idem command: dispatch to a verb, help and version.
*/
#include <getopt.h>
#include <string.h>

#include "cli.h"

const cli_verb cli_verbs[] = {
    {"canon", cmd_canon, "print the RFC 8785 canonical form of JSON texts",
     "usage: idem canon [--max-depth N] [--max-bytes N] [FILE]\n"
     "       idem canon --lines [--max-depth N] [--max-bytes N]\n"
     "\n"
     "Print the canonical form (RFC 8785) of one JSON text read from FILE or\n"
     "standard input, followed by a newline.  With --lines, read one text per\n"
     "line of standard input and print one canonical text per line; a\n"
     "rejected line prints an empty line and its error (with the line number)\n"
     "on standard error, and the command exits 65 at the end.\n"
     "\n"
     "  --max-depth N   deepest nesting accepted (default 128)\n"
     "  --max-bytes N   largest text accepted (default 1048576)\n"},
    {"key", cmd_key, "mint the idempotency key of a tool call",
     "usage: idem key --session S --call C --tool T [options] [ARGS]\n"
     "       idem key --lines [options]\n"
     "\n"
     "Print the idempotency key of one call: the session, the model's call\n"
     "id and a digest of the canonical {\"args\":ARGS,\"tool\":T}.  ARGS is a\n"
     "JSON object (standard input when omitted).  With --lines, read calls\n"
     "as JSON lines {\"session\",\"call\",\"tool\",\"args\"} and print one "
     "key\n"
     "per line; rejected lines are reported as for canon --lines.\n"
     "\n"
     "  --json            print {\"fingerprint\",\"key\",\"payload\"} instead\n"
     "  --key-arg NAME    drop argument NAME before fingerprinting\n"
     "  --key-max-len N   longest plain key; longer ones become h:SHA256\n"
     "                    (default 255, at least 66)\n"
     "  --max-depth N     deepest nesting of ARGS accepted (default 128)\n"
     "  --max-bytes N     largest text accepted (default 1048576)\n"},
    {"bench", cmd_bench, "measure idem against its peers (SPEC §12)",
     "usage: idem bench [--quick] [--only NAME] [--dir DIR]\n"
     "\n"
     "Run the benchmarks of SPEC §12 side by side with their peers in one run\n"
     "and print one JSON object per figure.  Peers that are missing (python3,\n"
     "node and the npm package canonicalize) are reported as skipped.\n"
     "\n"
     "  --quick       smaller inputs, for a smoke test\n"
     "  --only NAME   run one benchmark: key, canon or dtoa\n"
     "  --dir DIR     where to write the generated inputs (default: a new\n"
     "                directory under $TMPDIR, removed at the end)\n"},
    {NULL, NULL, NULL, NULL}};

static void print_help(FILE *f) {
  const cli_verb *v;
  fputs("usage: idem VERB [OPTIONS] [ARGS]\n"
        "\n"
        "idem makes the side-effecting tool calls of AI agents take effect at\n"
        "most once.  Verbs:\n\n",
        f);
  for (v = cli_verbs; v->name; v++)
    fprintf(f, "  %-8s %s\n", v->name, v->summary);
  fputs("\n"
        "  idem help VERB     the options of a verb\n"
        "  idem --version     the version\n"
        "\n"
        "Exit status: 0 success, 1 failure, 2 usage error, 65 bad input data.\n"
        "See idem(1).\n",
        f);
}

int main(int argc, char **argv) {
  const cli_verb *v;
  const char *verb = argc > 1 ? argv[1] : NULL;
  opterr = 0; /* the verbs print their own one-line "idem: ..." errors */
  if (!verb) {
    print_help(stderr);
    return EXIT_USAGE;
  }
  if (strcmp(verb, "--version") == 0 || strcmp(verb, "version") == 0) {
    printf("idem %s\n", idem_version());
    return cli_flush();
  }
  if (strcmp(verb, "help") == 0 || strcmp(verb, "--help") == 0 ||
      strcmp(verb, "-h") == 0) {
    if (argc > 2) {
      for (v = cli_verbs; v->name; v++)
        if (strcmp(v->name, argv[2]) == 0) {
          fputs(v->usage, stdout);
          return cli_flush();
        }
      cli_err("no verb '%s' (try 'idem help')", argv[2]);
      return EXIT_USAGE;
    }
    print_help(stdout);
    return cli_flush();
  }
  for (v = cli_verbs; v->name; v++)
    if (strcmp(v->name, verb) == 0) return v->run(argc - 1, argv + 1);
  cli_err("no verb '%s' (try 'idem help')", verb);
  return EXIT_USAGE;
}

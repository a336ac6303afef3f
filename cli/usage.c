/*
** usage.c - what `idem help` says: each verb's one-line summary and its
** usage text, and the usage errors that quote them.  No verb's code is
** referred to here (main.c dispatches), so every verb may use these.
*/
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"

typedef struct cli_help {
  const char *name;
  const char *summary; /* NULL: not listed (a hidden verb) */
  const char *usage;
} cli_help;

static const cli_help helps[] = {
    {"canon", "print the RFC 8785 canonical form of JSON texts",
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
    {"key", "mint the idempotency key of a tool call",
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
    {"policy", "check a policy file, or explain a tool under it",
     "usage: idem policy check FILE\n"
     "       idem policy explain FILE TOOL\n"
     "\n"
     "check validates the policy in FILE (docs/POLICY.md) and prints\n"
     "\"FILE: ok (N tools: a, b, ...)\".  An invalid policy prints one line,\n"
     "\"idem: FILE: field: what is wrong\", and exits 65; a file that cannot\n"
     "be read exits 1.\n"
     "\n"
     "explain prints, in words, how TOOL is treated under the policy in\n"
     "FILE: its class, what \"the same action\" means for it (key, fence),\n"
     "what happens on a timeout (retries, reconciliation, the status check)\n"
     "and how long its records are kept.  A tool the policy does not name\n"
     "is explained under unknown_tools.\n"},
    {"exec", "run a command-line tool through the guard",
     "usage: idem exec [--policy FILE] [--log URL] --session S --call C\n"
     "                 --tool T [--turn ID] [--args JSON|-] [--timeout MS]\n"
     "                 [--status CMD] -- COMMAND [ARGS...]\n"
     "\n"
     "Run COMMAND as the tool T of one call, at most once per action: the\n"
     "attempt is recorded in the log before the command starts, a repeat of\n"
     "the call replays the recorded outcome, and a timeout is reconciled\n"
     "with the status command.  The command gets the key in IDEM_KEY (and\n"
     "IDEM_SESSION, IDEM_CALL_ID, IDEM_TOOL, IDEM_ATTEMPT) and the canonical\n"
     "arguments on stdin.  Its exit status: 0 applied (stdout is the\n"
     "result), 100 certainly not applied, 101 rejected, anything else (or\n"
     "the deadline) unknown.  The status command (sh -c CMD) gets the same\n"
     "environment: 0 applied, 100 not applied, else unknown.\n"
     "\n"
     "Prints the envelope (SPEC 7) and exits 0 succeeded/already_applied,\n"
     "1 failed, 65 invalid_arguments/conflict, 75 outcome_unknown/\n"
     "in_progress, 77 refused.\n"
     "\n"
     "  --policy FILE  the policy (without it, T is guarded with defaults)\n"
     "  --log URL      the attempt log (default $IDEM_LOG, else\n"
     "                 $XDG_STATE_HOME/idem/attempts.db)\n"
     "  --turn ID      the model turn that issued the call (default\n"
     "                 $IDEM_TURN): identical calls of one turn run once\n"
     "  --args JSON    the arguments, a JSON object ('-': stdin; default {})\n"
     "  --timeout MS   the deadline of one attempt (default 30000)\n"
     "  --status CMD   the status check\n"},
    {"call", "make a guarded HTTP call of the policy",
     "usage: idem call --policy FILE [--log URL] --session S --call C\n"
     "                 --tool T [--turn ID] [--args JSON|-] [--verbose]\n"
     "\n"
     "Make the HTTP request of tool T (its \"http\" rule in the policy:\n"
     "method, URL template, the key in the Idempotency-Key header or the\n"
     "one the policy names, the arguments as the JSON body) through the\n"
     "guard, within the tool's timeout_ms.  Connection refused or a name\n"
     "that does not resolve: not applied (retried with the same key); a\n"
     "timeout or reset after sending: unknown, reconciled with the status\n"
     "tool when it is an HTTP tool too; 2xx applied; other 4xx rejected;\n"
     "409, 429 and 5xx as the rule's on_409/on_429/on_5xx (default\n"
     "unknown).\n"
     "\n"
     "Prints the envelope and exits as idem exec does.\n"
     "\n"
     "  --turn ID      the model turn that issued the call (default\n"
     "                 $IDEM_TURN): identical calls of one turn run once\n"
     "  --args JSON    the arguments, a JSON object ('-': stdin; default {})\n"
     "  --verbose      tell each attempt and status check on stderr\n"},
    {"demo", "the refund story, end to end, against a simulator",
     "usage: idem demo [--paysim PATH] [--keep]\n"
     "\n"
     "Tell the refund story of SPEC 1 step by step, for real: a payment-\n"
     "provider simulator (idem-paysim) over HTTP on loopback, the embedded\n"
     "SQLite store in a temporary directory, and `idem call` as the agent's\n"
     "harness.  A refund times out after the provider applied it, the\n"
     "transport retries, the model re-issues the call under a new call id,\n"
     "the harness is killed mid-call and resumed, the provider crashes and\n"
     "is recovered, and a legitimate second refund goes through.  Ends by\n"
     "checking the provider's ledger; exits 0 only when everything matched.\n"
     "\n"
     "  --paysim PATH  the simulator (default: $IDEM_PAYSIM, else next to\n"
     "                 this program, else idem-paysim in PATH)\n"
     "  --keep         keep the temporary directory (log, ledger, policy)\n"},
    {"mcp", "put the guard in front of an MCP server (stdio or HTTP)",
     "usage: idem mcp --policy FILE [--log URL] [--session ID]\n"
     "                [--max-message N] [--console HOST:PORT]\n"
     "                [--listen HOST:PORT] [--header 'Name: value']...\n"
     "                [--public-url URL] [--caller-header NAME]\n"
     "                [--call-id-meta KEY]... [--allow-origin ORIGIN]...\n"
     "                [--max-connections N] [--request-timeout S]\n"
     "                -- COMMAND [ARGS...] | URL\n"
     "\n"
     "Run the MCP server COMMAND as a child (or reach the MCP server at an\n"
     "http(s) URL over Streamable HTTP) and speak MCP to the client in its\n"
     "place: over standard input and output (one JSON-RPC message per\n"
     "line), or with --listen over Streamable HTTP at /mcp.  Every\n"
     "message passes through unchanged, except that tools/call of a guarded\n"
     "tool goes through the guard: recorded before it reaches the server,\n"
     "replayed when repeated, reconciled with the policy's status tool on a\n"
     "timeout.  Tools the policy does not name are classified from their\n"
     "tools/list annotations.  The session and call id come from the\n"
     "request's _meta \"io.idem/session\" and \"io.idem/call_id\" (else the\n"
     "client's own tool-call id, claudecode/toolUseId), else the client's\n"
     "MCP session at idem (HTTP) or --session, and the JSON-RPC id; the\n"
     "model turn from \"io.idem/turn\" (or Codex's turn metadata).  Over\n"
     "HTTP, callers with different credentials are never one action.\n"
     "Exits with the server's status (an HTTP upstream: 0 when the\n"
     "client leaves, or on SIGTERM/SIGINT with --listen).\n"
     "See docs/MCP.md.\n"
     "\n"
     "  --policy FILE      the policy (docs/POLICY.md)\n"
     "  --suggest-policy   print a draft policy for the server's tools and\n"
     "                     exit, for a person to edit (takes only --header)\n"
     "  --log URL          the attempt log (default $IDEM_LOG, else\n"
     "                     $XDG_STATE_HOME/idem/attempts.db)\n"
     "  --session ID       the session of calls without one in _meta\n"
     "                     (default $IDEM_SESSION, else a new one per run)\n"
     "  --max-message N    largest message in bytes (default 4194304)\n"
     "  --console HOST:PORT  serve the console of idem serve from this\n"
     "                     process too (its address and token on stderr):\n"
     "                     its /metrics then count this gateway's calls\n"
     "  --listen HOST:PORT serve clients over Streamable HTTP at /mcp\n"
     "                     (PORT alone: on 127.0.0.1; its URL on stderr); with\n"
     "                     $IDEM_MCP_TOKEN set, clients must present it\n"
     "  --header 'N: V'    an HTTP upstream's header ({$env:NAME} is the\n"
     "                     variable); an Authorization here is idem's own\n"
     "                     credential, else clients' pass through\n"
     "  --public-url URL   the URL clients use for this gateway (an OAuth\n"
     "                     upstream's metadata names it): /.well-known/ is\n"
     "                     the upstream's\n"
     "  --caller-header NAME  the header a trusted proxy names the user in\n"
     "                     (default: the client's Authorization)\n"
     "  --call-id-meta KEY a _meta member that holds the client's tool-call\n"
     "                     id (claudecode/toolUseId is always read)\n"
     "  --allow-origin O   an Origin allowed beyond loopback's own\n"
     "  --max-connections N  HTTP connections at once (default 1024)\n"
     "  --request-timeout S  an HTTP request arrives whole within S seconds,\n"
     "                     or its connection is cut (default 30)\n"},
    {"__run", NULL, ""},
    {"ls", "list the records of the attempt log",
     "usage: idem ls [--log URL] [--session S] [--state STATE] [--in-doubt]\n"
     "               [--limit N] [--json]\n"
     "\n"
     "List records, oldest first: a table, or one JSON object per line.\n"
     "STATE is pending, succeeded, failed, not_applied, in_doubt or\n"
     "deduplicated (repeat --state for several).  --in-doubt lists what\n"
     "waits for a verdict (idem recover, or idem resolve): in doubt, or\n"
     "pending under a holder that is gone.\n"},
    {"show", "show one record of the attempt log",
     "usage: idem show [--log URL] [--json] SESSION CALL\n"
     "\n"
     "Every field of the record of one action.  Exits 1 when there is none.\n"},
    {"recover", "reconcile every action in doubt",
     "usage: idem recover [--log URL] [--policy FILE] [--status CMD] "
     "[--batch]\n"
     "                    [--workers N] [--json]\n"
     "\n"
     "For every record in doubt (or pending under a dead owner or an expired\n"
     "lease), run its status check - the policy's status command or HTTP\n"
     "status tool, or --status CMD for every tool - and settle the record: "
     "applied ->\n"
     "succeeded, not applied -> not_applied (the next call retries with the\n"
     "same key) once no attempt of it can still land, else it stays in doubt\n"
     "(an attempt that ended without a verdict may land until settle_ms);\n"
     "a record without a check stays in doubt (idem resolve).  Never runs a\n"
     "tool.\n"
     "\n"
     "  --status CMD  sh -c CMD with IDEM_KEY in its environment and the\n"
     "                arguments on stdin: 0 applied (stdout the result), 100\n"
     "                not applied, anything else unknown\n"
     "  --batch       start CMD once per worker instead; it reads one request\n"
     "                per line, "
     "{\"session\",\"call_id\",\"tool\",\"key\",\"args\"},\n"
     "                and answers one line: applied [RESULT-JSON], "
     "not_applied\n"
     "                or unknown (for large backlogs)\n"
     "  --workers N   records settled at once (default 8)\n"},
    {"resolve", "record an operator's verdict on an action in doubt",
     "usage: idem resolve [--log URL] [--by WHO] SESSION CALL\n"
     "                    (--applied [--result JSON] | --not-applied "
     "--reason TEXT)\n"
     "\n"
     "After checking with the provider by hand, settle an action in doubt\n"
     "(idem ls --in-doubt lists them): --applied makes every later call of\n"
     "it replay the result (a re-issue answers already_applied);\n"
     "--not-applied lets the next call run it again with its key - say it\n"
     "only when no attempt of it can land any more.  Recorded with who\n"
     "(--by, default USER@HOST) and when; idem show prints both.  Refused,\n"
     "exit 1, for an action that is not in doubt.\n"
     "\n"
     "  --result JSON   the action's result, as the tool would have answered\n"
     "  --reason TEXT   what the provider said (required with --not-applied)\n"},
    {"serve", "the operator's console: actions in doubt, /metrics",
     "usage: idem serve [--log URL] [--policy FILE] [--listen HOST:PORT]\n"
     "                  [--read-only]\n"
     "\n"
     "A web console on the attempt log (docs/CONSOLE.md): the actions in\n"
     "doubt, oldest first; a session's calls in order; a search; and the\n"
     "verdict of idem resolve.  /metrics answers in Prometheus text format,\n"
     "/api/... in JSON.  Prints its address and the token that writes need\n"
     "(or takes IDEM_SERVE_TOKEN, 16 characters or more), then serves until\n"
     "SIGINT or SIGTERM.\n"
     "\n"
     "  --listen HOST:PORT  where to listen (default 127.0.0.1:8787; PORT 0\n"
     "                      picks a free one)\n"
     "  --policy FILE       the policy: shows when each action's settle_ms\n"
     "                      ends\n"
     "  --read-only         no write route at all\n"},
    {"gc", "delete records past their retention",
     "usage: idem gc [--log URL] [--json]\n"
     "\n"
     "Delete settled records (succeeded, failed, not_applied, deduplicated)\n"
     "whose retention, counted from each one's last settlement, has passed.\n"
     "Records pending or in doubt are never deleted.\n"},
    {"stats", "count the records of the attempt log by state",
     "usage: idem stats [--log URL] [--json]\n"},
    {"bench", "measure idem against its peers (SPEC §12)",
     "usage: idem bench [--quick] [--only NAME] [--dir DIR]\n"
     "\n"
     "Run the benchmarks of SPEC §12 side by side with their peers in one run\n"
     "and print one JSON object per figure.  Peers that are missing (python3,\n"
     "node and the npm package canonicalize) are reported as skipped.\n"
     "\n"
     "  --quick       smaller inputs, for a smoke test\n"
     "  --only NAME   run one benchmark: key, canon, dtoa or guard\n"
     "  --dir DIR     where to write the generated inputs (default: a new\n"
     "                directory under $TMPDIR, removed at the end)\n"},
    {NULL, NULL, NULL}};

void cli_print_help(FILE *f) {
  const cli_help *v;
  fputs("usage: idem VERB [OPTIONS] [ARGS]\n"
        "\n"
        "idem makes the side-effecting tool calls of AI agents take effect at\n"
        "most once.  Verbs:\n\n",
        f);
  for (v = helps; v->name; v++)
    if (v->summary) fprintf(f, "  %-8s %s\n", v->name, v->summary);
  fputs("\n"
        "  idem help VERB     the options of a verb\n"
        "  idem --version     the version\n"
        "\n"
        "Exit status: 0 success, 1 failure, 2 usage error, 65 bad input data.\n"
        "See idem(1).\n",
        f);
}

int cli_print_usage(FILE *f, const char *verb) {
  const cli_help *v;
  for (v = helps; v->name; v++)
    if (strcmp(v->name, verb) == 0) {
      fputs(v->usage, f);
      return 0;
    }
  return -1;
}

int cli_usage(const char *verb, const char *fmt, ...) {
  va_list ap;
  fputs("idem: ", stderr);
  va_start(ap, fmt);
  vfprintf(stderr, fmt, ap);
  va_end(ap);
  fputc('\n', stderr);
  cli_print_usage(stderr, verb);
  return EXIT_USAGE;
}

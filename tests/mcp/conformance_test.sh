#!/bin/bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, its
# server scenarios) over Streamable HTTP against two servers, each first
# directly, then through `idem mcp --listen` standing in front of it:
#
#   server-everything   @modelcontextprotocol/server-everything (npm), idem
#                       with everything_policy.json.  It lacks most of the
#                       fixtures the suite's checks name, so only some
#                       scenarios pass even directly.
#   conformance_server  conformance_server.mjs: the official SDK serving
#                       exactly the fixtures the suite checks (every scenario
#                       should pass directly), idem with
#                       conformance_policy.json (guarded tools among them:
#                       sampling, elicitation, progress, logging and the
#                       SEP-1699 stream resumption go through the guard).
#
# Prints one line per scenario (each server: direct, through idem) and fails
# when a scenario that passes directly fails through idem, when fewer than
# MIN_DIRECT scenarios pass directly against server-everything, or when one
# fails directly against conformance_server.mjs (a suite or a fixture that
# cannot run must not look green).
#
# A scenario's verdict, from its checks.json: pass (a check succeeded and
# none failed), FAIL, n/a (the suite ran it and says so, but every check is
# INFO: it found nothing to verify - server-sse-polling when the answer is
# JSON rather than an SSE stream; the suite itself counts that a pass), or
# no result.  n/a through idem where the scenario passes directly is said,
# and does not fail the test.
#
#   tests/mcp/conformance_test.sh PATH/TO/idem
#
# The suite needs Node >= 22: it runs on the npm package node@22
# (node_modules/node/bin/node here), and only the suite does; the servers run
# on $NODE (default: node on the PATH).  All in tests/mcp/package-lock.json:
# `scripts/install-deps.sh --peers` installs it.
#
# Every wait is bounded; the servers and idem are stopped on any exit.  The
# files (the suite's checks.json per scenario, the servers' and idem's
# output) are kept in a temporary directory when the test fails (or with
# CONFORMANCE_KEEP=1), and its path printed.
set -u

usage="usage: conformance_test.sh PATH/TO/idem"
[ $# -eq 1 ] || { echo "$usage" >&2; exit 2; }
idem=$1
[ -x "$idem" ] || { echo "conformance: $idem: not an executable" >&2; exit 2; }

here=$(cd "$(dirname "$0")" && pwd)
NODE=${NODE:-node}
node22=$here/node_modules/node/bin/node
suite=$here/node_modules/@modelcontextprotocol/conformance/dist/index.js
everything=$here/node_modules/@modelcontextprotocol/server-everything/dist/transports/streamableHttp.js
fixture=$here/conformance_server.mjs

MIN_DIRECT=5      # scenarios that must pass directly against server-everything
START_S=15        # a server to say it listens
SUITE_S=25        # the whole suite in one run (some 2 s when it goes well)
SCENARIO_S=15     # one scenario run again on its own (when the suite run left it without a result)
RERUN_BUDGET_S=20 # no scenario is run again this long after a run began
# so one run (of four) takes at most some 45 s, the whole test some 4 min

for f in "$node22" "$suite" "$everything" "$fixture" "$here/everything_policy.json" \
         "$here/conformance_policy.json"; do
  [ -e "$f" ] || { echo "conformance: $f is missing; run scripts/install-deps.sh --peers" >&2; exit 1; }
done
command -v "$NODE" >/dev/null || { echo "conformance: no $NODE" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-conformance.XXXXXX") || exit 1
server_pid=""
idem_pid=""
url_file=""
url_expr=""
keep=1

# stop PID: TERM, then KILL after 5 s; reaps it
stop() {
  local pid=$1 i
  [ -n "$pid" ] || return 0
  kill -TERM "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
  for i in $(seq 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  kill -KILL "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  return 0
}
cleanup() {
  stop "$idem_pid"; idem_pid=""
  stop "$server_pid"; server_pid=""
  if [ "$keep" = 1 ]; then
    echo "conformance: files kept in $dir"
  else
    rm -rf "$dir"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ms() { date +%s%3N; }
secs() { local t=$1; printf '%d.%d s' $((t / 1000)) $((t % 1000 / 100)); }

# wait_url PID FILE SED: the first match of the sed expression SED in FILE,
# written by PID, within START_S seconds; fails when PID exits first
wait_url() {
  local pid=$1 file=$2 expr=$3 url i
  for i in $(seq $((START_S * 10))); do
    url=$(sed -n "$expr" "$file" 2>/dev/null | head -n 1)
    [ -n "$url" ] && { echo "$url"; return 0; }
    kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

# the scenarios, as the suite lists them ("  - NAME [VERSIONS]")
"$node22" "$suite" list --server >"$dir/list.txt" 2>&1 ||
  { echo "conformance: the suite does not run:"; cat "$dir/list.txt"; exit 1; }
scenarios=$(sed -n 's/^  - \([A-Za-z0-9_.-]*\).*/\1/p' "$dir/list.txt")
n=$(echo "$scenarios" | grep -c .)
[ "$n" -gt 0 ] || { echo "conformance: the suite lists no server scenario:"; cat "$dir/list.txt"; exit 1; }
protocols=$(sed -n 's/^  - [^ ]* \[\(.*\)\]$/\1/p' "$dir/list.txt" | tr ',' '\n' | sort -u | tr '\n' ' ')

# classify OUT: for each scenario a line "NAME<TAB>pass|fail|na|none<TAB>WHY"
# from the newest OUT/**/server-NAME-<time>/checks.json: pass when a check
# succeeded and none failed, na when every check is INFO (the suite ran it
# and found nothing to verify), none when no file
classify() {
  "$NODE" --input-type=module -e '
    import fs from "node:fs";
    import path from "node:path";
    const [out, ...names] = process.argv.slice(1);
    const dirs = [];
    (function walk(d) {
      for (const e of fs.readdirSync(d, { withFileTypes: true }))
        if (e.isDirectory()) { dirs.push(path.join(d, e.name)); walk(path.join(d, e.name)); }
    })(out);
    for (const name of names) {
      const re = new RegExp(`^server-${name.replace(/[.]/g, "\\.")}-\\d{4}-\\d\\d-\\d\\dT`);
      const mine = dirs.filter((d) => re.test(path.basename(d)) && fs.existsSync(path.join(d, "checks.json")))
        .sort((a, b) => path.basename(a).localeCompare(path.basename(b)));
      let verdict = "none", why = "no result (the suite timed out or crashed in it)";
      if (mine.length) {
        try {
          const checks = JSON.parse(fs.readFileSync(path.join(mine.at(-1), "checks.json"), "utf8"));
          const failed = checks.filter((c) => c.status === "FAILURE");
          const ok = checks.filter((c) => c.status === "SUCCESS");
          const info = checks.filter((c) => c.status === "INFO");
          if (failed.length) { verdict = "fail"; why = failed.map((c) => `${c.name}: ${c.errorMessage ?? c.description}`).join("; "); }
          else if (!ok.length && checks.length && info.length === checks.length) {
            verdict = "na";
            const last = info.at(-1);
            why = `only INFO checks, the last: ${last.name}: ${last.details?.message ?? last.description}`;
          }
          else if (!ok.length) { verdict = "fail"; why = "no check succeeded"; }
          else { verdict = "pass"; why = ""; }
        } catch (e) { verdict = "fail"; why = `checks.json: ${e.message}`; }
      }
      console.log(`${name}\t${verdict}\t${why.replace(/\s+/g, " ")}`);
    }' "$1" $scenarios
}

# half LABEL URL: run every scenario against URL; results in $dir/LABEL.tsv.
# The whole suite in one run (fast); a scenario it left without a result
# (a hang, a crash) is run again on its own, each bounded.
half() {
  local label=$1 url=$2 out=$dir/$1 t0 s rc hung
  t0=$(ms)
  mkdir -p "$out"
  : >"$out.why"
  timeout -k 5 "$SUITE_S" "$node22" "$suite" server --url "$url" --suite all -o "$out" \
    >"$out.log" 2>&1 </dev/null
  rc=$?
  classify "$out" >"$out.tsv"
  if [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    hung=$(sed -n 's/^=== Running scenario: \(.*\) ===$/\1/p' "$out.log" | tail -n 1)
    echo "conformance: $label: the suite run was stopped after ${SUITE_S} s, in scenario ${hung:-?}"
  fi
  for s in $(awk -F'\t' '$2 == "none" { print $1 }' "$out.tsv"); do
    if [ $(( $(ms) - t0 )) -ge $((RERUN_BUDGET_S * 1000)) ]; then
      printf '%s\tnot run: %s s spent\n' "$s" "$RERUN_BUDGET_S" >>"$out.why"
      continue
    fi
    timeout -k 5 "$SCENARIO_S" "$node22" "$suite" server --url "$url" --scenario "$s" \
      -o "$out/again-$s" >>"$out.log" 2>&1 </dev/null
    rc=$?
    [ "$rc" = 124 ] || [ "$rc" = 137 ] &&
      printf '%s\tno result within %s s (on its own too)\n' "$s" "$SCENARIO_S" >>"$out.why"
  done
  if grep -q $'\tnone\t' "$out.tsv"; then
    classify "$out" | awk -F'\t' -v OFS='\t' \
      'FILENAME == ARGV[1] { why[$1] = $2; next } $2 == "none" && ($1 in why) { $3 = why[$1] } { print }' \
      "$out.why" - >"$out.tsv"
  fi
  echo $(( $(ms) - t0 )) >"$out.ms"
}

# not_run LABEL WHY: every scenario failed without running
not_run() {
  local s
  for s in $scenarios; do printf '%s\tnone\t%s\n' "$s" "$2"; done >"$dir/$1.tsv"
  echo 0 >"$dir/$1.ms"
}

# start_everything: server-everything on a free loopback port, in the
# background (server_pid); url_file and url_expr say where it says its URL.
# It listens on $PORT on every interface and says only the port it was
# given; a preload makes that 127.0.0.1 and port 0, and says the port the
# kernel gave.
start_everything() {
  PORT=0 "$NODE" --input-type=module -e '
    import net from "node:net";
    import { pathToFileURL } from "node:url";
    const listen = net.Server.prototype.listen;
    net.Server.prototype.listen = function (port, ...rest) {
      if (typeof port !== "number" && typeof port !== "string") return listen.call(this, port, ...rest);
      this.once("listening", () =>
        console.error(`conformance: server-everything listening on http://127.0.0.1:${this.address().port}/mcp`));
      return listen.call(this, Number(port), "127.0.0.1", ...rest.filter((a) => typeof a === "function"));
    };
    await import(pathToFileURL(process.argv[1]).href);
  ' "$everything" >"$dir/everything.out" 2>"$dir/everything.err" </dev/null &
  server_pid=$!
  url_file=$dir/everything.err
  url_expr='s/^conformance: server-everything listening on \(http:[^ ]*\)$/\1/p'
}

# start_fixture: conformance_server.mjs on a free loopback port, in the
# background (server_pid); it writes the port to a file once it listens
start_fixture() {
  "$NODE" "$fixture" --port 0 --port-file "$dir/fixture.port" \
    >"$dir/fixture.out" 2>"$dir/fixture.err" </dev/null &
  server_pid=$!
  url_file=$dir/fixture.port
  url_expr='s/^\([0-9][0-9]*\)$/http:\/\/127.0.0.1:\1\/mcp/p'
}

# both NAME POLICY: the suite against server NAME (started by start_NAME)
# directly, then through idem with POLICY in front of it; results in
# $dir/NAME-direct.tsv and $dir/NAME-idem.tsv.  Both stopped after.
both() {
  local name=$1 policy=$2 t0 direct_url idem_url why
  t0=$(ms)
  "start_$name" # not in $(...): server_pid is this shell's, to stop
  if ! direct_url=$(wait_url "$server_pid" "$url_file" "$url_expr"); then
    if kill -0 "$server_pid" 2>/dev/null; then
      echo "conformance: $name did not listen within ${START_S} s:"
    else
      echo "conformance: $name exited before it listened:"
    fi
    tail -n 20 "$dir/$name.err" | sed 's/^/  /'
    not_run "$name-direct" "$name did not start"
    not_run "$name-idem" "not run: $name did not start"
    stop "$server_pid"; server_pid=""
    return
  fi
  echo "conformance: $name at $direct_url (up in $(secs $(( $(ms) - t0 ))))"
  half "$name-direct" "$direct_url"
  echo "conformance: $name, direct run: $(secs "$(cat "$dir/$name-direct.ms")")"

  # idem in front of the same server; it says its URL on stderr.  Its stdin
  # is /dev/null: with --listen, the clients are on HTTP, not on stdin.
  t0=$(ms)
  "$idem" mcp --policy "$policy" --log "$dir/$name.db" \
    --listen 127.0.0.1:0 -- "$direct_url" >"$dir/idem-$name.out" 2>"$dir/idem-$name.err" </dev/null &
  idem_pid=$!
  idem_url=$(wait_url "$idem_pid" "$dir/idem-$name.err" \
    's/.*idem mcp: listening on \(http:\/\/[^ ]*\).*/\1/p')
  if [ -z "$idem_url" ]; then
    if kill -0 "$idem_pid" 2>/dev/null; then
      why="idem did not say it listens within ${START_S} s"
    else
      wait "$idem_pid"; why="idem exited (status $?) before it listened"; idem_pid=""
    fi
    echo "conformance: $name: $why; its stderr begins:"
    head -n 8 "$dir/idem-$name.err" | sed 's/^/  /'
    not_run "$name-idem" "$why"
  else
    echo "conformance: idem in front of $name at $idem_url (up in $(secs $(( $(ms) - t0 ))))"
    half "$name-idem" "$idem_url"
    echo "conformance: $name, through-idem run: $(secs "$(cat "$dir/$name-idem.ms")")"
  fi
  stop "$idem_pid"; idem_pid=""
  stop "$server_pid"; server_pid=""
}

t_all=$(ms)
both everything "$here/everything_policy.json"
both fixture "$here/conformance_policy.json"

# --- the four lists -----------------------------------------------------------
word() { case $1 in pass) echo pass ;; na) echo n/a ;; none) echo none ;; *) echo FAIL ;; esac; }
verdict() { awk -F'\t' -v s="$2" '$1 == s { print $2 }' "$dir/$1.tsv"; }
reason() { awk -F'\t' -v s="$2" '$1 == s { print $3 }' "$dir/$1.tsv"; }
echo
echo "conformance: $n server scenarios of @modelcontextprotocol/conformance" \
  "$("$node22" "$suite" --version 2>/dev/null) (protocol versions: ${protocols% })"
printf '%-32s %-19s %s\n' "" " server-everything" " conformance_server.mjs"
printf '%-32s %-6s %-12s %-6s %s\n' scenario direct idem direct idem
status=0
regress=0
notes=""
declare -A count
for s in $scenarios; do
  line=$(printf '%-32s' "$s")
  for name in everything fixture; do
    dv=$(verdict "$name-direct" "$s"); iv=$(verdict "$name-idem" "$s")
    [ "$dv" = pass ] && count[$name-direct]=$(( ${count[$name-direct]:-0} + 1 ))
    [ "$iv" = pass ] && count[$name-idem]=$(( ${count[$name-idem]:-0} + 1 ))
    if [ "$name" = everything ]; then
      line+=$(printf ' %-6s %-12s' "$(word "$dv")" "$(word "$iv")")
    else
      line+=$(printf ' %-6s %s' "$(word "$dv")" "$(word "$iv")")
    fi
    if [ "$dv" = pass ] && [ "$iv" = na ]; then
      notes+="$name: $s passes directly, through idem $(reason "$name-idem" "$s")"$'\n'
    elif [ "$dv" = pass ] && [ "$iv" != pass ]; then
      regress=$((regress + 1))
      notes+="$name: $s passes directly but not through idem: $(reason "$name-idem" "$s")"$'\n'
    elif [ "$name" = fixture ] && [ "$dv" != pass ]; then
      status=1
      notes+="$name: $s does not pass directly: $(reason "$name-direct" "$s")"$'\n'
    fi
  done
  echo "$line"
done
echo
echo "conformance: server-everything: directly ${count[everything-direct]:-0}/$n pass" \
  "($(secs "$(cat "$dir/everything-direct.ms")")), through idem ${count[everything-idem]:-0}/$n" \
  "($(secs "$(cat "$dir/everything-idem.ms")"))"
echo "conformance: conformance_server.mjs: directly ${count[fixture-direct]:-0}/$n pass" \
  "($(secs "$(cat "$dir/fixture-direct.ms")")), through idem ${count[fixture-idem]:-0}/$n" \
  "($(secs "$(cat "$dir/fixture-idem.ms")"))"
echo "conformance: all in $(secs $(( $(ms) - t_all )))"
if [ -n "$notes" ]; then
  echo
  printf '%s' "$notes" | while IFS= read -r l; do printf 'conformance: %.300s\n' "$l"; done
fi
# what idem said on stderr beyond its start (each distinct line once, with
# how often): not a failure, but worth reading
for name in everything fixture; do
  said=$(grep -v -e '^idem mcp: listening on ' -e '^idem: no --session or IDEM_SESSION' \
           "$dir/idem-$name.err" 2>/dev/null | sort | uniq -c | sort -rn | head -n 8)
  if [ -n "$said" ]; then
    echo
    echo "conformance: idem in front of $name said on stderr:"
    printf '%s\n' "$said" | cut -c1-200 | sed 's/^/  /'
  fi
done
# why server-everything fails directly: the fixtures it lacks (one line each)
if [ "${count[everything-direct]:-0}" -lt "$n" ]; then
  echo
  echo "conformance: server-everything lacks what these scenarios check (directly):"
  awk -F'\t' '$2 != "pass" { printf "  %-30s %.110s\n", $1, $3 }' "$dir/everything-direct.tsv"
fi
echo

if [ "${count[everything-direct]:-0}" -lt "$MIN_DIRECT" ]; then
  echo "conformance: FAIL: only ${count[everything-direct]:-0} scenarios pass directly against" \
    "server-everything (at least $MIN_DIRECT expected): the suite or the server is broken"
  status=1
fi
if [ "${count[fixture-direct]:-0}" -lt "$n" ]; then
  echo "conformance: FAIL: $(( n - ${count[fixture-direct]:-0} )) scenarios do not pass directly" \
    "against conformance_server.mjs: the fixture (or the suite) is broken"
  status=1
fi
# what a sanitizer build or a crash would have said (leaks: at idem's exit)
for name in everything fixture; do
  if grep -Eq 'Sanitizer|runtime error:|Segmentation|Assertion' "$dir/idem-$name.err" 2>/dev/null; then
    echo "conformance: FAIL: idem's stderr (in front of $name):"
    grep -E -A 12 'Sanitizer|runtime error:|Segmentation|Assertion' "$dir/idem-$name.err" | head -n 40 | sed 's/^/  /'
    status=1
  fi
done
if [ "$regress" -gt 0 ]; then
  echo "conformance: FAIL: $regress scenarios pass directly but fail through idem"
  status=1
fi
[ "$status" = 0 ] && { echo "conformance: ok"; keep=${CONFORMANCE_KEEP:-0}; }
exit "$status"

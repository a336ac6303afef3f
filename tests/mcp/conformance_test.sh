#!/bin/bash
# The official MCP conformance suite (@modelcontextprotocol/conformance, its
# server scenarios) against @modelcontextprotocol/server-everything over
# Streamable HTTP: first directly, then through `idem mcp --listen` standing
# in front of it.  Prints one line per scenario (direct, through idem) and
# fails when a scenario that passes directly fails through idem, or when
# fewer than MIN_DIRECT pass directly (a suite that cannot run must not look
# green).
#
#   tests/mcp/conformance_test.sh PATH/TO/idem
#
# The suite needs Node >= 22: it runs on the npm package node@22
# (node_modules/node/bin/node here), and only the suite does; the server runs
# on $NODE (default: node on the PATH).  All in tests/mcp/package-lock.json:
# `scripts/install-deps.sh --peers` installs it.
#
# Every wait is bounded; both servers are stopped on any exit.  The files
# (the suite's checks.json per scenario, the servers' output) are kept in a
# temporary directory when the test fails, and its path printed.
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

MIN_DIRECT=5      # scenarios that must pass directly
START_S=15        # a server to say it listens
SUITE_S=40        # the whole suite in one run
SCENARIO_S=15     # one scenario run again on its own (when the suite run left it without a result)
RERUN_BUDGET_S=60 # no scenario is run again this long after a half began

for f in "$node22" "$suite" "$everything"; do
  [ -e "$f" ] || { echo "conformance: $f is missing; run scripts/install-deps.sh --peers" >&2; exit 1; }
done
command -v "$NODE" >/dev/null || { echo "conformance: no $NODE" >&2; exit 1; }

dir=$(mktemp -d "${TMPDIR:-/tmp}/idem-conformance.XXXXXX") || exit 1
server_pid=""
idem_pid=""
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

# classify OUT: for each scenario a line "NAME<TAB>pass|fail|none<TAB>WHY"
# from the newest OUT/**/server-NAME-<time>/checks.json: pass when a check
# succeeded and none failed (the suite's own verdict), none when no file
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
          if (failed.length) { verdict = "fail"; why = failed.map((c) => `${c.name}: ${c.errorMessage ?? c.description}`).join("; "); }
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

# --- directly: server-everything on a free loopback port -------------------
# It listens on $PORT on every interface and says only the port it was given;
# a preload makes that 127.0.0.1 and port 0, and says the port the kernel gave.
t0=$(ms)
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
direct_url=$(wait_url "$server_pid" "$dir/everything.err" \
  's/^conformance: server-everything listening on \(http:[^ ]*\)$/\1/p')
if [ -z "$direct_url" ]; then
  echo "conformance: server-everything did not listen within ${START_S} s:"
  tail -n 20 "$dir/everything.err"
  not_run direct "server-everything did not start"
else
  echo "conformance: server-everything at $direct_url (up in $(secs $(( $(ms) - t0 ))))"
  half direct "$direct_url"
  echo "conformance: direct run: $(secs "$(cat "$dir/direct.ms")")"
fi

# --- through idem -----------------------------------------------------------
# idem in front of the same server; it says its URL on stderr.  Its stdin is
# /dev/null: with --listen, the clients are on HTTP, not on stdin.
if [ -n "$direct_url" ]; then
  t0=$(ms)
  "$idem" mcp --policy "$here/everything_policy.json" --log "$dir/log.db" \
    --listen 127.0.0.1:0 -- "$direct_url" >"$dir/idem.out" 2>"$dir/idem.err" </dev/null &
  idem_pid=$!
  idem_url=$(wait_url "$idem_pid" "$dir/idem.err" \
    's/.*idem mcp: listening on \(http:\/\/[^ ]*\).*/\1/p')
  if [ -z "$idem_url" ]; then
    if kill -0 "$idem_pid" 2>/dev/null; then
      why="idem did not say it listens within ${START_S} s"
    else
      wait "$idem_pid"; why="idem exited (status $?) before it listened"; idem_pid=""
    fi
    echo "conformance: $why; its stderr begins:"
    head -n 8 "$dir/idem.err" | sed 's/^/  /'
    not_run idem "$why"
  else
    echo "conformance: idem at $idem_url (up in $(secs $(( $(ms) - t0 ))))"
    half idem "$idem_url"
    echo "conformance: through-idem run: $(secs "$(cat "$dir/idem.ms")")"
  fi
  stop "$idem_pid"; idem_pid=""
else
  not_run idem "not run: no direct server"
fi

# --- both lists -------------------------------------------------------------
word() { case $1 in pass) echo pass ;; *) echo FAIL ;; esac; }
echo
echo "conformance: $n server scenarios of @modelcontextprotocol/conformance" \
  "$("$node22" "$suite" --version 2>/dev/null) (protocol versions: ${protocols% })"
printf '%-32s %-6s %-6s %s\n' scenario direct idem ""
regress=0
direct_pass=0
idem_pass=0
while IFS=$'\t' read -r s dv dwhy; do
  IFS=$'\t' read -r _ iv iwhy < <(grep "^$s"$'\t' "$dir/idem.tsv")
  note=""
  [ "$dv" = pass ] && direct_pass=$((direct_pass + 1))
  [ "$iv" = pass ] && idem_pass=$((idem_pass + 1))
  if [ "$dv" = pass ] && [ "$iv" != pass ]; then
    regress=$((regress + 1)); note="<- through idem: $iwhy"
  elif [ "$dv" != pass ]; then
    note="(direct: $dwhy)"
  fi
  printf '%-32s %-6s %-6s %.150s\n' "$s" "$(word "$dv")" "$(word "$iv")" "$note"
done <"$dir/direct.tsv"
echo
echo "conformance: directly $direct_pass/$n pass ($(secs "$(cat "$dir/direct.ms")"));" \
  "through idem $idem_pass/$n ($(secs "$(cat "$dir/idem.ms")"))"

status=0
if [ "$direct_pass" -lt "$MIN_DIRECT" ]; then
  echo "conformance: FAIL: only $direct_pass scenarios pass directly (at least $MIN_DIRECT expected): the suite or the server is broken"
  status=1
fi
# what a sanitizer build or a crash would have said (leaks: at idem's exit)
if grep -Eq 'Sanitizer|runtime error:|Segmentation|Assertion' "$dir/idem.err" 2>/dev/null; then
  echo "conformance: FAIL: idem's stderr:"
  grep -E -A 12 'Sanitizer|runtime error:|Segmentation|Assertion' "$dir/idem.err" | head -n 40 | sed 's/^/  /'
  status=1
fi
if [ "$regress" -gt 0 ]; then
  echo "conformance: FAIL: $regress scenarios pass directly but fail through idem"
  status=1
fi
[ "$status" = 0 ] && { echo "conformance: ok"; keep=0; }
exit "$status"

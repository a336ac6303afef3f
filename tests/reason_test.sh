#!/bin/bash
# The model is told the true reason (issue 20, item 6): an outcome_unknown
# answer says what actually happened - a command whose output passed the
# limit and died of SIGPIPE, an HTTP 503, a deadline - never a blanket "did
# not answer in time".  (The MCP gateway's cases: tests/mcp/wall_test.mjs.)
#
#   bash tests/reason_test.sh IDEM PAYSIM
set -u
IDEM=${1:?usage: reason_test.sh IDEM PAYSIM}
PAYSIM=${2:?usage: reason_test.sh IDEM PAYSIM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-reason-XXXXXX") || exit 1
SIM=
cleanup() {
  [ -n "$SIM" ] && kill "$SIM" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/assert.sh"
LOG=sqlite:$T/log.db
msg() { printf '%s' "$1" | sed -n 's/.*"message":"\([^"]*\)".*/\1/p'; }

cat >"$T/policy.json" <<'P'
{"tools": {
  "big": {"class": "guarded", "timeout_ms": 20000, "retries": 0},
  "slow": {"class": "guarded", "timeout_ms": 300, "retries": 0, "settle_ms": 0},
  "refund": {"class": "guarded", "timeout_ms": 2000, "retries": 0,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"}}
}}
P

# -- exec: the output passes the limit, the pipe closes, SIGPIPE kills it
out=$("$IDEM" exec --policy "$T/policy.json" --log "$LOG" --session s --call big1 \
  --tool big --args '{}' -- sh -c 'yes xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx | head -c 20000000; echo done >"$0"' "$T/after")
code=$?
expect "big output: unknown" 75 "$code"
has "big output: the words" "$(msg "$out")" "output passed the limit of 16777216 bytes"
hasnt "big output: no blanket 'in time'" "$(msg "$out")" "in time"

# -- exec: the deadline, in its own words
out=$("$IDEM" exec --policy "$T/policy.json" --log "$LOG" --session s --call slow1 \
  --tool slow --args '{}' -- sh -c 'sleep 2')
expect "deadline: unknown" 75 "$?"
has "deadline: the words" "$(msg "$out")" "no answer within 300 ms"

# -- HTTP: a 503 is not a timeout
rm -f "$T/port"
"$PAYSIM" --ledger "$T/ledger" --port 0 --port-file "$T/port" 2>>"$T/paysim.log" &
SIM=$!
for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
export PAYSIM_URL=http://127.0.0.1:$(cat "$T/port")
curl -s -o /dev/null -d '{"mode":"fail","count":1}' "$PAYSIM_URL/_mode"
out=$("$IDEM" call --policy "$T/policy.json" --log "$LOG" --session s --call h1 \
  --tool refund --args '{"order_id":"r1","amount_cents":5}')
expect "HTTP 503: unknown" 75 "$?"
has "HTTP 503: the words" "$(msg "$out")" "HTTP 503 (unknown)"
hasnt "HTTP 503: no blanket 'in time'" "$(msg "$out")" "in time"

summary

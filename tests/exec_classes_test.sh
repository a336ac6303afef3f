#!/bin/bash
# `idem exec` of a tool the policy classes read_only or idempotent (SPEC
# §6.1): nothing is recorded, and the command runs - the runner needs no
# hand-over of a record that does not exist - and its output is the result.
#   tests/exec_classes_test.sh IDEM_BINARY
set -u
IDEM=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/assert.sh"
LOG="sqlite:$T/log.db"
cat > "$T/policy.json" <<'P'
{"tools": {"lookup": {"class": "read_only"},
           "set_name": {"class": "idempotent", "retries": 2, "backoff_ms": 10}}}
P
runs() { local n; n=$(grep -c . "$T/runs" 2>/dev/null); echo "${n:-0}"; }
ex() { # ex CALL TOOL COMMAND...: envelope in $out, exit code in $code
  local call=$1 tool=$2
  shift 2
  out=$("$IDEM" exec --policy "$T/policy.json" --log "$LOG" --session s \
    --call "$call" --tool "$tool" --args '{"order_id":"o1"}' -- "$@" 2>"$T/err")
  code=$?
}
CMD='cat >> "$RUNS"; echo >> "$RUNS"; echo "{\"tool\":\"$IDEM_TOOL\"}"'
export RUNS=$T/runs

for tool in lookup set_name; do
  : > "$T/runs"
  ex c_$tool $tool sh -c "$CMD"
  expect "$tool: exit" 0 "$code"
  has "$tool: succeeded" "$out" '"status":"succeeded"'
  has "$tool: its output is the result" "$out" "\"result\":{\"tool\":\"$tool\"}"
  hasnt "$tool: no takeover" "$(cat "$T/err")" "taken over"
  expect "$tool: the command ran once" 1 "$(runs)"
  has "$tool: it got the arguments" "$(cat "$T/runs")" '{"order_id":"o1"}'
  # a repeat runs it again: nothing was recorded to replay
  ex c_$tool $tool sh -c "$CMD"
  has "$tool: again" "$out" '"replayed":false'
  expect "$tool: the repeat ran it again" 2 "$(runs)"
done
# an idempotent tool's failures are retried (retries 2: three runs), and a
# read_only one's answered as they are
: > "$T/runs"
ex f1 set_name sh -c 'echo x >> "$RUNS"; exit 3'
expect "idempotent failure: exit" 1 "$code"
has "idempotent failure: the exit" "$out" 'exited with status 3'
expect "idempotent failure: three runs" 3 "$(runs)"
: > "$T/runs"
ex f2 lookup sh -c 'echo x >> "$RUNS"; exit 101'
has "read_only rejected" "$out" '"status":"failed"'
expect "read_only rejected: one run" 1 "$(runs)"
# nothing of it is in the log
expect "nothing recorded" "" "$("$IDEM" ls --log "$LOG" --json)"
summary

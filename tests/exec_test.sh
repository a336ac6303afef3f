#!/bin/bash
# The refund story through `idem exec`, as processes: real SQLite files,
# real child processes, a ledger that counts every application.
#   tests/exec_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
STATUS="$HERE/tools/refund_status.sh"
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER=$T/ledger
. "$(dirname "$0")/assert.sh"
applied() { local n; n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
ARGS='{"order_id":"ord_1","amount_cents":6000}'
run() { # run LOG CALL [extra args...]: envelope in $out, exit code in $code
  local log=$1 call=$2
  shift 2
  out=$("$IDEM" exec --log "sqlite:$T/$log.db" --session sess_1 --call "$call" \
    --tool refund_payment --args "$ARGS" "$@" -- "$TOOL")
  code=$?
}

# first call, replay, reformatted arguments, conflict, a second refund
: > "$LEDGER"
run a toolu_7
expect "first call exit" 0 "$code"
has "first call" "$out" '"status":"succeeded"'
has "first call key" "$out" '"idempotency_key":"sess_1:toolu_7:a280fb850f483293"'
has "first call result" "$out" '"refund_id":"re_1"'
expect "one refund" 1 "$(applied)"
run a toolu_7
expect "replay exit" 0 "$code"
has "replay" "$out" '"replayed":true'
expect "still one refund" 1 "$(applied)"
ARGS='{ "amount_cents": 6000.0, "order_id": "ord_1" }' run a toolu_7
has "reformatted" "$out" '"replayed":true'
out=$("$IDEM" exec --log "sqlite:$T/a.db" --session sess_1 --call toolu_7 \
  --tool refund_payment --args '{"order_id":"ord_1","amount_cents":9000}' -- "$TOOL")
expect "conflict exit" 65 "$?"
has "conflict" "$out" '"status":"conflict"'
# a later model turn: a new decision (the harness names its turns)
IDEM_TURN=turn_2 run a toolu_9
has "second refund" "$out" '"status":"succeeded"'
expect "two refunds" 2 "$(applied)"
# the key and the arguments reach the command
has "args on stdin" "$out" '"args":{"amount_cents":6000,"order_id":"ord_1"}'

# bad arguments: nothing recorded, nothing run
: > "$LEDGER"
out=$("$IDEM" exec --log "sqlite:$T/b.db" --session s --call c1 --tool refund_payment \
  --args '{"a":1,"a":2}' -- "$TOOL")
expect "bad args exit" 65 "$?"
has "bad args" "$out" '"status":"invalid_arguments"'
expect "bad args ran nothing" 0 "$(applied)"
"$IDEM" show --log "sqlite:$T/b.db" s c1 >/dev/null 2>&1
expect "bad args recorded nothing" 1 "$?"

# refused: the policy does not name the tool
cat > "$T/policy.json" <<'P'
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 1000, "retries": 1,
  "backoff_ms": 10, "status": {"command": "exit 100"}}}}
P
out=$("$IDEM" exec --policy "$T/policy.json" --log "sqlite:$T/c.db" --session s --call c1 \
  --tool drop_table --args '{}' -- "$TOOL")
expect "refused exit" 77 "$?"
has "refused" "$out" '"status":"refused"'
expect "refused ran nothing" 0 "$(applied)"

# rejected and not applied
REFUND_MODE=reject run d r1
expect "rejected exit" 1 "$code"
has "rejected" "$out" '"status":"failed"'
REFUND_MODE=fail run d f1 --policy "$T/policy.json"
expect "not applied exit" 1 "$code"
has "not applied attempts" "$out" '"attempts":2'

# a timeout reconciled by the status check
: > "$LEDGER"
REFUND_MODE=stall STALL=2 run e t1 --timeout 300 --status "$STATUS"
expect "reconciled exit" 0 "$code"
has "reconciled" "$out" '"status":"succeeded"'
has "reconciled result" "$out" '"applied":true'
expect "reconciled: one refund" 1 "$(applied)"

# a status check that does not read its input (the arguments, here larger
# than a pipe holds): idem must not die of SIGPIPE while it writes them
: > "$LEDGER"
big=$(head -c 300000 /dev/zero | tr '\0' x)
printf '{"order_id":"ord_big","note":"%s"}' "$big" >"$T/big.json"
out=$(REFUND_MODE=crash "$IDEM" exec --log "sqlite:$T/big.db" --session sess_1 \
  --call big_1 --tool refund_payment --args - --status "$STATUS" -- "$TOOL" \
  <"$T/big.json")
code=$?
expect "unread status input: exit" 0 "$code"
has "unread status input: reconciled" "$out" '"status":"succeeded"'
expect "unread status input: one refund" 1 "$(applied)"

# a timeout without a status check: outcome_unknown, the fence, the late
# result, already_applied, then a real repeat
: > "$LEDGER"
# (the tool stalls 3 s: the re-issue below comes before its late result even
# on a loaded machine)
REFUND_MODE=stall STALL=3 run f u1 --timeout 200
expect "unknown exit" 75 "$code"
has "unknown" "$out" '"status":"outcome_unknown"'
has "unknown says not to call again" "$out" 'Do not call refund_payment again'
run f u2 --timeout 200
expect "fenced exit" 75 "$code"
has "fenced" "$out" '"duplicate_of":"u1"'
expect "fenced: one refund" 1 "$(applied)"
# the late result arrives and the runner records it
for _ in $(seq 300); do
  "$IDEM" show --log "sqlite:$T/f.db" --json sess_1 u1 > "$T/show.json"
  grep -q '"state":"succeeded"' "$T/show.json" && break
  sleep 0.1
done
has "late recorded" "$(cat "$T/show.json")" '"state":"succeeded"'
has "late resolution" "$(cat "$T/show.json")" '"resolution":"late"'
run f u3 --timeout 200
expect "already applied exit" 0 "$code"
has "already applied" "$out" '"status":"already_applied"'
has "already applied names u1" "$out" '"duplicate_of":"u1"'
IDEM_TURN=turn_2 run f u4 --timeout 2000 # told: the model's next turn
has "a real repeat" "$out" '"status":"succeeded"'
expect "two refunds after a real repeat" 2 "$(applied)"

# racing processes on one call: one application (the losers wait for the
# winner: wait_ms is long enough for a loaded machine)
cat > "$T/wait.json" <<'P'
{"tools": {"refund_payment": {"class": "guarded", "wait_ms": 60000}}}
P
: > "$LEDGER"
for i in 1 2 3 4 5 6; do
  REFUND_MODE=stall STALL=0.5 "$IDEM" exec --policy "$T/wait.json" --log "sqlite:$T/g.db" \
    --session s --call same --tool refund_payment --args "$ARGS" -- "$TOOL" > "$T/race.$i" &
done
wait
expect "racing processes: one refund" 1 "$(applied)"
expect "racing processes: all succeeded" 6 "$(grep -l '"status":"succeeded"' "$T"/race.* | wc -l | tr -d ' ')"

# parallel identical calls with different call ids: one application
: > "$LEDGER"
for i in 1 2 3 4 5 6; do
  REFUND_MODE=stall STALL=0.5 "$IDEM" exec --policy "$T/wait.json" --log "sqlite:$T/h.db" \
    --session s --call "p$i" --tool refund_payment --args "$ARGS" -- "$TOOL" > "$T/par.$i" &
done
wait
expect "parallel calls: one refund" 1 "$(applied)"
expect "parallel calls: one succeeded" 1 "$(grep -l '"status":"succeeded"' "$T"/par.* | wc -l | tr -d ' ')"
expect "parallel calls: five already applied" 5 "$(grep -l '"status":"already_applied"' "$T"/par.* | wc -l | tr -d ' ')"
[ "$(grep -l '"status":"succeeded"' "$T"/par.* | wc -l | tr -d ' ')" = 1 ] || cat "$T"/par.* >&2

# a log that cannot be used: a clear error and no downstream call
: > "$LEDGER"
head -c 20000 /dev/urandom > "$T/corrupt.db"
err=$("$IDEM" exec --log "sqlite:$T/corrupt.db" --session s --call c --tool refund_payment \
  --args "$ARGS" -- "$TOOL" 2>&1 >/dev/null)
expect "corrupt log exit" 1 "$?"
has "corrupt log message" "$err" "idem: "
has "corrupt log: not run" "$err" "not run"
expect "corrupt log: no refund" 0 "$(applied)"
mkdir -p "$T/dir.db"
"$IDEM" exec --log "sqlite:$T/dir.db" --session s --call c --tool refund_payment \
  --args "$ARGS" -- "$TOOL" >/dev/null 2>&1
expect "directory as log exit" 1 "$?"
expect "directory as log: no refund" 0 "$(applied)"

# a log locked by another process past the busy timeout: a clear error and
# no downstream call
: > "$LEDGER"
"$IDEM" exec --log "sqlite:$T/lock.db" --session s --call warm --tool refund_payment \
  --args '{"order_id":"warm"}' -- "$TOOL" > /dev/null
: > "$LEDGER"
python3 -c 'import sqlite3,sys,time
c=sqlite3.connect(sys.argv[1],isolation_level=None,timeout=1)
c.execute("BEGIN EXCLUSIVE"); print("locked",flush=True); time.sleep(9)' "$T/lock.db" > "$T/locker.out" &
locker=$!
for _ in $(seq 50); do grep -q locked "$T/locker.out" 2>/dev/null && break; sleep 0.1; done
err=$("$IDEM" exec --log "sqlite:$T/lock.db" --session s --call c --tool refund_payment \
  --args "$ARGS" -- "$TOOL" 2>&1 >/dev/null)
expect "locked log exit" 1 "$?"
has "locked log message" "$err" "locked"
has "locked log: not run" "$err" "not run"
expect "locked log: no refund" 0 "$(applied)"
kill "$locker" 2>/dev/null
wait "$locker" 2>/dev/null

# output that is not text (a NUL, a byte 0xFF: not UTF-8) is recorded
# exactly, as {"io.idem/base64": ...}: the first answer and the replay
# carry the bytes the command wrote, not U+FFFD in their place; text and
# JSON are recorded as they always were
printf 'a\0b\377c\n' > "$T/bytes"
bytes_of() { # the bytes of the envelope's result on stdin
  python3 -c 'import base64, json, sys
r = json.load(sys.stdin)["result"]
sys.stdout.buffer.write(base64.b64decode(r["io.idem/base64"]))'
}
dump() { # dump CALL ARGS COMMAND...: the envelope in $out
  local call=$1 args=$2
  shift 2
  out=$("$IDEM" exec --log "sqlite:$T/bytes.db" --session s --call "$call" \
    --tool dump --args "$args" -- "$@")
}
dump b1 '{"f":"bytes"}' cat "$T/bytes"
has "bytes: recorded as base64" "$out" '"result":{"io.idem/base64":"YQBi/2MK"}'
printf '%s' "$out" | bytes_of > "$T/first" 2>/dev/null
cmp -s "$T/bytes" "$T/first" && ok || bad "bytes: the first answer's are not the command's"
dump b1 '{"f":"bytes"}' cat "$T/bytes"
has "bytes: replayed" "$out" '"replayed":true'
printf '%s' "$out" | bytes_of > "$T/replay" 2>/dev/null
cmp -s "$T/bytes" "$T/replay" && ok || bad "bytes: the replay's are not the command's"
cmp -s "$T/first" "$T/replay" && ok || bad "bytes: the replay's differ from the first answer's"
has "bytes: the record" "$("$IDEM" show --json --log "sqlite:$T/bytes.db" s b1)" \
  '"result":{"io.idem/base64":"YQBi/2MK"}'
dump t1 '{"f":"text"}' printf 'h\303\251llo\n'
has "text: a string, as before" "$out" '"result":"h'$'\303\251''llo"'
dump t2 '{"f":"json"}' printf '{"b": 2, "a": [1.0]}'
has "JSON: canonical, as before" "$out" '"result":{"a":[1],"b":2}'

# ids that are not UTF-8: a clear error, nothing run or recorded
: > "$LEDGER"
for which in session call turn; do
  case $which in
    session) set -- --session "$(printf 'a\377b')" --call u1 ;;
    call) set -- --session s --call "$(printf 'a\377b')" ;;
    turn) set -- --session s --call u2 --turn "$(printf 'a\377b')" ;;
  esac
  out=$("$IDEM" exec --log "sqlite:$T/u.db" "$@" --tool refund_payment \
    --args "$ARGS" -- "$TOOL" 2>"$T/err")
  expect "$which id not UTF-8: exit" 1 "$?"
  has "$which id not UTF-8: says so" "$(cat "$T/err")" "id is not valid UTF-8; nothing was run or recorded"
done
expect "ids not UTF-8: nothing ran" 0 "$(applied)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

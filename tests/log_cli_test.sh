#!/bin/bash
# Looking after the attempt log from the shell: idem ls, show, recover, gc,
# stats - on a real log made by `idem exec`.
#   tests/log_cli_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
STATUS=$HERE/tools/refund_status.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER=$T/ledger
export IDEM_LOG=sqlite:$T/log.db # the environment names the log
. "$(dirname "$0")/assert.sh"
: > "$LEDGER"
cat > "$T/policy.json" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 300, "retries": 0,
  "retention_s": 1, "status": {"command": "$STATUS"}}}}
P

# two settled calls and one left in doubt (a timeout with no status check;
# the tool stalls 10 s so that recover, below, comes before its late result
# even on a loaded machine)
"$IDEM" exec --session s1 --call c1 --tool refund_payment --args '{"order_id":"a"}' -- "$TOOL" > /dev/null
"$IDEM" exec --session s1 --call c2 --tool refund_payment --args '{"order_id":"b"}' -- "$TOOL" > /dev/null
out=$(REFUND_MODE=stall STALL=10 "$IDEM" exec --session s2 --call c3 --tool refund_payment \
  --args '{"order_id":"c"}' --timeout 200 -- "$TOOL")
expect "in doubt" 75 "$?"

# ls: a table, filters, JSON lines
out=$("$IDEM" ls)
expect "ls exit" 0 "$?"
has "ls header" "$out" "SESSION"
expect "ls rows" 4 "$(printf '%s\n' "$out" | wc -l | tr -d ' ')"
out=$("$IDEM" ls --json --session s1)
expect "ls --session" 2 "$(printf '%s\n' "$out" | grep -c '"session":"s1"')"
out=$("$IDEM" ls --json --state in_doubt)
has "ls --state" "$out" '"call_id":"c3"'
expect "ls --state count" 1 "$(printf '%s\n' "$out" | grep -c .)"
printf '%s\n' "$out" | python3 -c 'import json,sys; [json.loads(l) for l in sys.stdin]' && ok || bad "ls --json is not JSON lines"
"$IDEM" ls --state nonsense > /dev/null 2>&1
expect "ls bad state" 2 "$?"

# show
out=$("$IDEM" show s1 c1)
has "show" "$out" "succeeded"
has "show key" "$out" "s1:c1:"
"$IDEM" show s1 nope > /dev/null 2>&1
expect "show missing" 1 "$?"
out=$("$IDEM" show --json s2 c3)
has "show --json" "$out" '"state":"in_doubt"'

# the ids are the client's: ls and show write their control bytes, C1 and
# bidi controls escaped (\xNN, \uNNNN, a backslash as \\), never raw - an
# ESC [ in an id would drive the terminal, a CR hide what came before it
# (a log of its own: the counts below stay as they are)
raw_controls() { # the lines of stdin holding a control other than \n
  python3 -c 'import sys
for l in sys.stdin.buffer.read().decode("utf-8", "replace").split("\n"):
    if any(ord(c) < 32 or 0x7f <= ord(c) <= 0x9f or c == "\u202e" for c in l):
        print(repr(l))'
}
NS=$'s\e[31mred\r\n\a'
NC=$'c\\1\xc2\x9b2J\xe2\x80\xae\x7fé'
"$IDEM" exec --log "sqlite:$T/ids.db" --session "$NS" --call "$NC" --tool t \
  -- printf 'x' > /dev/null
expect "escaped ids: exec" 0 "$?"
out=$("$IDEM" ls --log "sqlite:$T/ids.db")
expect "ls: no raw control" "" "$(printf '%s\n' "$out" | raw_controls)"
expect "ls: one row" 2 "$(printf '%s\n' "$out" | wc -l | tr -d ' ')"
has "ls: session escaped" "$out" 's\x1b[31mred\x0d\x0a '
has "ls: call escaped, cut to its column" "$out" 'c\\1\u009b2J\u202e   t '
out=$("$IDEM" show --log "sqlite:$T/ids.db" "$NS" "$NC")
expect "show: no raw control" "" "$(printf '%s\n' "$out" | raw_controls)"
expect "show: 23 lines (the turn among them)" 23 "$(printf '%s\n' "$out" | wc -l | tr -d ' ')"
has "show: session escaped" "$out" 'session       s\x1b[31mred\x0d\x0a\x07
call          c\\1\u009b2J\u202e\x7fé
'
has "show: JSON stays JSON" "$out" 'result        "x"'
out=$("$IDEM" show --json --log "sqlite:$T/ids.db" "$NS" "$NC")
has "show --json: JSON escapes" "$out" '"session":"s\u001b[31mred\r\n\u0007"'

# a log of ours that grants other users access (0644: made by hand, copied,
# another tool's umask) loses those bits when it is opened, and so do its
# -wal and -shm (SQLite gives the ones it creates the log's mode); the
# group's bits stay.  A reader (Python's sqlite3) holds the -wal and -shm
# open meanwhile, so that they exist before the call, world-readable too.
DB=$T/open.db
"$IDEM" exec --log "sqlite:$DB" --session m --call m1 --tool t -- true > /dev/null
python3 -c 'import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1])
c.execute("SELECT count(*) FROM attempts").fetchall()
open(sys.argv[1] + ".held", "w").close()
time.sleep(30)' "$DB" &
HOLD=$!
for _ in $(seq 100); do [ -e "$DB.held" ] && break; sleep 0.05; done
chmod 0644 "$DB" "$DB-wal" "$DB-shm"
modes() { stat -c %a "$DB" "$DB-wal" "$DB-shm" | tr '\n' ' '; }
out=$("$IDEM" exec --log "sqlite:$DB" --session m --call m2 --tool t \
  --args '{"n":2}' -- sh -c 'stat -c %a "$0" "$0-wal" "$0-shm" | tr "\n" " "' \
  "$DB")
expect "mode: exec" 0 "$?"
has "mode: closed to others during the call" "$out" '"result":"640 640 640 "'
expect "mode: after the call" "640 640 640 " "$(modes)"
kill "$HOLD"
wait "$HOLD" 2>/dev/null
chmod 0606 "$DB"
"$IDEM" ls --log "sqlite:$DB" > /dev/null
expect "mode: ls closes it too" 600 "$(stat -c %a "$DB")"

# stats
out=$("$IDEM" stats --json)
has "stats succeeded" "$out" '"succeeded":2'
has "stats in_doubt" "$out" '"in_doubt":1'
has "stats total" "$out" '"total":3'

# recover: the in-doubt refund was applied (the provider is still stalling
# after applying it): the status check settles it, nothing runs again
out=$("$IDEM" recover --status "$STATUS" --json)
expect "recover exit" 0 "$?"
has "recover counts" "$out" '"applied":1'
out=$("$IDEM" show --json s2 c3)
has "recovered" "$out" '"state":"succeeded"'
has "recovered by reconciliation" "$out" '"resolution":"reconciled"'
expect "recover ran no tool" 3 "$(grep -c . "$LEDGER")"
# a replay of the recovered call answers from the log
out=$("$IDEM" exec --session s2 --call c3 --tool refund_payment --args '{"order_id":"c"}' -- "$TOOL")
has "replay after recover" "$out" '"replayed":true'
# recover with nothing in doubt
out=$("$IDEM" recover)
has "recover nothing" "$out" "0 applied"

# SPEC §6a: while the command of an in-doubt record still runs, a check
# that says not applied proves only that it has not landed YET: recover
# leaves it in doubt
# (a log of its own: the command runs on while the tests below run)
out=$(REFUND_MODE=late LATE=10 "$IDEM" exec --log "sqlite:$T/late.db" --session s3 \
  --call c3 --tool refund_payment --args '{"order_id":"d0"}' --timeout 200 -- "$TOOL")
expect "late: in doubt" 75 "$?"
out=$("$IDEM" recover --log "sqlite:$T/late.db" --policy "$T/policy.json" --json)
has "recover: still running" "$out" '"unknown":1'
has "still in doubt" "$("$IDEM" show --log "sqlite:$T/late.db" --json s3 c3)" '"state":"in_doubt"'

# an in-doubt record whose attempt has ended (the command died) and whose
# check says not applied becomes not_applied - when the tool's effects end
# with its command, as refund.sh's (it writes the ledger itself): the
# policy says so with settle_ms 0 (SPEC §6a)
sed 's/"retries": 0,/"retries": 0, "settle_ms": 0,/' "$T/policy.json" > "$T/local.json"
out=$(REFUND_MODE=crash "$IDEM" exec --session s3 --call c4 --tool refund_payment \
  --args '{"order_id":"d"}' --timeout 2000 -- "$TOOL")
expect "crashed: in doubt" 75 "$?"
: > "$LEDGER" # the provider lost it: certainly not applied
out=$("$IDEM" recover --policy "$T/local.json" --json)
has "recover not applied" "$out" '"not_applied":1'
has "not_applied state" "$("$IDEM" show --json s3 c4)" '"state":"not_applied"'

# ... but a command that died is an attempt that ENDED, not one that
# FINISHED: this one had handed the refund to the provider's queue
# (tests/tools/refund_queued.sh: applied later, when the test releases it,
# by a process outside its group) and then died by SIGKILL.  With no settle_ms (the default) recover
# leaves it in doubt on "not applied", the re-issue is fenced, and once the
# refund shows the re-issue is already applied and recover settles it: one
# refund (a log of its own, so that the counts below stay as they are)
: > "$LEDGER"
QL=sqlite:$T/queued.db
rm -f "$T/release"
out=$(QUEUE_UNTIL=$T/release QUEUE_THEN=kill "$IDEM" exec --log "$QL" --session s6 --call c1 \
  --tool refund_payment --args '{"order_id":"q"}' --timeout 2000 -- "$HERE/tools/refund_queued.sh")
expect "queued, died: in doubt" 75 "$?"
has "queued, died: outcome_unknown" "$out" '"status":"outcome_unknown"'
out=$("$IDEM" recover --log "$QL" --policy "$T/policy.json" --json)
has "queued, died: recover leaves it" "$out" '"unknown":1'
has "queued, died: recover says not applied of none" "$out" '"not_applied":0'
has "queued, died: still in doubt" "$("$IDEM" show --log "$QL" --json s6 c1)" '"state":"in_doubt"'
out=$("$IDEM" exec --log "$QL" --policy "$T/policy.json" --session s6 --call c2 \
  --tool refund_payment --args '{"order_id":"q"}' -- "$HERE/tools/refund_queued.sh")
expect "queued, died: re-issue not run" 75 "$?"
has "queued, died: re-issue unknown" "$out" '"status":"outcome_unknown"'
has "queued, died: re-issue names c1" "$out" '"duplicate_of":"c1"'
hasnt "queued, died: never safe to call" "$out" 'safe to call'
expect "queued, died: nothing landed yet" 0 "$(grep -c . "$LEDGER")"
touch "$T/release" # the provider applies it now
for _ in $(seq 200); do [ "$(grep -c . "$LEDGER")" -ge 1 ] && break; sleep 0.05; done
expect "queued, died: the refund landed" 1 "$(grep -c . "$LEDGER")"
out=$("$IDEM" exec --log "$QL" --policy "$T/policy.json" --session s6 --call c2 \
  --tool refund_payment --args '{"order_id":"q"}' -- "$HERE/tools/refund_queued.sh")
expect "queued, died: re-issue answered" 0 "$?"
has "queued, died: already applied" "$out" '"status":"already_applied"'
has "queued, died: by c1" "$out" '"duplicate_of":"c1"'
out=$("$IDEM" recover --log "$QL" --policy "$T/policy.json" --json)
has "queued, died: nothing left to recover" "$out" '"unknown":0'
has "queued, died: settled" "$("$IDEM" show --log "$QL" --json s6 c1)" '"state":"succeeded"'
# (every refund handed on has landed: nothing of this test left in the queue)
for _ in $(seq 200); do pgrep -f "__apply .*$T/" >/dev/null || break; sleep 0.05; done
expect "queued, died: one refund" 1 "$(grep -c . "$LEDGER")"

# --batch: one status process answers a stream of requests (the tools stall
# 10 s, so that their late results come after the recovery)
for c in b1 b2 b3; do
  REFUND_MODE=stall STALL=10 "$IDEM" exec --session s5 --call "$c" --tool refund_payment \
    --args "{\"order_id\":\"$c\"}" --timeout 200 -- "$TOOL" > /dev/null
done
cat > "$T/batch.sh" <<'B'
#!/bin/sh
# answers: the first request applied (with a result), the second not
# applied, the third garbled
n=0
while IFS= read -r req; do
  n=$((n + 1))
  case $n in
    1) echo 'applied {"refund_id":"re_b1"}' ;;
    2) echo not_applied ;;
    *) echo 'what?' ;;
  esac
done
B
chmod +x "$T/batch.sh"
out=$("$IDEM" recover --batch --status "$T/batch.sh" --json)
# (their commands still run: "not applied" cannot settle one, §6a)
has "batch applied" "$out" '"applied":1'
has "batch not applied" "$out" '"not_applied":0'
has "batch unknown" "$out" '"unknown":2'
expect "batch: two still in doubt" 2 "$("$IDEM" ls --json --session s5 --state in_doubt | grep -c .)"
has "batch result recorded" "$("$IDEM" ls --json --session s5 --state succeeded)" 're_b1'

# gc: settled records past their retention go; the in-doubt ones never do
sleep 2.2 # the stalled provider calls end; their late results are recorded
"$IDEM" exec --policy "$T/policy.json" --session s4 --call c5 --tool refund_payment \
  --args '{"order_id":"e"}' -- "$TOOL" > /dev/null
sleep 1.2
out=$("$IDEM" gc --json)
expect "gc exit" 0 "$?"
has "gc deleted the short-lived record" "$out" '"deleted":1'
"$IDEM" show s4 c5 > /dev/null 2>&1
expect "gc removed it" 1 "$?"
"$IDEM" show s1 c1 > /dev/null 2>&1
expect "gc kept the week-long record" 0 "$?"

# help and usage
"$IDEM" help recover | grep -q "status" && ok || bad "help recover"
"$IDEM" show > /dev/null 2>&1
expect "show without arguments" 2 "$?"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

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
# check says not applied becomes not_applied
out=$(REFUND_MODE=crash "$IDEM" exec --session s3 --call c4 --tool refund_payment \
  --args '{"order_id":"d"}' --timeout 2000 -- "$TOOL")
expect "crashed: in doubt" 75 "$?"
: > "$LEDGER" # the provider lost it: certainly not applied
out=$("$IDEM" recover --policy "$T/policy.json" --json)
has "recover not applied" "$out" '"not_applied":1'
has "not_applied state" "$("$IDEM" show --json s3 c4)" '"state":"not_applied"'

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

#!/bin/bash
# idem resolve: an operator's verdict on an action in doubt (SPEC §9), on a
# real log made by `idem exec` - SQLite by default, or the log URL given.
#   tests/resolve_test.sh IDEM_BINARY [LOG_URL]
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER=$T/ledger
export IDEM_LOG=${2:-sqlite:$T/log.db}
. "$HERE/assert.sh"
: > "$LEDGER"
S=rs$$_$RANDOM # a session of our own: a shared PostgreSQL log outlives us
cat > "$T/policy.json" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 3000,
  "retries": 0}}}
P
refunds() { grep -c "^$S:$1:" "$LEDGER"; }
# an attempt that ends without a verdict (exit 75: the command's own client
# gave up) and a status check that finds nothing yet: in doubt
doubt() {
  "$IDEM" exec --policy "$T/policy.json" --session "$S" --call "$1" \
    --tool refund_payment --args "{\"order_id\":\"$2\"}" --status 'exit 100' \
    -- sh -c 'exit 75'
}
call() { # call ID ORDER: the refund tool itself
  "$IDEM" exec --policy "$T/policy.json" --session "$S" --call "$1" \
    --tool refund_payment --args "{\"order_id\":\"$2\"}" -- "$TOOL"
}

out=$(doubt c1 o1)
expect "in doubt" 75 "$?"
hasnt "never told failed" "$out" "safe to call"
out=$("$IDEM" ls --in-doubt --session "$S")
has "ls --in-doubt lists it" "$out" "c1"
expect "ls --in-doubt: one" 2 "$(printf '%s\n' "$out" | wc -l | tr -d ' ')"

# usage errors: nothing changes
"$IDEM" resolve "$S" c1 2> "$T/err"
expect "no verdict" 2 "$?"
"$IDEM" resolve "$S" c1 --not-applied 2> "$T/err"
expect "not applied needs a reason" 2 "$?"
has "the reason is asked for" "$(cat "$T/err")" "--reason"
"$IDEM" resolve "$S" c1 --applied --not-applied 2> /dev/null
expect "one verdict" 2 "$?"
"$IDEM" resolve "$S" c1 --applied --result '{bad' 2> "$T/err"
expect "result not JSON" 2 "$?"
has "says what" "$(cat "$T/err")" "not JSON"
"$IDEM" resolve "$S" nosuch --applied 2> "$T/err"
expect "no such action" 1 "$?"
has "says which" "$(cat "$T/err")" "nosuch"
out=$("$IDEM" show --json "$S" c1)
has "still in doubt" "$out" '"state":"in_doubt"'

# --applied: every later call replays it, a re-issue is already_applied
out=$("$IDEM" resolve "$S" c1 --applied --result '{"refund_id":"re_op"}' \
  --by alice@ops --json)
expect "resolve applied" 0 "$?"
has "succeeded" "$out" '"state":"succeeded"'
has "operator" "$out" '"resolution":"operator"'
has "who" "$out" '"resolved_by":"alice@ops"'
hasnt "when" "$out" '"resolved_at":0'
out=$("$IDEM" show "$S" c1)
has "show: who" "$out" "alice@ops"
has "show: resolved at" "$out" "resolved at"
# (the re-issue first: the replay tells the model, after which a re-issue
# is a new decision)
out=$(call c2 o1)
expect "re-issue" 0 "$?"
has "re-issue already applied" "$out" '"status":"already_applied"'
has "names the first" "$out" '"duplicate_of":"c1"'
has "with the verdict's result" "$out" "re_op"
out=$(call c1 o1)
expect "replay" 0 "$?"
has "replays the verdict" "$out" "re_op"
has "replayed" "$out" '"replayed":true'
expect "no refund run by idem" 0 "$(( $(refunds c1) + $(refunds c2) ))"
# a second verdict is refused, in words, and changes nothing
"$IDEM" resolve "$S" c1 --not-applied --reason "late" 2> "$T/err"
expect "second resolve refused" 1 "$?"
has "not in doubt" "$(cat "$T/err")" "not in doubt"
has "names who did" "$(cat "$T/err")" "alice@ops"
out=$("$IDEM" show --json "$S" c1)
has "unchanged" "$out" '"state":"succeeded"'

# --not-applied: the next call of it runs it again, with its key
doubt d1 o2 > /dev/null
out=$("$IDEM" resolve "$S" d1 --not-applied --reason "provider: no such refund")
expect "resolve not applied" 0 "$?"
has "not_applied" "$out" "not_applied"
has "reason kept" "$out" "provider: no such refund"
has "default who" "$out" "@"
out=$(call d1 o2)
expect "runs again" 0 "$?"
has "succeeded" "$out" '"status":"succeeded"'
expect "one refund" 1 "$(refunds d1)"

# an action that was never in doubt
"$IDEM" resolve "$S" d1 --applied 2> "$T/err"
expect "succeeded: refused" 1 "$?"
has "its state" "$(cat "$T/err")" "succeeded"

# two operators at once: exactly one verdict lands
wins=0
for i in $(seq 1 10); do
  doubt r$i o3$i > /dev/null
  "$IDEM" resolve "$S" r$i --applied --by a > "$T/a" 2>&1 &
  "$IDEM" resolve "$S" r$i --not-applied --reason x --by b > "$T/b" 2>&1 &
  wait %1; ra=$?
  wait %2; rb=$?
  [ $((ra == 0)) -ne $((rb == 0)) ] && wins=$((wins + 1))
  out=$("$IDEM" show --json "$S" r$i)
  if [ $ra -eq 0 ]; then has "race $i: a's verdict" "$out" '"resolved_by":"a"'
  else has "race $i: b's verdict" "$out" '"resolved_by":"b"'; fi
done
expect "one verdict per race" 10 "$wins"
summary

#!/bin/sh
# What idem does today, in one minute: the same decision gets the same key
# however the model formats its arguments; a new decision gets a new one;
# bad input is refused with what and where.
#   scripts/demo.sh PATH_TO_IDEM
set -u
idem=${1:-build/idem}
if [ -t 1 ]; then B=$(printf '\033[1m'); G=$(printf '\033[32m'); R=$(printf '\033[31m'); N=$(printf '\033[0m'); else B= G= R= N=; fi
fail=0
step() { printf '\n%s%s%s\n' "$B" "$1" "$N"; }
show() { printf '  $ %s\n' "$*"; "$@" 2>&1 | sed 's/^/    /'; }
expect_same() { if [ "$1" = "$2" ]; then printf '  %ssame key%s\n' "$G" "$N"; else printf '  %sDIFFERENT keys: %s / %s%s\n' "$R" "$1" "$2" "$N"; fail=1; fi; }
expect_diff() { if [ "$1" != "$2" ]; then printf '  %snew key%s\n' "$G" "$N"; else printf '  %sSAME key: %s%s\n' "$R" "$1" "$N"; fail=1; fi; }

step "1. The model asks for a refund (session sess_1, tool-call id toolu_7)."
args='{"order_id":"ord_1","amount_cents":6000,"reason":"late delivery"}'
show "$idem" key --json --session sess_1 --call toolu_7 --tool refund_payment "$args"
k1=$("$idem" key --session sess_1 --call toolu_7 --tool refund_payment "$args")

step "2. The transport retries with the arguments reformatted (order, spaces, 6000.0)."
args2='{ "reason": "late delivery", "amount_cents": 6000.0, "order_id": "ord_1" }'
show "$idem" key --session sess_1 --call toolu_7 --tool refund_payment "$args2"
k2=$("$idem" key --session sess_1 --call toolu_7 --tool refund_payment "$args2")
expect_same "$k1" "$k2"

step "3. The model put its own idempotency key in the arguments: code, not the model, mints keys."
args3='{"order_id":"ord_1","amount_cents":6000,"reason":"late delivery","idempotency_key":"model-made-up"}'
show "$idem" key --key-arg idempotency_key --session sess_1 --call toolu_7 --tool refund_payment "$args3"
k3=$("$idem" key --key-arg idempotency_key --session sess_1 --call toolu_7 --tool refund_payment "$args3")
expect_same "$k1" "$k3"

step "4. A genuinely new decision days later (call id toolu_9): a new key, so it can go through."
show "$idem" key --session sess_1 --call toolu_9 --tool refund_payment "$args"
k4=$("$idem" key --session sess_1 --call toolu_9 --tool refund_payment "$args")
expect_diff "$k1" "$k4"

step "5. Bad arguments are refused, saying what and where; nothing would run."
show "$idem" key --session sess_1 --call toolu_8 --tool refund_payment '{"order_id":"ord_1","amount_cents":6000,"amount_cents":600}'
show "$idem" key --session sess_1 --call toolu_8 --tool refund_payment '{"order_id":"ord_1","amount_cents":12345678901234567890}'

step "6. RFC 8785 canonical JSON, the form the fingerprint is taken of."
printf '%s\n' '{"b":[1E3,0.1e-6,"\u00e9\u0041"],"a":-0.0}' '{"a":1,"a":2}' | "$idem" canon --lines 2>&1 | sed 's/^/    /'

# ---- the guard on the embedded store ----------------------------------------
here=$(cd "$(dirname "$0")/.." && pwd)
tool=$here/tests/tools/refund.sh
check=$here/tests/tools/refund_status.sh
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
export LEDGER=$tmp/ledger IDEM_LOG=sqlite:$tmp/attempts.db
: > "$LEDGER"
refunds() { n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
expect_refunds() {
  if [ "$(refunds)" = "$1" ]; then printf '  %sthe provider has applied %s refund(s)%s\n' "$G" "$1" "$N";
  else printf '  %sthe provider has applied %s refunds, expected %s%s\n' "$R" "$(refunds)" "$1" "$N"; fail=1; fi
}
exec_refund() { # TURN CALL [extra args]: the model turn, its call id
  t=$1 c=$2; shift 2
  "$idem" exec --session sess_1 --turn "$t" --call "$c" --tool refund_payment \
    --args '{"order_id":"ord_1","amount_cents":6000}' "$@" -- "$tool" 2>/dev/null | sed 's/^/    /'
}

step "7. Through the guard: the refund times out after the provider applied it (it stalls 2 s, the deadline is 0.5 s); the status check settles it."
REFUND_MODE=stall STALL=2 exec_refund turn_1 toolu_20 --timeout 500 --status "$check"
expect_refunds 1

step "8. The transport retries the same call: the recorded outcome is replayed, nothing is sent."
exec_refund turn_1 toolu_20
expect_refunds 1

step "9. A timeout with no status check: outcome unknown, and the model's re-issue (new call id) is fenced."
REFUND_MODE=stall STALL=1 exec_refund turn_2 toolu_30 --timeout 300
exec_refund turn_3 toolu_31 --timeout 300
expect_refunds 2
sleep 1.2
printf '  (the late result arrives and is recorded)\n'
exec_refund turn_4 toolu_32
expect_refunds 2

step "10. The harness crashes right after the provider answered; on resume the call is reconciled, not repeated."
IDEM_CRASH_AT=after_downstream_return exec_refund turn_5 toolu_40 --status "$check"
printf '  (killed)\n'
exec_refund turn_5 toolu_40 --status "$check"
expect_refunds 3

step "11. The log keeps every decision."
"$idem" ls | sed 's/^/    /'

if [ $fail -eq 0 ]; then printf '\n%sdemo: every check held%s\n' "$G" "$N"; else printf '\n%sdemo: a check failed%s\n' "$R" "$N"; fi
exit $fail

#!/bin/bash
# Crashes, tested: `idem exec` killed by SIGKILL at every named crash point
# (IDEM_CRASH_AT, SPEC §11) and at random moments, each followed by a resume
# (the harness re-issues the same call) and a check of the invariant in the
# provider's ledger: the refund was applied exactly once, never lost, never
# twice.
#   tests/crash_test.sh IDEM_BINARY [ROUNDS]
set -u
IDEM=$1
ROUNDS=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
STATUS=$HERE/tools/refund_status.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
ARGS='{"order_id":"ord_1","amount_cents":6000}'

call() { # call LOG CALL_ID: one guarded refund
  "$IDEM" exec --log "sqlite:$1" --session sess --call "$2" --tool refund_payment \
    --args "$ARGS" --timeout 3000 --status "$STATUS" -- "$TOOL"
}

# check NAME LOG: resume until a definite answer, then count the refunds
check() {
  local name=$1 log=$2 out code n
  out=$(call "$log" toolu_1 2>&1)
  code=$?
  if [ "$code" -ne 0 ]; then
    bad "$name: resume answered $code: $out"
    return
  fi
  n=$(grep -c . "$LEDGER" 2>/dev/null)
  n=${n:-0}
  if [ "$n" = 1 ]; then ok; else bad "$name: $n refunds in the ledger after resume"; fi
  # and the resumed call replays from now on
  out=$(call "$log" toolu_1 2>&1)
  case "$out" in *'"replayed":true'*) ok ;; *) bad "$name: no replay after resume: $out" ;; esac
}

# every named crash point
for point in after_pending_commit after_downstream_return before_outcome_commit \
  after_outcome_commit; do
  LEDGER=$T/$point.ledger
  : > "$LEDGER"
  IDEM_CRASH_AT=$point call "$T/$point.db" toolu_1 > /dev/null 2>&1
  code=$?
  if [ "$code" -eq 137 ]; then ok; else bad "$point: the process was not killed (exit $code)"; fi
  check "$point" "$T/$point.db"
done

# the tool itself crashing after it applied the refund (unknown outcome)
LEDGER=$T/toolcrash.ledger
: > "$LEDGER"
REFUND_MODE=crash call "$T/toolcrash.db" toolu_1 > /dev/null 2>&1
check "tool crash" "$T/toolcrash.db"

# SIGKILL at random moments of a slow call
for i in $(seq 1 "$ROUNDS"); do
  LEDGER=$T/rand$i.ledger
  : > "$LEDGER"
  REFUND_MODE=stall STALL=0.2 call "$T/rand$i.db" toolu_1 > /dev/null 2>&1 &
  pid=$!
  sleep "0.$(printf '%03d' $((RANDOM % 400)))"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  # the runner may still be finishing the downstream call: let it end
  sleep 0.3
  check "random kill $i" "$T/rand$i.db"
done

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

#!/bin/sh
# A fake payment provider as a command, for the tests of `idem exec`.
# It applies a refund by appending the idempotency key to the ledger
# $LEDGER, and does NOT dedupe on the key: every double application the
# guard failed to prevent shows in the ledger.  $REFUND_MODE:
#   ok      apply and answer {"refund_id":...}
#   stall   apply, then sleep $STALL seconds before answering (a timeout)
#   fail    apply nothing, exit 100 (certainly not applied)
#   reject  apply nothing, exit 101 (a definite failure)
#   crash   apply, then die by SIGKILL before answering
set -u
args=$(cat)
case "${REFUND_MODE:-ok}" in
  fail) echo "connection refused" >&2; exit 100 ;;
  reject) echo '{"error":"card_expired"}'; exit 101 ;;
esac
( flock 9; printf '%s\n' "$IDEM_KEY" >> "$LEDGER" ) 9>>"$LEDGER.lock"
n=$(wc -l < "$LEDGER" | tr -d ' ')
case "${REFUND_MODE:-ok}" in
  stall) sleep "${STALL:-2}" ;;
  crash) kill -9 $$ ;;
esac
printf '{"refund_id":"re_%s","args":%s}\n' "$n" "$args"

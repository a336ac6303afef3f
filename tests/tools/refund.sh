#!/bin/sh
# A fake payment provider as a command, for the tests of `idem exec`.
# It reads its arguments (JSON) on stdin and applies a refund by appending
# the idempotency key $IDEM_KEY, one whole line in one printf under flock,
# to the ledger $LEDGER.  By default it does NOT dedupe on the key: every
# double application the guard failed to prevent shows in the ledger.
# The answer is {"refund_id":"re_N","args":ARGS}, N the key's ledger line.
# $REFUND_MODE:
#   ok      apply and answer
#   stall   apply, then sleep $STALL seconds (default 2) before answering
#           (applied, then a timeout)
#   late    sleep $LATE seconds (default 1, may be fractional: 0.3) FIRST,
#           then apply and answer as ok (the attempt that lands after the
#           caller's deadline; killed during the sleep: nothing applied)
#   flaky   with probability $FLAKY_PCT percent (default 50) as late, else
#           as ok (the draw is from /dev/urandom)
#   fail    apply nothing, exit 100 (certainly not applied)
#   reject  apply nothing, exit 101 (a definite failure)
#   crash   apply, then die by SIGKILL before answering
# REFUND_DEDUPE=1 (any mode that applies: ok, stall, late, flaky, crash):
# the provider that dedupes on the key.  If the key is already in the
# ledger when the refund would be applied (checked under the same flock as
# the append, so after the sleep of late), nothing is appended and the
# answer is at once the refund applied before (its refund_id), exit 0;
# stall and crash then do not happen.
set -u
args=$(cat)
mode=${REFUND_MODE:-ok}
case "$mode" in
  fail) echo "connection refused" >&2; exit 100 ;;
  reject) echo '{"error":"card_expired"}'; exit 101 ;;
  flaky)
    r=$(od -An -N2 -tu2 /dev/urandom | tr -d ' ')
    if [ $((r % 100)) -lt "${FLAKY_PCT:-50}" ]; then mode=late; else mode=ok; fi ;;
esac
[ "$mode" = late ] && sleep "${LATE:-1}"
# Under the lock: (dedupe) find the key, else append it; print "N" for an
# applied refund, "dup N" for one applied before.
n=$( (
  flock 9
  if [ "${REFUND_DEDUPE:-0}" = 1 ] &&
     m=$(grep -nxF -m1 -e "$IDEM_KEY" "$LEDGER" 2>/dev/null); then
    echo "dup ${m%%:*}"
  else
    printf '%s\n' "$IDEM_KEY" >> "$LEDGER"
    wc -l < "$LEDGER" | tr -d ' '
  fi
) 9>>"$LEDGER.lock" )
case "$n" in
  dup\ *) n=${n#dup } ;;
  *)
    case "$mode" in
      stall) sleep "${STALL:-2}" ;;
      crash) kill -9 $$ ;;
    esac ;;
esac
printf '{"refund_id":"re_%s","args":%s}\n' "$n" "$args"

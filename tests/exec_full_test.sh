#!/bin/bash
# The disk fills while `idem exec`'s command runs (docs/FAILURES.md): the
# refund is applied, its outcome cannot be recorded.  The answer says what
# is known - outcome_unknown (exit 75), "ran", "could not record" - never
# failed (exit 1) nor "safe to call again"; once the disk is freed, the
# re-issue of the call is answered and applies nothing again.  The same when
# the disk fills while a status check runs, which finds the refund.
# IDEM_FULL_WHILE=FILE (store/vfs.c): the log's writes fail as on a full
# disk while FILE exists; the command creates it (the disk fills).
#   tests/exec_full_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$HERE/assert.sh"
export LEDGER=$T/ledger IDEM_FULL_WHILE=$T/full
: > "$LEDGER"
applied() { local n; n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
CMD="touch '$T/full'; exec '$HERE/tools/refund.sh'"
ex() { # ex LOG CALL [options]: envelope in $out, exit code in $code
  local log=$1 call=$2
  shift 2
  out=$("$IDEM" exec --log "sqlite:$T/$log.db" --session s --call "$call" \
    --tool refund_payment --args '{"order_id":"o1","amount_cents":700}' "$@" \
    -- sh -c "$CMD" 2>"$T/err")
  code=$?
}

# without a status check
ex a c1
expect "full: exit (not 1, the code of failed)" 75 "$code"
has "full: an envelope" "$out" '"status":"outcome_unknown"'
has "full: it ran" "$out" 'ran and its executor reported that it took effect'
has "full: not recorded" "$out" 'could not record this'
has "full: why" "$out" 'disk is full'
hasnt "full: never safe to repeat" "$out" 'safe to call it again'
has "full: do not repeat" "$out" 'Do not call refund_payment again'
expect "full: one refund" 1 "$(applied)"
rm -f "$T/full"
ex a c1
expect "freed: the re-issue is answered" 75 "$code"
has "freed: outcome_unknown" "$out" '"status":"outcome_unknown"'
expect "freed: still one refund" 1 "$(applied)"
"$IDEM" show --log "sqlite:$T/a.db" s c1 > "$T/show" 2>&1
has "freed: in doubt in the log" "$(cat "$T/show")" 'in_doubt'

# with a status check, which finds the refund once the disk is freed
: > "$LEDGER"
ex b c2 --status 'grep -qxF "$IDEM_KEY" "$LEDGER"'
expect "check, full: exit" 75 "$code"
has "check, full: outcome_unknown" "$out" '"status":"outcome_unknown"'
rm -f "$T/full"
ex b c2 --status 'grep -qxF "$IDEM_KEY" "$LEDGER"'
expect "check, freed: exit" 0 "$code"
has "check, freed: succeeded" "$out" '"status":"succeeded"'
expect "check, freed: one refund" 1 "$(applied)"
rm -f "$T/full"

# the command applies and stalls past the deadline; the disk fills while
# the status check finds the refund
: > "$LEDGER"
CHECK='grep -qxF "$IDEM_KEY" "$LEDGER" || exit 100
  [ -e "$FILL" ] && touch "$IDEM_FULL_WHILE"; exit 0'
export FILL=$T/fill
touch "$FILL"
CMD="'$HERE/tools/refund.sh'" REFUND_MODE=stall STALL=1 \
  ex c c3 --timeout 300 --status "$CHECK"
rm -f "$FILL" "$T/full"
expect "check fills: exit" 75 "$code"
has "check fills: outcome_unknown" "$out" '"status":"outcome_unknown"'
has "check fills: the check found it" "$out" \
  'a status check found that it took effect'
has "check fills: not recorded" "$out" 'could not record this'
hasnt "check fills: never safe to repeat" "$out" 'safe to call it again'
CMD="'$HERE/tools/refund.sh'" ex c c3 --timeout 300 --status "$CHECK"
expect "check fills, freed: exit" 0 "$code"
has "check fills, freed: succeeded" "$out" '"status":"succeeded"'
expect "check fills, freed: one refund" 1 "$(applied)"
summary

#!/bin/bash
# One model turn, one refund (SPEC §6.4) through `idem exec --turn`: 16
# processes, 16 call ids, one turn, a refund that applies at once - one
# application (the ledger is counted) and 15 already_applied naming the call
# that ran, run after run; the next turn's repeat runs; IDEM_TURN; the turn
# in idem show / ls; without a turn id, the window.
#
#   bash tests/turns_test.sh IDEM [RUNS]
set -u
IDEM=${1:?usage: turns_test.sh IDEM [RUNS]}
RUNS=${2:-20}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-turns-XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$HERE/assert.sh"
export LEDGER=$T/ledger
: >"$LEDGER"
LOG=sqlite:$T/log.db
ARGS='{"order_id":"ord_1","amount_cents":6000}'
cat >"$T/policy.json" <<'P'
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 10000,
  "wait_ms": 10000, "coalesce_ms": 2000}}}
P
applied() { grep -c . "$LEDGER"; }
ex() { # SESSION CALL [options]: one guarded refund, its envelope on stdout
  local s=$1 c=$2
  shift 2
  "$IDEM" exec --policy "$T/policy.json" --log "$LOG" --session "$s" --call "$c" \
    --tool refund_payment --args "$ARGS" "$@" -- "$HERE/tools/refund.sh"
}
burst() { # SESSION [options]: 16 calls at once, envelopes in $T/e.N
  local s=$1 i
  shift
  for i in $(seq 0 15); do ex "$s" "c$i" "$@" >"$T/e.$i" & done
  wait
}
check_burst() { # WHAT: one succeeded, 15 already_applied naming it
  local ran n=0 i
  ran=$(grep -l '^{"status":"succeeded"' "$T"/e.* | sed 's/.*e\.//')
  expect "$1: one call ran" 1 "$(printf '%s\n' $ran | grep -c .)"
  for i in $(seq 0 15); do
    [ "$i" = "$ran" ] && continue
    grep -q "^{\"status\":\"already_applied\".*\"duplicate_of\":\"c$ran\"" "$T/e.$i" && n=$((n + 1))
  done
  expect "$1: 15 already_applied naming c$ran" 15 "$n"
  if [ "$n" != 15 ]; then # what each caller said, to see why
    for i in $(seq 0 15); do echo "  c$i: $(head -c 400 "$T/e.$i")"; done
  fi
}

for run in $(seq "$RUNS"); do
  before=$(applied)
  burst "s$run" --turn t1
  expect "run $run: one application" $((before + 1)) "$(applied)"
  check_burst "run $run"
done
has "coalesced: the words" "$(cat "$T"/e.*)" "already made in this turn"

# the next turn (told): a new decision, by IDEM_TURN
before=$(applied)
out=$(IDEM_TURN=t2 ex s1 next)
has "next turn runs" "$out" '"status":"succeeded"'
expect "next turn: one more application" $((before + 1)) "$(applied)"
has "show: the turn" "$("$IDEM" show --log "$LOG" s1 next)" "t2"
has "show --json: the turn" "$("$IDEM" show --json --log "$LOG" s1 next)" '"turn":"t2"'
has "ls --json: the turn" "$("$IDEM" ls --json --log "$LOG" --session s1)" '"turn":"t1"'

# an empty turn id is refused, and nothing runs
before=$(applied)
ex s1 empty --turn '' >/dev/null 2>"$T/err"
expect "--turn '': usage" 2 "$?"
has "--turn '': says so" "$(cat "$T/err")" "--turn is empty"
expect "--turn '': nothing ran" "$before" "$(applied)"

# without turn ids: the calls within coalesce_ms are one turn, a later one is not
before=$(applied)
burst w
expect "no turn: one application" $((before + 1)) "$(applied)"
check_burst "no turn"
sleep 2.1
out=$(ex w later)
has "no turn, after coalesce_ms: runs" "$out" '"status":"succeeded"'
expect "no turn, after coalesce_ms: applied" $((before + 2)) "$(applied)"

# policy explain says it in words
has "explain: coalesce_ms" "$("$IDEM" policy explain "$T/policy.json" refund_payment | tr '\n' ' ' | tr -s ' ')" \
  "begin within 2000 ms of each other (coalesce_ms)"

summary

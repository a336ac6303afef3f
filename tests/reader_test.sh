#!/bin/bash
# "Told" means the answer was written to a reader that is still there
# (SPEC §10).  The harness reading the answer of `idem exec` (or `idem
# call`) dies 0.5 s into a 1.5 s refund: the command finishes, idem records
# it succeeded, and the answer goes nowhere - so it is not recorded as
# delivered, and idem does not die of SIGPIPE.  The resumed harness's model
# re-issues it under a new call id: fenced, answered already_applied with
# the first call's result; one refund in the ledger, never two.  Then a
# reader that is there but cannot take the answer (/dev/full): the delivery
# recorded just before the write is undone, with the same outcome.
#
#   bash tests/reader_test.sh IDEM          (idem exec)
#   bash tests/reader_test.sh IDEM PAYSIM   (idem call, against idem-paysim)
set -u
IDEM=${1:?usage: reader_test.sh IDEM [PAYSIM]}
PAYSIM=${2:-}
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-reader-XXXXXX") || exit 1
SIM=
cleanup() {
  [ -n "$SIM" ] && kill "$SIM" 2>/dev/null && wait "$SIM" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "$HERE/assert.sh"
LOG=sqlite:$T/log.db
field() { # field CALL NAME: a field of the record of call CALL
  "$IDEM" show --log "$LOG" --json s "$1" |
    python3 -c 'import json,sys; print(json.load(sys.stdin)[sys.argv[1]])' "$2"
}

if [ -z "$PAYSIM" ]; then
  # idem exec: tests/tools/refund.sh, mode late - it sleeps, then applies
  export REFUND_MODE=late LATE=1.5
  : >"$T/ledger_o1"
  : >"$T/ledger_o2"
  verb() { # verb CALL [ORDER]: idem exec of the refund under call id CALL
    LEDGER=$T/ledger_${2:-o1} IDEM_TURN=turn_$1 \
      "$IDEM" exec --log "$LOG" --session s --call "$1" --tool refund \
      --args "{\"order_id\":\"${2:-o1}\",\"amount_cents\":500}" \
      -- "$HERE/tools/refund.sh"
  }
  applied() { grep -c . "$T/ledger_${1:-o1}"; } # one ledger per order
else
  # idem call: idem-paysim holds the refund 1.5 s (mode late), then applies
  rm -f "$T/port"
  "$PAYSIM" --ledger "$T/ledger.jsonl" --port 0 --port-file "$T/port" \
    --stall-ms 1500 2>>"$T/paysim.log" &
  SIM=$!
  for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
  export PAYSIM_URL=http://127.0.0.1:$(cat "$T/port")
  curl -s -o /dev/null -d '{"mode":"late","count":2}' "$PAYSIM_URL/_mode"
  cat >"$T/policy.json" <<'P'
{"tools": {"refund": {"class": "guarded", "timeout_ms": 20000, "retries": 0,
  "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"}}}}
P
  verb() {
    IDEM_TURN=turn_$1 "$IDEM" call --policy "$T/policy.json" --log "$LOG" --session s \
      --call "$1" --tool refund \
      --args "{\"order_id\":\"${2:-o1}\",\"amount_cents\":500}"
  }
  applied() { grep -c "\"order_id\":\"${1:-o1}\"" "$T/ledger.jsonl"; }
fi

# each call is its own model turn (IDEM_TURN): the re-issues come from
# later turns, never coalesced with the first as one turn's calls
# the harness reads for 0.5 s, then is gone
{ verb c1 2>"$T/err1"; echo $? >"$T/rc1"; } | sleep 0.5
rc=$(cat "$T/rc1")
[ "$rc" -lt 128 ] && ok || bad "idem died of signal $((rc - 128)) (141: SIGPIPE)"
expect "exit status: the answer was not written" 1 "$rc"
has "it says why" "$(cat "$T/err1")" "the answer did not reach the model"
expect "one refund" 1 "$(applied)"
expect "recorded succeeded" succeeded "$(field c1 state)"
expect "not recorded as told" 0 "$(field c1 delivered)"

# the resumed harness: the model asks again under a new call id
out=$(verb c2)
expect "re-issue exit" 0 "$?"
has "re-issue fenced" "$out" '"status":"already_applied"'
has "re-issue names the first" "$out" '"duplicate_of":"c1"'
expect "still one refund" 1 "$(applied)"
[ "$(field c1 delivered)" -gt 0 ] && ok || bad "now c1 is told"
[ "$(field c2 delivered)" -gt 0 ] && ok || bad "and so is c2"

# a reader that is there, but the write fails (/dev/full: ENOSPC): the
# delivery recorded just before the write is undone
verb d1 o2 >/dev/full 2>"$T/err3"
expect "full: exit status" 1 "$?"
has "full: it says why" "$(cat "$T/err3")" "the answer did not reach the model"
expect "full: recorded succeeded" succeeded "$(field d1 state)"
expect "full: not recorded as told" 0 "$(field d1 delivered)"
out=$(verb d2 o2)
has "full: the re-issue is fenced" "$out" '"duplicate_of":"d1"'
expect "full: one refund" 1 "$(applied o2)"

summary

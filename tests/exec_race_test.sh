#!/bin/bash
# Transport retries of one call id racing each other through `idem exec`
# (issue 35, item 4).  Each round: an action in doubt (settle_ms 0, its
# command exited without a verdict, its first status check could not
# tell), then CALLERS retries of the same call id at once, whose status
# checks find nothing applied.  Every caller answers with an envelope that
# says what the action is - never "the action keeps changing under us"
# (before the fix: an outcome_unknown claiming the log could not record the
# check, or a failure) - and the refund is applied at most once a round,
# counted in the provider's ledger.
#   tests/exec_race_test.sh IDEM_BINARY [ROUNDS] [CALLERS]
set -u
IDEM=$1
ROUNDS=${2:-${IDEM_RACE_ROUNDS:-30}}
CALLERS=${3:-8}
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER=$T/ledger
. "$HERE/assert.sh"
# the status check: "cannot tell" once (the first attempt's), then the
# ledger's word (tests/tools/refund_status.sh)
cat > "$T/status.sh" <<S
#!/bin/sh
if [ -f "\$LEDGER.unknown" ]; then rm -f "\$LEDGER.unknown"; exit 2; fi
exec "$HERE/tools/refund_status.sh"
S
chmod +x "$T/status.sh"
cat > "$T/policy.json" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 5000,
  "retries": 0, "settle_ms": 0, "status": {"command": "$T/status.sh"}}}}
P
applied() { local n; n=$(grep -c "r:c1:$1\$" "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
double=0 bad=0 lost=0 statuses=""
for r in $(seq "$ROUNDS"); do
  log="sqlite:$T/r$r.db"
  args="{\"order_id\":\"ord_$r\",\"amount_cents\":100}"
  touch "$LEDGER.unknown"
  first=$("$IDEM" exec --policy "$T/policy.json" --log "$log" --session r --call c1 \
    --tool refund_payment --args "$args" -- sh -c 'cat >/dev/null; exit 3' 2>/dev/null)
  case "$first" in *'"status":"outcome_unknown"'*) ;; *) bad=$((bad + 1)); echo "  round $r: the first call: $first" ;; esac
  key=$(printf '%s' "$first" | sed -n 's/.*"idempotency_key":"r:c1:\([0-9a-f]*\)".*/\1/p')
  for i in $(seq "$CALLERS"); do
    "$IDEM" exec --policy "$T/policy.json" --log "$log" --session r --call c1 \
      --tool refund_payment --args "$args" -- "$TOOL" >"$T/out.$r.$i" 2>"$T/err.$r.$i" &
  done
  wait
  n=$(applied "$key")
  [ "$n" -gt 1 ] && double=$((double + 1))
  for i in $(seq "$CALLERS"); do
    st=$(sed -n 's/.*"status":"\([a-z_]*\)".*/\1/p' "$T/out.$r.$i" | head -1)
    statuses="$statuses ${st:-none}"
    if [ -z "$st" ] || grep -q "keeps changing" "$T/out.$r.$i" "$T/err.$r.$i"; then
      bad=$((bad + 1))
      [ "$bad" -le 3 ] && echo "  round $r caller $i: $(head -c 400 "$T/out.$r.$i") $(head -c 200 "$T/err.$r.$i")"
    fi
    # told it succeeded, the refund must be there
    [ "$st" = succeeded ] && [ "$n" -eq 0 ] && lost=$((lost + 1))
  done
done
echo "$ROUNDS rounds of $CALLERS callers:$(echo "$statuses" | tr ' ' '\n' | grep . | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
expect "rounds that applied the refund twice" 0 "$double"
expect "callers without an envelope, or told the action keeps changing" 0 "$bad"
expect "callers told succeeded without the refund applied" 0 "$lost"
summary

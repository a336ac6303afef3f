#!/bin/bash
# `idem demo`, the README's first command, as a test: it must end with every
# step as expected (exit 0), and what it leaves behind (--keep) is checked
# from the outside - the provider's ledger and the attempt log - with the
# refund that lands after its timeout (step 9, SPEC §6a) looked at closely.
#
#   bash tests/demo_test.sh IDEM PAYSIM
#
# The last line is `N passed, M failed`; exit 1 when anything failed.
set -u
IDEM=${1:?usage: demo_test.sh IDEM PAYSIM}
PAYSIM=${2:?usage: demo_test.sh IDEM PAYSIM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-demotest-XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/assert.sh"

OUT=$(NO_COLOR=1 TMPDIR=$T "$IDEM" demo --keep --paysim "$PAYSIM" 2>&1)
expect "demo exit" 0 "$?"
has "every step" "$OUT" 'Every step as expected'
hasnt "no mismatch" "$OUT" 'MISMATCH'
DIR=$(printf '%s\n' "$OUT" | sed -n 's/^Files kept in //p')
[ -d "$DIR" ] && ok || { bad "no kept directory in: $OUT"; DIR=$T/none; }

# step 9: unknown at the deadline, not sent again, landed, re-issue deduped
beat=$(printf '%s\n' "$OUT" | sed -n '/^9\. /,/^10\. /p')
has "beat 9 told" "$beat" 'A refund that lands after the timeout'
has "beat 9 timed out" "$beat" 'POST legacy_refund, attempt 1: outcome unknown'
expect "beat 9 checked, nothing yet" 1 "$(printf '%s\n' "$beat" | grep -c 'status check list_refunds of key sess_demo:toolu_06:[0-9a-f]*: not applied')"
hasnt "beat 9 not sent again" "$beat" 'legacy_refund, attempt 2'
has "beat 9 unknown" "$beat" 'the model gets: outcome_unknown'
has "beat 9 re-issue" "$beat" 'the model gets: already_applied'
has "beat 9 landed" "$beat" 'has 1 refund for ord_1004 (it landed after the timeout)'

# step 10: the tool's gateway gives up (504) while the provider's queue
# applies it: unknown, never failed, not sent again, the re-issue fenced,
# then already_applied once it landed
beat=$(printf '%s\n' "$OUT" | sed -n '/^10\. /,/^11\. /p')
has "beat 10 told" "$beat" 'The refund tool gives up on its own'
has "beat 10 a 504" "$beat" 'POST legacy_refund, attempt 1: outcome unknown - HTTP 504'
hasnt "beat 10 not sent again" "$beat" 'legacy_refund, attempt 2'
hasnt "beat 10 never failed" "$beat" 'the model gets: failed'
hasnt "beat 10 never safe to call" "$beat" 'safe to call'
expect "beat 10 unknown, then fenced" 2 "$(printf '%s\n' "$beat" | grep -c 'the model gets: outcome_unknown')"
has "beat 10 fenced naming toolu_09" "$beat" 'call id toolu_09'
has "beat 10 landed" "$beat" 'has 1 refund for ord_1005 (it landed after the 504)'
has "beat 10 re-issue" "$beat" 'the model gets: already_applied'

# the provider's ledger, read here: one refund per decision, none twice
ledger() {
  python3 - "$DIR/ledger.jsonl" "$1" <<'PY'
import json, sys, collections
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
what = sys.argv[2]
if what == "twice":
    c = collections.Counter(r["idempotency_key"] for r in rows)
    print(" ".join(k for k, n in c.items() if n > 1))
elif what == "all":
    print(len(rows))
else:
    print(sum(r["order_id"] == what for r in rows))
PY
}
expect "ledger ord_1001 (refund and goodwill)" 2 "$(ledger ord_1001)"
expect "ledger ord_1002" 1 "$(ledger ord_1002)"
expect "ledger ord_1003" 1 "$(ledger ord_1003)"
expect "ledger ord_1004 (landed late, once)" 1 "$(ledger ord_1004)"
expect "ledger ord_1005 (landed from the queue, once)" 1 "$(ledger ord_1005)"
expect "ledger total" 6 "$(ledger all)"
expect "ledger: no key twice" "" "$(ledger twice)"

# the attempt log agrees: toolu_06 settled by the status check (its attempt
# was never repeated), toolu_07 a duplicate of it
LOG=sqlite:$DIR/attempts.db
r6=$("$IDEM" show --json --log "$LOG" sess_demo toolu_06)
has "toolu_06 succeeded" "$r6" '"state":"succeeded"'
has "toolu_06 reconciled" "$r6" '"resolution":"reconciled"'
has "toolu_06 one attempt" "$r6" '"attempts":1'
r7=$("$IDEM" show --json --log "$LOG" sess_demo toolu_07)
has "toolu_07 deduplicated" "$r7" '"state":"deduplicated"'
has "toolu_07 duplicate of toolu_06" "$r7" '"duplicate_of":"toolu_06"'
r9=$("$IDEM" show --json --log "$LOG" sess_demo toolu_09)
has "toolu_09 succeeded" "$r9" '"state":"succeeded"'
has "toolu_09 one attempt" "$r9" '"attempts":1'
r11=$("$IDEM" show --json --log "$LOG" sess_demo toolu_11)
has "toolu_11 duplicate of toolu_09" "$r11" '"duplicate_of":"toolu_09"'

# the console on the demo's log (the command the demo prints) shows every
# action of the story, in the log's order
has "demo names the console" "$OUT" "serve --log $LOG --policy $DIR/policy.json"
"$IDEM" serve --log "$LOG" --policy "$DIR/policy.json" --listen 127.0.0.1:0 \
  --read-only > "$T/serve.out" 2>&1 &
SERVE=$!
for _ in $(seq 100); do
  grep -q '^idem serve: http' "$T/serve.out" && break
  sleep 0.1
done
URL=$(sed -n 's/^idem serve: \(http[^ ]*\)\/ .*/\1/p' "$T/serve.out")
[ -n "$URL" ] && ok || bad "idem serve did not start: $(cat "$T/serve.out")"
calls() { python3 -c 'import json,sys
print(" ".join(json.loads(l)["call_id"] for l in sys.stdin if l.strip()))'; }
want=$("$IDEM" ls --json --log "$LOG" --session sess_demo | calls)
got=$(curl -s "$URL/api/session?session=sess_demo&limit=500" |
  python3 -c 'import json,sys
print(" ".join(r["call_id"] for r in json.load(sys.stdin)["items"]))')
expect "the console shows the story's actions" "$want" "$got"
expect "the story has 11 actions" 11 "$(echo "$got" | wc -w)"
kill "$SERVE" 2>/dev/null
wait "$SERVE" 2>/dev/null

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

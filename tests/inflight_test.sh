#!/bin/bash
# SPEC §6a through `idem exec`: attempts still in flight after their
# deadline or after the front end died.  Every case counts applications in
# the provider's ledger (tests/tools/refund.sh, which does not dedupe on the
# key unless REFUND_DEDUPE=1).
#   tests/inflight_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
TOOL=$HERE/tools/refund.sh
STATUS="$HERE/tools/refund_status.sh"
T=$(mktemp -d)
trap 'pkill -KILL -f "$T/" 2>/dev/null; rm -rf "$T"' EXIT
export LEDGER=$T/ledger
. "$(dirname "$0")/assert.sh"
applied() { local n; n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
ARGS='{"order_id":"ord_1","amount_cents":6000}'
policy() { # policy FILE EXTRA-FIELDS: a refund tool with a status command
  cat > "$1" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 200,
  "retries": 1, "backoff_ms": 10, "wait_ms": 300 $2,
  "status": {"command": "$STATUS"}}}}
P
}
run() { # run LOG CALL [extra...]: envelope in $out, exit code in $code
  local log=$1 call=$2
  shift 2
  out=$("$IDEM" exec --log "sqlite:$T/$log.db" --session s --call "$call" \
    --tool refund_payment --args "$ARGS" "$@" -- "$TOOL" 2>/dev/null)
  code=$?
}
# wait until the process group of LOG's action s/CALL is empty
group_gone() {
  local pg i
  pg=$("$IDEM" show --log "sqlite:$T/$1.db" --json s "$2" | sed -n 's/.*"pgid":\(-\{0,1\}[0-9]*\).*/\1/p')
  pg=${pg#-}
  [ -n "$pg" ] && [ "$pg" != 0 ] || return 0
  for i in $(seq 100); do kill -0 -- "-$pg" 2>/dev/null || return 0; sleep 0.05; done
}
# wait until the ledger holds N refunds (a queued one lands), at most 10 s
wait_applied() {
  local i
  for i in $(seq 200); do [ "$(applied)" -ge "$1" ] && return 0; sleep 0.05; done
}
# wait until the provider's queue of refund_queued.sh holds nothing of this
# test (every refund handed on has landed), at most 10 s
queue_drained() {
  local i
  for i in $(seq 200); do pgrep -f "__apply .*$T/" >/dev/null || return 0; sleep 0.05; done
}
# wait until no process of this test's commands is left (late landings done)
settle_all() {
  local i
  for i in $(seq 100); do
    pgrep -f "refund.sh" >/dev/null 2>&1 || pgrep -f "__run --log sqlite:$T" >/dev/null 2>&1 || return 0
    sleep 0.1
  done
}

# ---- 1. the provider hangs past the deadline, THEN applies (no dedupe) ----
: > "$LEDGER"
policy "$T/p1.json" ""
REFUND_MODE=late LATE=1 run a c1 --policy "$T/p1.json"
expect "late: outcome unknown" 75 "$code"
has "late: unknown" "$out" '"status":"outcome_unknown"'
hasnt "late: never failed" "$out" '"status":"failed"'
hasnt "late: never safe to call again" "$out" 'safe to call'
# the same call again at once: the runner still holds it
REFUND_MODE=late LATE=1 run a c1 --policy "$T/p1.json"
expect "late, resumed at once: not final" 75 "$code"
hasnt "late, resumed: nothing claims not applied" "$out" 'safe to call'
# the model re-issues it under a new call id: fenced, nothing runs
REFUND_MODE=late LATE=1 run a c1b --policy "$T/p1.json"
expect "late, re-issued: not run" 75 "$code"
has "late, re-issued: names the first" "$out" '"duplicate_of":"c1"'
expect "late: nothing applied yet" 0 "$(applied)"
settle_all
expect "late: applied once, after the deadline" 1 "$(applied)"
# the model re-issues it again before it was told: already applied
run a c1b --policy "$T/p1.json"
expect "late: the re-issue is a duplicate" 0 "$code"
has "late: already applied" "$out" '"status":"already_applied"'
run a c1 --policy "$T/p1.json"
expect "late: the late result is the answer" 0 "$code"
has "late: succeeded" "$out" '"status":"succeeded"'
expect "late: still one refund" 1 "$(applied)"
has "late: recorded late" "$("$IDEM" show --log "sqlite:$T/a.db" --json s c1)" '"resolution":"late"'

# ---- 2. the same with a provider that dedupes on the key ------------------
: > "$LEDGER"
policy "$T/p2.json" ', "provider_dedupes": true'
REFUND_DEDUPE=1 REFUND_MODE=late LATE=0.6 run b c1 --policy "$T/p2.json"
expect "dedupe: answered" 0 "$((code == 0 || code == 75 ? 0 : 1))"
settle_all
REFUND_DEDUPE=1 run b c1 --policy "$T/p2.json"
expect "dedupe: succeeded" 0 "$code"
expect "dedupe: one refund" 1 "$(applied)"

# ---- 3. no status check: honest unknown, then the late result --------------
: > "$LEDGER"
REFUND_MODE=late LATE=0.8 run c c1 --timeout 200
expect "no check: unknown" 75 "$code"
REFUND_MODE=late LATE=0.8 run c c1 --timeout 200
expect "no check, again: unknown" 75 "$code"
settle_all
run c c1 --timeout 200
expect "no check: the late result" 0 "$code"
expect "no check: one refund" 1 "$(applied)"

# ---- 4. settle_ms 0: the command is killed at the deadline -----------------
# (its effects end with it: each attempt that misses the deadline is ended,
# so the retry runs, and after the last one the answer is failed: nothing
# can have taken effect - or unknown, if the check came before the kill)
: > "$LEDGER"
policy "$T/p4.json" ', "settle_ms": 0'
REFUND_MODE=late LATE=1 run d c1 --policy "$T/p4.json"
expect "settle 0: failed or unknown at the deadline" 0 "$((code == 1 || code == 75 ? 0 : 1))"
settle_all
expect "settle 0: the killed commands applied nothing" 0 "$(applied)"
run d c1 --policy "$T/p4.json" --timeout 5000
# (when the first call used up its retries, the resume's check settles it
# not applied - "safe to call again" - and the next call runs it)
if [ "$code" = 1 ]; then
  has "settle 0: told it did not take effect" "$out" 'safe to call it again'
  run d c1 --policy "$T/p4.json" --timeout 5000
fi
expect "settle 0: runs again once nothing can land" 0 "$code"
expect "settle 0: one refund" 1 "$(applied)"

# ---- 5. settle_ms 600: a retry waits until it has passed -------------------
: > "$LEDGER"
policy "$T/p5.json" ', "settle_ms": 600'
REFUND_MODE=late LATE=5 run e c1 --policy "$T/p5.json"
expect "settle 600: unknown" 75 "$code"
run e c1 --policy "$T/p5.json"
expect "settle 600: still unknown within it" 75 "$code"
sleep 0.8
settle_all
run e c1 --policy "$T/p5.json" --timeout 5000
expect "settle 600: runs again after it" 0 "$code"
expect "settle 600: one refund" 1 "$(applied)"

# ---- 6. kill -9 of the front end while its runner lives --------------------
: > "$LEDGER"
policy "$T/p6.json" ""
REFUND_MODE=late LATE=1.2 "$IDEM" exec --log "sqlite:$T/f.db" --session s --call c1 \
  --tool refund_payment --args "$ARGS" --policy "$T/p6.json" --timeout 5000 \
  -- "$TOOL" > /dev/null 2>&1 &
fe=$!
for i in $(seq 100); do pgrep -f "__run --log sqlite:$T/f.db" >/dev/null && break; sleep 0.02; done
sleep 0.2
kill -9 $fe
wait $fe 2>/dev/null
has "front end killed: the runner holds the lease" \
  "$("$IDEM" show --log "sqlite:$T/f.db" --json s c1)" '"state":"pending"'
run f c1 --policy "$T/p6.json" --timeout 5000
expect "front end killed, resumed at once: in progress" 75 "$code"
has "front end killed: in_progress" "$out" '"status":"in_progress"'
expect "front end killed: nothing ran twice" 0 "$(applied)"
settle_all
run f c1 --policy "$T/p6.json" --timeout 5000
expect "front end killed: the runner's result" 0 "$code"
expect "front end killed: one refund" 1 "$(applied)"

# ---- 7. kill -9 of the runner: its command dies with it -------------------
# refund.sh writes the ledger itself: its effects end with its process group
# (settle_ms 0), so once the group is empty the attempt has finished
: > "$LEDGER"
policy "$T/p7.json" ', "settle_ms": 0'
REFUND_MODE=late LATE=0.6 run g c1 --policy "$T/p7.json" --timeout 200 &
sleep 0.1
pkill -KILL -f "__run --log sqlite:$T/g.db"
wait
settle_all
group_gone g c1
expect "runner killed: the command applied nothing" 0 "$(applied)"
has "runner killed: its group is recorded" \
  "$("$IDEM" show --log "sqlite:$T/g.db" --json s c1)" '"pgid":'
run g c1 --policy "$T/p7.json" --timeout 5000
expect "runner killed: runs again once the group is empty" 0 "$code"
expect "runner killed: one refund" 1 "$(applied)"

# ---- 7u. the same, but the command had handed the refund to a queue -------
# (tests/tools/refund_queued.sh: a provider process outside the command's
# group applies it later, when the test releases it).  The runner dies,
# the command dies with it, the group is empty: the attempt has ENDED, not
# finished (SPEC §6a).  With no settle_ms a check's "not applied" proves
# nothing: in doubt, never "safe to call", the re-issue fenced until the
# refund shows.
: > "$LEDGER"
rm -f "$T/queued" "$T/release"
QUEUED=$T/queued QUEUE_UNTIL=$T/release QUEUE_THEN=hang:10 "$IDEM" exec \
  --log "sqlite:$T/gu.db" --session s --call c1 --tool refund_payment \
  --args "$ARGS" --policy "$T/p1.json" --timeout 5000 \
  -- "$HERE/tools/refund_queued.sh" > /dev/null 2>&1 &
fe=$!
for i in $(seq 200); do [ -e "$T/queued" ] && break; sleep 0.02; done
pkill -KILL -f "__run --log sqlite:$T/gu.db"
wait $fe 2>/dev/null
group_gone gu c1
expect "queued, runner killed: not landed yet" 0 "$(applied)"
out=$("$IDEM" exec --log "sqlite:$T/gu.db" --session s --call c1 --tool refund_payment \
  --args "$ARGS" --policy "$T/p1.json" --timeout 5000 -- "$HERE/tools/refund_queued.sh" 2>/dev/null)
code=$?
expect "queued, runner killed: resumed, unknown" 75 "$code"
has "queued, runner killed: outcome_unknown" "$out" '"status":"outcome_unknown"'
hasnt "queued, runner killed: never safe to call" "$out" 'safe to call'
hasnt "queued, runner killed: never failed" "$out" '"status":"failed"'
has "queued, runner killed: still in doubt" \
  "$("$IDEM" show --log "sqlite:$T/gu.db" --json s c1)" '"state":"in_doubt"'
has "queued, runner killed: one attempt" "$out" '"attempts":1'
out=$("$IDEM" exec --log "sqlite:$T/gu.db" --session s --call c2 --tool refund_payment \
  --args "$ARGS" --policy "$T/p1.json" --timeout 5000 -- "$HERE/tools/refund_queued.sh" 2>/dev/null)
expect "queued, runner killed: re-issue not run" 75 "$?"
has "queued, runner killed: re-issue unknown" "$out" '"status":"outcome_unknown"'
has "queued, runner killed: re-issue names c1" "$out" '"duplicate_of":"c1"'
touch "$T/release" # the provider applies it now
wait_applied 1
expect "queued, runner killed: the refund landed" 1 "$(applied)"
out=$("$IDEM" exec --log "sqlite:$T/gu.db" --session s --call c2 --tool refund_payment \
  --args "$ARGS" --policy "$T/p1.json" --timeout 5000 -- "$HERE/tools/refund_queued.sh" 2>/dev/null)
expect "queued, runner killed: re-issue answered" 0 "$?"
has "queued, runner killed: already applied" "$out" '"status":"already_applied"'
has "queued, runner killed: by c1" "$out" '"duplicate_of":"c1"'
queue_drained
expect "queued, runner killed: one refund" 1 "$(applied)"

# ---- 8. a caller that reads both pipes to EOF gets the answer at the deadline
: > "$LEDGER"
rm -f "$T/ended"
out=$("$IDEM" exec --log "sqlite:$T/h.db" --session s --call c1 --tool refund_payment \
  --args "$ARGS" --timeout 200 -- sh -c "echo noise >&2; sleep 1.5; touch $T/ended" 2>&1 | cat)
has "pipes: the answer" "$out" '"status":"outcome_unknown"'
has "pipes: the command's stderr is relayed" "$out" 'noise'
[ ! -e "$T/ended" ]
expect "pipes: answered before the command ended" 0 "$?"
settle_all

# ---- 10. a re-issue that went ahead supersedes the call it repeated --------
# c1 is in doubt; the model re-issues it as c2, which is fenced; once c1
# certainly did not apply, c2 runs; a replay of c1 then must not run again.
# c1's command does nothing but exit 3 (no verdict) 0.6 s after it
# starts, 0.4 s after its deadline: its effects end with it, and within
# settle_ms 700 of its deadline, which the policy says.  (settle_ms 0 would
# be true as well, but the runner would kill it at its deadline.)
: > "$LEDGER"
policy "$T/p10.json" ', "retries": 0, "settle_ms": 700'
sed -i 's/"retries": 1, //' "$T/p10.json"
out=$("$IDEM" exec --log "sqlite:$T/j.db" --session s --call c1 --tool refund_payment \
  --args "$ARGS" --policy "$T/p10.json" -- sh -c 'cat >/dev/null; sleep 0.6; exit 3' 2>/dev/null)
expect "superseded: c1 unknown" 75 "$?"
run j c2 --policy "$T/p10.json"
expect "superseded: c2 fenced while c1 may land" 75 "$code"
has "superseded: c2 names c1" "$out" '"duplicate_of":"c1"'
settle_all
sleep 1 # settle_ms 700 from c1's deadline
run j c2 --policy "$T/p10.json" --timeout 5000
expect "superseded: c2 runs once c1 cannot land" 0 "$code"
expect "superseded: one refund" 1 "$(applied)"
run j c1 --policy "$T/p10.json" --timeout 5000
expect "superseded: the replay of c1 does not run" 0 "$code"
has "superseded: c1 already applied by c2" "$out" '"duplicate_of":"c2"'
expect "superseded: still one refund" 1 "$(applied)"

# ---- 10u. the same when c1's command handed the refund on, then exited 3 --
# (no settle_ms: the default).  Its end is no verdict: the provider's queue
# applies it later (when the test releases it).  c1 stays in doubt, c2
# stays fenced, and once the refund shows c2 is already applied by c1: one
# refund
: > "$LEDGER"
policy "$T/p10u.json" ', "retries": 0'
sed -i 's/"retries": 1, //' "$T/p10u.json"
rm -f "$T/release"
queued() { # queued CALL: c1's command, refund_queued.sh exiting 3
  out=$(QUEUE_UNTIL=$T/release QUEUE_THEN=exit:3 "$IDEM" exec --log "sqlite:$T/ju.db" \
    --session s --call "$1" --tool refund_payment --args "$ARGS" \
    --policy "$T/p10u.json" --timeout 5000 -- "$HERE/tools/refund_queued.sh" 2>/dev/null)
  code=$?
}
queued c1
expect "handed on: c1 unknown" 75 "$code"
has "handed on: c1 outcome_unknown" "$out" '"status":"outcome_unknown"'
hasnt "handed on: c1 never safe to call" "$out" 'safe to call'
has "handed on: c1 one attempt" "$out" '"attempts":1'
show=$("$IDEM" show --log "sqlite:$T/ju.db" --json s c1)
has "handed on: c1 in doubt" "$show" '"state":"in_doubt"'
has "handed on: c1's executor is gone" "$show" '"executor":null'
expect "handed on: not landed yet" 0 "$(applied)"
queued c2
expect "handed on: c2 fenced" 75 "$code"
has "handed on: c2 unknown" "$out" '"status":"outcome_unknown"'
has "handed on: c2 names c1" "$out" '"duplicate_of":"c1"'
hasnt "handed on: c2 never safe to call" "$out" 'safe to call'
queued c1
expect "handed on: c1 resumed, still unknown" 75 "$code"
hasnt "handed on: c1 resumed, never failed" "$out" '"status":"failed"'
expect "handed on: nothing ran again" 0 "$(applied)"
touch "$T/release" # the provider applies it now
wait_applied 1
expect "handed on: the refund landed" 1 "$(applied)"
queued c2
expect "handed on: c2 answered" 0 "$code"
has "handed on: c2 already applied" "$out" '"status":"already_applied"'
has "handed on: c2 by c1" "$out" '"duplicate_of":"c1"'
queued c1
expect "handed on: c1 answered" 0 "$code"
has "handed on: c1 succeeded" "$out" '"status":"succeeded"'
queue_drained
expect "handed on: one refund" 1 "$(applied)"

# ---- 11. the command's exit is its answer, not its stdout's end ------------
# a background child that holds the command's stdout does not make a
# success wait for the deadline and land "late"
out=$("$IDEM" exec --log "sqlite:$T/k.db" --session s --call c1 --tool t --timeout 3000 \
  -- sh -c 'sleep 5 & echo "{\"ok\":true}"; exit 0' 2>/dev/null)
expect "background child: exit" 0 "$?"
has "background child: succeeded at once" "$out" '"status":"succeeded"'
has "background child: its output" "$out" '"result":{"ok":true}'
has "background child: executed, not late" \
  "$("$IDEM" show --log "sqlite:$T/k.db" --json s c1)" '"resolution":"executed"'

# ---- 9. policy decisions come before flag checks ---------------------------
out=$("$IDEM" exec --policy "$T/p1.json" --log "sqlite:$T/i.db" --session s --call c1 \
  --tool drop_table --status "exit 100" --timeout 100 -- "$TOOL")
expect "refused despite flags: exit" 77 "$?"
has "refused despite flags" "$out" '"status":"refused"'

summary

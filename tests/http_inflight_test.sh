#!/bin/bash
# SPEC §6a through `idem call`: an HTTP request that lands AFTER idem gave
# up on it.  The payment-provider simulator in mode `late` holds a refund
# past the policy's deadline, THEN applies it (meanwhile the status reads
# do not show it, and - when it dedupes - the same key answers 409).  A
# status check that says "not applied" during the hold must not let the
# refund be sent again: every case counts the refunds in the provider's
# ledger (GET /_ledger) and the POSTs it received per key (its log).
# And an exchange that ENDED without a verdict (issue 26): in mode
# `queued` a proxy answers 504 at once and the provider applies the refund
# from its queue a second later - "not applied" then means "not yet" too.
#
#   bash tests/http_inflight_test.sh IDEM PAYSIM
#
# The last line is `N passed, M failed`; exit 1 when anything failed.
set -u
IDEM=${1:?usage: http_inflight_test.sh IDEM PAYSIM}
PAYSIM=${2:?usage: http_inflight_test.sh IDEM PAYSIM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-httpif-XXXXXX") || exit 1
SIM="" BG=""
sim_gone() { while kill -0 "$SIM" 2>/dev/null; do sleep 0.05; done; SIM=; }
cleanup() {
  [ -n "$BG" ] && kill -KILL "$BG" 2>/dev/null
  [ -n "$SIM" ] && kill "$SIM" 2>/dev/null && sim_gone
  [ -n "${KEEP:-}" ] && echo "kept $T" >&2 || rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/assert.sh"
LEDGER=$T/ledger.jsonl
LOG=sqlite:$T/log.db
SIMLOG=$T/paysim.log
PORT=0
HOLD=4000 # how long mode late holds a refund; every deadline is shorter

# The provider, WITHOUT dedupe (it ignores the Idempotency-Key: a second
# POST is a second refund); a restart keeps its port and its ledger.
sim_start() {
  rm -f "$T/port"
  "$PAYSIM" --ledger "$LEDGER" --port "$PORT" --port-file "$T/port" \
    --no-dedupe 2>>"$SIMLOG" &
  SIM=$!
  disown "$SIM"
  for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
  PORT=$(cat "$T/port")
  export PAYSIM_URL=http://127.0.0.1:$PORT
}
# late DEDUPE [HOLD_MS]: hold the next refund, then apply it
late() {
  curl -s -o /dev/null -w '%{http_code}' \
    -d "{\"mode\":\"late\",\"count\":1,\"stall_ms\":${2:-$HOLD},\"dedupe\":$1}" \
    "$PAYSIM_URL/_mode" | grep -q 200 || bad "cannot set mode late"
}
# queued HOLD_MS: the next refund is answered 504 at once (a proxy gave up
# on the provider) and applied HOLD_MS later from the provider's queue
queued() {
  curl -s -o /dev/null -w '%{http_code}' \
    -d "{\"mode\":\"queued\",\"count\":1,\"stall_ms\":$1,\"dedupe\":false}" \
    "$PAYSIM_URL/_mode" | grep -q 200 || bad "cannot set mode queued"
}
# fail_once: the next refund is answered 503 and never applied
fail_once() {
  curl -s -o /dev/null -w '%{http_code}' \
    -d '{"mode":"fail","count":1,"dedupe":false}' \
    "$PAYSIM_URL/_mode" | grep -q 200 || bad "cannot set mode fail"
}
now_ms() { date +%s%3N; }
# refunds of ORDER in the provider's ledger, as the provider tells it
refunds() {
  curl -s "$PAYSIM_URL/_ledger" | python3 -c '
import json, sys
print(sum(r["order_id"] == sys.argv[1] for r in json.load(sys.stdin)["refunds"]))' "$1"
}
# wait (up to 20 s) until ORDER has N refunds
wait_refunds() {
  for _ in $(seq 200); do [ "$(refunds "$1")" -ge "$2" ] && return; sleep 0.1; done
}
# call TOOL CALL ORDER: idem call; RC, OUT (the envelope), ERR (--verbose)
call() {
  OUT=$("$IDEM" call --verbose --policy "$P" --log "$LOG" --session s \
    --call "$2" --tool "$1" --args "{\"order_id\":\"$3\",\"amount_cents\":700}" \
    2>"$T/err")
  RC=$?
  ERR=$(cat "$T/err")
}
record() { "$IDEM" show --json --log "$LOG" s "$1"; }
# unknown NAME: the answer is outcome_unknown - never failed, never "safe
# to call again"
unknown() {
  expect "$1: exit" 75 "$RC"
  has "$1: outcome_unknown" "$OUT" '"status":"outcome_unknown"'
  hasnt "$1: never safe to call again" "$OUT" 'safe to call'
}
# still_held NAME T0: the checks so far ran during the hold
still_held() {
  [ $(($(now_ms) - $2)) -lt "$HOLD" ] && ok ||
    bad "$1: too slow, the hold ended before the checks (test premise)"
}

sim_start
# refund_key / refund_order: no dedupe, a status check by key / by order;
# refund_dd: the provider dedupes (its policy says so); refund_blind: no
# status check; refund_settle*: settle_ms; refund_slow: a deadline long
# enough to kill idem call while its request is held; refund_q /
# refund_q_settle: issue 26, no dedupe, a status check by key, without and
# with settle_ms.
cat >"$T/policy.json" <<'P'
{"tools": {
  "refund_key": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_key",
      "applied_when": {"pointer": "/data", "key_present": true}}},
  "refund_dd": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "provider_dedupes": true, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_order", "arguments": {"order_id": "{order_id}"}}},
  "refund_blind": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"}},
  "refund_blind_dd": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "provider_dedupes": true, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"}},
  "refund_settle": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"], "settle_ms": 30000,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_key",
      "applied_when": {"pointer": "/data", "key_present": true}}},
  "refund_settle_short": {"class": "guarded", "timeout_ms": 500, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"], "settle_ms": 2000,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_key",
      "applied_when": {"pointer": "/data", "key_present": true}}},
  "refund_slow": {"class": "guarded", "timeout_ms": 3000, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_order", "arguments": {"order_id": "{order_id}"}}},
  "refund_slow_dd": {"class": "guarded", "timeout_ms": 3000, "retries": 2,
    "backoff_ms": 50, "provider_dedupes": true, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_order", "arguments": {"order_id": "{order_id}"}}},
  "refund_q": {"class": "guarded", "timeout_ms": 2000, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_key",
      "applied_when": {"pointer": "/data", "key_present": true}}},
  "refund_q_settle": {"class": "guarded", "timeout_ms": 2000, "retries": 2,
    "backoff_ms": 50, "fence": ["order_id"], "settle_ms": 500,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "by_key",
      "applied_when": {"pointer": "/data", "key_present": true}}},
  "by_key": {"class": "read_only", "timeout_ms": 2000,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds?idempotency_key={$key}"}},
  "by_order": {"class": "read_only", "timeout_ms": 2000,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds?order_id={order_id}"}}
}}
P
P=$T/policy.json

# -- (a) no dedupe, status check by key: unknown at the deadline, and
# nothing is sent again while the refund is held; then it lands, once
late false
t0=$(now_ms)
call refund_key a1 oa
unknown "a first"
has "a first: timed out" "$ERR" 'attempt 1: outcome unknown'
has "a first: checked" "$ERR" 'status check by_key'
has "a first: not applied yet" "$ERR" ': not applied'
hasnt "a first: no second attempt" "$ERR" 'attempt 2'
has "a first: check_with" "$OUT" '"check_with"'
has "a first: in doubt" "$(record a1)" '"state":"in_doubt"'
call refund_key a1 oa # the same call during the hold
unknown "a same call, held"
hasnt "a same call, held: nothing sent" "$ERR" 'POST'
call refund_key a2 oa # the model's re-issue during the hold
unknown "a re-issue, held"
has "a re-issue, held: names the first" "$OUT" '"duplicate_of":"a1"'
hasnt "a re-issue, held: nothing sent" "$ERR" 'POST'
expect "a held: nothing applied yet" 0 "$(refunds oa)"
still_held "a" "$t0"
wait_refunds oa 1
call refund_key a3 oa # the model re-issues again, after the refund landed
expect "a re-issue after: exit" 0 "$RC"
has "a re-issue after: already_applied" "$OUT" '"status":"already_applied"'
has "a re-issue after: names the first" "$OUT" '"duplicate_of":"a1"'
hasnt "a re-issue after: nothing sent" "$ERR" 'POST'
call refund_key a1 oa
expect "a after: exit" 0 "$RC"
has "a after: succeeded" "$OUT" '"status":"succeeded"'
has "a after: the refund" "$OUT" '"object":"refund"'
hasnt "a after: nothing sent" "$ERR" 'POST'
has "a after: reconciled" "$(record a1)" '"resolution":"reconciled"'
expect "a ledger" 1 "$(refunds oa)"
# the harness replays the turn of a2 (fenced during the hold, answered
# outcome_unknown): it re-issued a1, so it must not be a second refund
call refund_key a2 oa
hasnt "a2 replayed after a1 was told: not sent (a2 was a re-issue of a1)" "$ERR" 'POST'
expect "a ledger after a2 replayed" 1 "$(refunds oa)"

# -- (c) no status check at all: unknown, and it stays so - nothing can
# tell, so nothing is ever sent again
late false
t0=$(now_ms)
call refund_blind c1 oc
unknown "c first"
has "c first: says there is no check" "$OUT" 'no status check'
hasnt "c first: no second attempt" "$ERR" 'attempt 2'
call refund_blind c1 oc
unknown "c same call, held"
hasnt "c same call, held: nothing sent" "$ERR" 'POST'
call refund_blind c2 oc
unknown "c re-issue, held"
has "c re-issue, held: names the first" "$OUT" '"duplicate_of":"c1"'
expect "c held: nothing applied yet" 0 "$(refunds oc)"
still_held "c" "$t0"
wait_refunds oc 1
call refund_blind c1 oc
unknown "c same call after"
hasnt "c same call after: nothing sent" "$ERR" 'POST'
call refund_blind c3 oc
unknown "c re-issue after"
expect "c ledger" 1 "$(refunds oc)"

# -- (d) settle_ms longer than the hold: the same as (a)
late false
t0=$(now_ms)
call refund_settle d1 od
unknown "d first"
hasnt "d first: no second attempt" "$ERR" 'attempt 2'
call refund_settle d1 od
unknown "d same call, held"
hasnt "d same call, held: nothing sent" "$ERR" 'POST'
call refund_settle d2 od
unknown "d re-issue, held"
expect "d held: nothing applied yet" 0 "$(refunds od)"
still_held "d" "$t0"
wait_refunds od 1
call refund_settle d3 od
has "d re-issue after: already_applied" "$OUT" '"status":"already_applied"'
call refund_settle d1 od
has "d after: succeeded" "$OUT" '"status":"succeeded"'
expect "d ledger" 1 "$(refunds od)"

# -- (d') settle_ms 2 s, and the held refund never lands (the provider is
# stopped while it holds it: dropped, not applied).  Within settle_ms
# "not applied" changes nothing; once it has passed, the same call is sent
# again with the same key, and applies once.
late false 60000
t_before=$(now_ms)
call refund_settle_short e1 oe
t_after=$(now_ms) # past the deadline of attempt 1
unknown "settle first"
kill "$SIM" && sim_gone
sim_start
expect "settle: dropped, not applied" 0 "$(refunds oe)"
call refund_settle_short e1 oe
if [ $(($(now_ms) - t_before)) -lt 2400 ]; then
  unknown "settle: within settle_ms"
  hasnt "settle: within settle_ms, nothing sent" "$ERR" 'POST'
else
  bad "settle: too slow to call again within settle_ms (test premise)"
fi
while [ $(($(now_ms) - t_after)) -lt 2300 ]; do sleep 0.1; done
call refund_settle_short e1 oe
expect "settle passed: exit" 0 "$RC"
has "settle passed: sent again, succeeded" "$OUT" '"status":"succeeded"'
has "settle passed: the second attempt" "$ERR" 'attempt 2: applied'
expect "settle ledger" 1 "$(refunds oe)"

# -- idem call killed (SIGKILL) while the provider holds its request, and
# resumed at once: nothing is sent again (no dedupe, check by order)
late false
t0=$(now_ms)
"$IDEM" call --policy "$P" --log "$LOG" --session s --call k1 \
  --tool refund_slow --args '{"order_id":"ok","amount_cents":700}' \
  >/dev/null 2>&1 &
BG=$!
for _ in $(seq 100); do grep -q 'key=s:k1:.* holding' "$SIMLOG" && break; sleep 0.05; done
kill -KILL "$BG"
{ wait "$BG"; } 2>/dev/null
BG=
has "kill: the request was held" "$(grep 'key=s:k1:' "$SIMLOG")" 'holding'
call refund_slow k1 ok
unknown "kill, resumed"
hasnt "kill, resumed: nothing sent" "$ERR" 'POST'
call refund_slow k2 ok
unknown "kill, re-issue"
has "kill, re-issue: names the first" "$OUT" '"duplicate_of":"k1"'
hasnt "kill, re-issue: nothing sent" "$ERR" 'POST'
expect "kill held: nothing applied yet" 0 "$(refunds ok)"
still_held "kill" "$t0"
wait_refunds ok 1
call refund_slow k3 ok
has "kill re-issue after: already_applied" "$OUT" '"status":"already_applied"'
call refund_slow k1 ok
has "kill after: succeeded" "$OUT" '"status":"succeeded"'
expect "kill ledger" 1 "$(refunds ok)"

# -- (b) the provider dedupes (and the policy says provider_dedupes): still
# no retry while the held attempt may land (the record tracks one attempt in
# flight; a retry's 409 would say nothing of it) - unknown, never failed; a
# re-issue (a new key) is fenced, not sent
late true
t0=$(now_ms)
call refund_dd b1 ob
unknown "b first"
hasnt "b first: no blind retry while it may land" "$ERR" 'attempt 2'
hasnt "b first: never failed" "$OUT" '"status":"failed"'
call refund_dd b1 ob
expect "b same call, held: exit" 75 "$RC"
hasnt "b same call, held: never safe" "$OUT" 'safe to call'
call refund_dd b2 ob
unknown "b re-issue, held"
has "b re-issue, held: names the first" "$OUT" '"duplicate_of":"b1"'
hasnt "b re-issue, held: nothing sent" "$ERR" 'POST'
expect "b held: nothing applied yet" 0 "$(refunds ob)"
still_held "b" "$t0"
wait_refunds ob 1
call refund_dd b3 ob
has "b re-issue after: already_applied" "$OUT" '"status":"already_applied"'
call refund_dd b1 ob
has "b after: succeeded" "$OUT" '"status":"succeeded"'
expect "b ledger" 1 "$(refunds ob)"

# (b) without a status check: the retries meet 409; unknown
late true
call refund_blind_dd bb1 obb
unknown "b blind first"
call refund_blind_dd bb2 obb
unknown "b blind re-issue"
hasnt "b blind re-issue: nothing sent" "$ERR" 'POST'
wait_refunds obb 1
call refund_blind_dd bb2 obb
unknown "b blind re-issue after"
expect "b blind ledger" 1 "$(refunds obb)"

# (b) idem call killed while held, resumed at once: the resume may re-send
# with the same key (409), but never answers failed, and the re-issue is
# not sent
late true
t0=$(now_ms)
"$IDEM" call --policy "$P" --log "$LOG" --session s --call kb1 \
  --tool refund_slow_dd --args '{"order_id":"okb","amount_cents":700}' \
  >/dev/null 2>&1 &
BG=$!
for _ in $(seq 100); do grep -q 'key=s:kb1:.* holding' "$SIMLOG" && break; sleep 0.05; done
kill -KILL "$BG"
{ wait "$BG"; } 2>/dev/null
BG=
call refund_slow_dd kb1 okb
unknown "b kill, resumed"
call refund_slow_dd kb2 okb
unknown "b kill, re-issue"
hasnt "b kill, re-issue: nothing sent" "$ERR" 'POST'
expect "b kill held: nothing applied yet" 0 "$(refunds okb)"
still_held "b kill" "$t0"
wait_refunds okb 1
call refund_slow_dd kb3 okb
has "b kill re-issue after: already_applied" "$OUT" '"status":"already_applied"'
call refund_slow_dd kb1 okb
has "b kill after: succeeded" "$OUT" '"status":"succeeded"'
expect "b kill ledger" 1 "$(refunds okb)"

# -- (q) issue 26: a proxy in front of the provider answers 504 at once, and
# the provider applies the refund from its queue a second later.  The 504
# ENDED the exchange, but it is no verdict (SPEC §6a): the status check's
# "not applied" means "not yet" - never failed, never "safe to call
# again", nothing sent again; the model's re-issue at once is fenced, and
# the one 1.6 s after the first call is already_applied.  One refund.
queued 1000
t0=$(now_ms)
call refund_q q1 oq
unknown "q first"
has "q first: the proxy's 504" "$ERR" 'attempt 1: outcome unknown - HTTP 504 (unknown)'
has "q first: checked by key" "$ERR" 'status check by_key'
has "q first: not applied yet" "$ERR" ': not applied'
hasnt "q first: never sent again" "$ERR" 'attempt 2'
hasnt "q first: never failed" "$OUT" '"status":"failed"'
has "q first: check_with" "$OUT" '"check_with"'
has "q first: in doubt" "$(record q1)" '"state":"in_doubt"'
call refund_q q2 oq # the model's re-issue at once
unknown "q re-issue at once"
has "q re-issue at once: names the first" "$OUT" '"duplicate_of":"q1"'
hasnt "q re-issue at once: nothing sent" "$ERR" 'POST'
expect "q queued: nothing applied yet" 0 "$(refunds oq)"
[ $(($(now_ms) - t0)) -lt 1000 ] && ok ||
  bad "q: too slow, the refund left the queue before the checks (test premise)"
while [ $(($(now_ms) - t0)) -lt 1600 ]; do sleep 0.05; done
call refund_q q3 oq # and again, 1.6 s after the first
expect "q re-issue 1.6 s later: exit" 0 "$RC"
has "q re-issue 1.6 s later: already_applied" "$OUT" '"status":"already_applied"'
has "q re-issue 1.6 s later: names the first" "$OUT" '"duplicate_of":"q1"'
hasnt "q re-issue 1.6 s later: nothing sent" "$ERR" 'POST'
call refund_q q1 oq
has "q after: succeeded" "$OUT" '"status":"succeeded"'
hasnt "q after: nothing sent" "$ERR" 'POST'
expect "q ledger" 1 "$(refunds oq)"

# (q) with settle_ms 500, and a provider that never applies (a 503 it does
# not document): within settle_ms the re-issue is fenced; once it has
# passed, "not applied" is the whole truth, and the re-issue runs, once
fail_once
t0=$(now_ms)
call refund_q_settle qs1 oqs
unknown "q settle first"
has "q settle first: the 503" "$ERR" 'HTTP 503 (unknown)'
hasnt "q settle first: never sent again" "$ERR" 'attempt 2'
call refund_q_settle qs2 oqs
unknown "q settle re-issue at once"
has "q settle re-issue at once: names the first" "$OUT" '"duplicate_of":"qs1"'
hasnt "q settle re-issue at once: nothing sent" "$ERR" 'POST'
[ $(($(now_ms) - t0)) -lt 500 ] && ok ||
  bad "q settle: too slow to re-issue within settle_ms (test premise)"
sleep 0.7
call refund_q_settle qs3 oqs
expect "q settle re-issue after settle_ms: exit" 0 "$RC"
has "q settle re-issue after settle_ms: runs" "$OUT" '"status":"succeeded"'
has "q settle re-issue after settle_ms: sent once" "$ERR" 'attempt 1: applied'
expect "q settle ledger" 1 "$(refunds oqs)"

# no key was applied twice, anywhere
expect "no key applied twice" "" "$(python3 -c '
import json, sys, collections
c = collections.Counter(json.loads(l)["idempotency_key"] for l in open(sys.argv[1]))
print(" ".join(k for k, n in c.items() if n > 1))' "$LEDGER")"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

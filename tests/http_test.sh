#!/bin/bash
# HTTP tools against the payment-provider simulator, over real HTTP on
# loopback: `idem call` in each failure mode of the provider (stall,
# refusal, reset, 409, 422, 5xx, 429, crash), with the provider's ledger
# counted after each case - every refund applied at most once.
#
#   bash tests/http_test.sh IDEM PAYSIM
#
# The last line is `N passed, M failed`; exit 1 when anything failed.
set -u
IDEM=${1:?usage: http_test.sh IDEM PAYSIM}
PAYSIM=${2:?usage: http_test.sh IDEM PAYSIM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-http-XXXXXX") || exit 1
SIM=
sim_gone() { while kill -0 "$SIM" 2>/dev/null; do sleep 0.05; done; SIM=; }
HSRV=
cleanup() {
  [ -n "$SIM" ] && kill "$SIM" 2>/dev/null && sim_gone
  [ -n "$HSRV" ] && kill "$HSRV" 2>/dev/null && wait "$HSRV" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/assert.sh"
LEDGER=$T/ledger.jsonl
LOG=sqlite:$T/log.db
PORT=0

# the provider; a restart keeps its port and its ledger
sim_start() {
  rm -f "$T/port"
  "$PAYSIM" --ledger "$LEDGER" --port "$PORT" --port-file "$T/port" \
    --stall-ms 4000 2>>"$T/paysim.log" &
  SIM=$!
  disown "$SIM" # no job-control chatter when it is killed
  for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
  PORT=$(cat "$T/port")
  export PAYSIM_URL=http://127.0.0.1:$PORT
}
mode() {
  curl -s -o /dev/null -w '%{http_code}' -d "{\"mode\":\"$1\",\"count\":1}" \
    "$PAYSIM_URL/_mode" | grep -q 200 || bad "cannot set mode $1"
}
# refunds in the ledger for an order
count() { grep -c "\"order_id\":\"$1\"" "$LEDGER"; }
# call POLICY CALL ARGS: idem call; RC, OUT (the envelope) and ERR (--verbose)
call() {
  OUT=$("$IDEM" call --verbose --policy "$1" --log "$LOG" --session s \
    --call "$2" --tool refund --args "$3" 2>"$T/err")
  RC=$?
  ERR=$(cat "$T/err")
}
refund() { printf '{"order_id":"%s","amount_cents":%s}' "$1" "${2:-500}"; }

sim_start
# The policy: the URL from the environment; the status tool over HTTP.
cat >"$T/policy.json" <<'P'
{"tools": {
  "refund": {"class": "guarded", "timeout_ms": 1000, "retries": 2,
    "backoff_ms": 50, "provider_dedupes": true, "fence": ["order_id"],
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds",
             "headers": {"X-Client": "idem-test {$env:USER_AGENT_TAG}"}},
    "status": {"tool": "list", "arguments": {"order_id": "{order_id}"}}},
  "list": {"class": "read_only",
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds?order_id={order_id}"}},
  "plain": {"class": "guarded", "timeout_ms": 1000, "retries": 0,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds?order={order_id}"}}
}}
P
export USER_AGENT_TAG=t1
P=$T/policy.json

# -- applied: 2xx; the key travels in Idempotency-Key
call "$P" c1 "$(refund o1)"
expect "apply exit" 0 "$RC"
has "apply" "$OUT" '"status":"succeeded"'
has "apply result" "$OUT" '"object":"refund"'
key=$(printf '%s' "$OUT" | python3 -c 'import json,sys; print(json.load(sys.stdin)["idempotency_key"])')
has "key header reached the provider" "$(cat "$LEDGER")" "\"idempotency_key\":\"$key\""
expect "apply ledger" 1 "$(count o1)"

# -- replay and conflict: nothing goes downstream
call "$P" c1 '{ "amount_cents": 500.0, "order_id": "o1" }'
has "replay" "$OUT" '"replayed":true'
call "$P" c1 "$(refund o1 700)"
expect "conflict exit" 65 "$RC"
has "conflict" "$OUT" '"status":"conflict"'
expect "replay/conflict ledger" 1 "$(count o1)"

# -- 422: rejected, not retried, nothing applied
call "$P" c2 "$(refund o2 0)"
expect "422 exit" 1 "$RC"
has "422" "$OUT" '"status":"failed"'
has "422 attempts" "$OUT" '"attempts":1'
has "422 message" "$OUT" 'invalid_amount'
call "$P" c3 "$(refund closed_o3)"
has "422 closed order" "$ERR" 'HTTP 422 (rejected)'
expect "422 ledger" 0 "$(count o2)"

# -- stall: applied, then no answer before the deadline -> unknown; no
# retry while that attempt may still land (SPEC §6a: the record tracks one
# attempt in flight), the status check settles it
mode stall
call "$P" c4 "$(refund o4)"
expect "stall exit" 0 "$RC"
has "stall timeout" "$ERR" 'attempt 1: outcome unknown'
hasnt "stall: no blind retry" "$ERR" 'attempt 2'
has "stall checked" "$ERR" 'status check list'
has "stall succeeded" "$OUT" '"status":"succeeded"'
has "stall not a replay" "$OUT" '"replayed":false'
expect "stall ledger" 1 "$(count o4)"

# -- the same stall without a status check: outcome_unknown, then the fence
mode stall
OUT=$("$IDEM" call --verbose --policy "$P" --log "$LOG" --session s --call c5 \
  --tool plain --args "$(refund o5)" 2>"$T/err")
expect "unknown exit" 75 "$?"
has "unknown" "$OUT" '"status":"outcome_unknown"'
OUT=$("$IDEM" call --policy "$P" --log "$LOG" --session s --call c6 \
  --tool plain --args "$(refund o5)" 2>/dev/null)
has "fenced" "$OUT" 'c5'
expect "unknown ledger" 1 "$(count o5)"

# -- reset after applying: unknown; the retry with the same key is answered
# by the provider's own dedupe (the first response again)
mode reset
call "$P" c7 "$(refund o7)"
expect "reset exit" 0 "$RC"
has "reset unknown" "$ERR" 'after the request was sent'
has "reset succeeded" "$OUT" '"status":"succeeded"'
expect "reset ledger" 1 "$(count o7)"

# -- 503 before applying: unknown by default (it ended the exchange but is no
# verdict, SPEC §6a); retried with the same key only because the provider
# dedupes on it (provider_dedupes); without, see http_inflight_test.sh (q)
mode fail
call "$P" c8 "$(refund o8)"
has "503" "$ERR" 'HTTP 503 (unknown)'
has "503 then applied" "$OUT" '"status":"succeeded"'
expect "503 ledger" 1 "$(count o8)"

# -- 429 with on_429 "not_applied": retried; and on_5xx "rejected"
python3 - "$P" "$T/p2.json" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
p["tools"]["refund"]["http"].update(on_429="not_applied", on_5xx="rejected")
json.dump(p, open(sys.argv[2], "w"))
PY
mode reject429
call "$T/p2.json" c9 "$(refund o9)"
has "429 not applied" "$ERR" 'HTTP 429 (not applied)'
has "429 then applied" "$OUT" '"status":"succeeded"'
expect "429 ledger" 1 "$(count o9)"
mode fail
call "$T/p2.json" c10 "$(refund o10)"
expect "5xx rejected exit" 1 "$RC"
has "5xx rejected" "$ERR" 'HTTP 503 (rejected)'
expect "5xx ledger" 0 "$(count o10)"
mode normal

# -- a template that cannot be filled: rejected before anything is sent
OUT=$("$IDEM" call --policy "$P" --log "$LOG" --session s --call c11 \
  --tool plain --args '{"amount_cents":5}' 2>/dev/null)
expect "template exit" 1 "$?"
has "template" "$OUT" '{order_id}'
unset USER_AGENT_TAG
call "$P" c12 "$(refund o12)"
has "unset variable" "$OUT" 'USER_AGENT_TAG is not set'
expect "template ledger" 0 "$(count o12)"
export USER_AGENT_TAG=t1

# -- crash after applying: unknown (no answer: the request may still be in
# the provider's hands, so no retry), the status check unreachable ->
# outcome_unknown; the provider restarts and idem recover settles it;
# nothing is applied twice
mode crash
call "$P" c13 "$(refund o13)"
sim_gone
expect "crash exit" 75 "$RC"
hasnt "crash: no blind retry" "$ERR" 'attempt 2'
has "crash unknown" "$OUT" '"status":"outcome_unknown"'
out=$("$IDEM" show --json --log "$LOG" s c13)
has "crash in doubt" "$out" '"state":"in_doubt"'
sim_start
out=$("$IDEM" recover --log "$LOG" --policy "$P" --json)
has "recover" "$out" '"applied":1'
call "$P" c13 "$(refund o13)"
has "after recover" "$OUT" '"status":"succeeded"'
expect "crash ledger" 1 "$(count o13)"

# -- refusal: nothing listens -> not applied, retried, never unknown
kill "$SIM" && sim_gone
call "$P" c14 "$(refund o14)"
expect "refused exit" 1 "$RC"
has "refused" "$ERR" 'nothing was sent'
has "refused attempts" "$OUT" '"attempts":3'
out=$("$IDEM" show --json --log "$LOG" s c14)
has "refused not applied" "$out" '"state":"not_applied"'
sim_start
call "$P" c14 "$(refund o14)"
has "refused, then applied" "$OUT" '"status":"succeeded"'
expect "refused ledger" 1 "$(count o14)"

# -- idem call's own errors
"$IDEM" call --policy "$P" --log "$LOG" --session s --call c --tool nope \
  --args '{}' >/dev/null 2>&1
expect "refused tool" 77 "$?"
echo '{"tools":{"t":{"class":"guarded"}}}' >"$T/nohttp.json"
err=$("$IDEM" call --policy "$T/nohttp.json" --session s --call c --tool t 2>&1)
expect "no http rule" 2 "$?"
has "no http message" "$err" 'no "http" rule'
"$IDEM" call --session s --call c --tool t >/dev/null 2>&1
expect "no policy" 2 "$?"
call "$P" c15 '{"order_id":'
expect "bad arguments" 65 "$RC"

# -- a header value filled from the arguments goes out whole, however long
# (up to 64 KB a header line); a longer one fails the call before anything
# is sent, naming the header and the tool - never a header cut short.  The
# server (Python's, which takes header lines up to 64 KB) keeps each
# request's X-Sig.
cat >"$T/hdr_server.py" <<'PY'
import http.server, sys
class H(http.server.BaseHTTPRequestHandler):
    def do_POST(self):
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        with open(sys.argv[2], "a") as f:
            f.write(self.headers.get("X-Sig", "") + "\n")
        with open(sys.argv[2] + ".paths", "a") as f:
            f.write(self.path + "\n")
        body = b'{"object":"signed"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
    def log_message(self, *a):
        pass
s = http.server.HTTPServer(("127.0.0.1", 0), H)
with open(sys.argv[1] + ".tmp", "w") as f:
    f.write(str(s.server_address[1]))
import os; os.rename(sys.argv[1] + ".tmp", sys.argv[1])
s.serve_forever()
PY
python3 "$T/hdr_server.py" "$T/hport" "$T/sigs" 2>>"$T/hdr_server.log" &
HSRV=$!
for _ in $(seq 200); do [ -s "$T/hport" ] && break; sleep 0.05; done
: >"$T/sigs"
export HDR_URL=http://127.0.0.1:$(cat "$T/hport")
cat >"$T/signed.json" <<'P'
{"tools": {"sign": {"class": "guarded", "retries": 0, "timeout_ms": 5000,
  "http": {"url": "{$env:HDR_URL}/v1/signed", "headers": {"X-Sig": "{sig}"}}}}}
P
sig() { head -c "$1" /dev/zero | tr '\0' "$2"; }
OUT=$("$IDEM" call --policy "$T/signed.json" --log "$LOG" --session h --call h1 \
  --tool sign --args "{\"sig\":\"$(sig 40000 a)\"}" 2>"$T/err")
expect "40 KB header: exit" 0 "$?"
has "40 KB header: applied" "$OUT" '"status":"succeeded"'
expect "40 KB header: one request" 1 "$(grep -c . "$T/sigs")"
expect "40 KB header: the whole value arrived" "$(sig 40000 a)" "$(head -n 1 "$T/sigs")"
OUT=$("$IDEM" call --policy "$T/signed.json" --log "$LOG" --session h --call h2 \
  --tool sign --args "{\"sig\":\"$(sig 70000 b)\"}" 2>"$T/err")
expect "70 KB header: exit" 1 "$?"
has "70 KB header: failed" "$OUT" '"status":"failed"'
has "70 KB header: says why" "$OUT" 'the header X-Sig of tool sign is longer than 65536 bytes'
has "70 KB header: nothing sent" "$OUT" 'the request was not sent'
expect "70 KB header: no request" 1 "$(grep -c . "$T/sigs")"
has "70 KB header: recorded failed" "$("$IDEM" show --json --log "$LOG" h h2)" '"state":"failed"'

# -- numbers fill a URL and a header with their canonical RFC 8785 text (the
# text the fingerprint is taken of), never a printf rendering: 0.1, not
# 0.10000000000000001; 1e21 is 1e+21 (percent-encoded in the URL); a long
# mantissa its shortest round-trip digits
cat >"$T/amount.json" <<'P'
{"tools": {"amt": {"class": "guarded", "retries": 0, "timeout_ms": 5000,
  "http": {"url": "{$env:HDR_URL}/v1/signed?amount={amount}",
           "headers": {"X-Sig": "{amount}"}}}}}
P
amount() { # ARGS CALL WANT_PATH WANT_HEADER
  : >"$T/sigs"
  : >"$T/sigs.paths"
  OUT=$("$IDEM" call --policy "$T/amount.json" --log "$LOG" --session n --call "$2" \
    --tool amt --args "$1" 2>"$T/err")
  expect "amount $1: exit" 0 "$?"
  expect "amount $1: the URL" "$3" "$(cat "$T/sigs.paths")"
  expect "amount $1: the header" "$4" "$(cat "$T/sigs")"
}
amount '{"amount":0.1}' n1 "/v1/signed?amount=0.1" "0.1"
amount '{"amount":1e21}' n2 "/v1/signed?amount=1e%2B21" "1e+21"
amount '{"amount":3.141592653589793238462643383279}' n3 \
  "/v1/signed?amount=3.141592653589793" "3.141592653589793"
amount '{"amount":123456789012.50}' n4 "/v1/signed?amount=123456789012.5" "123456789012.5"

# -- issue 27: an argument never leaves its path segment.  ".." in
# /v1/customers/{customer_id}/refunds went out as POST /v1/refunds (libcurl
# resolves dot segments) and the provider refunded; now it is refused, and
# nothing is sent
cat >"$T/cust.json" <<'P'
{"tools": {"refund": {"class": "guarded", "retries": 0, "timeout_ms": 5000,
  "http": {"url": "{$env:PAYSIM_URL}/v1/customers/{customer_id}/refunds"}}}}
P
call "$T/cust.json" dot1 '{"customer_id":"..","order_id":"o27","amount_cents":500}'
expect "dot segment exit" 1 "$RC"
has "dot segment: why" "$OUT" '{customer_id}: the value \"..\" would leave its path segment'
expect "dot segment ledger" 0 "$(count o27)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

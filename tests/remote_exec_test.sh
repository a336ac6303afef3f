#!/bin/bash
# SPEC §6a as amended, the seed's own case through `idem exec`: ended is not
# finished.  The provider is REMOTE - a process of its own session, outside
# everything idem runs (tests/tools/remote_provider.py, started with
# setsid) - that accepts a refund and applies it ~1 s later from its queue.
# The command is curl with a client deadline of its own (--max-time 0.3):
# it gives up first and exits 28.  Its process group is empty, its runner
# is done, and the refund has not landed yet: only settle_ms, or the status
# check finding it, may finish the attempt.  The provider never dedupes, so
# every application the guard failed to prevent is a line of its ledger.
#   tests/remote_exec_test.sh IDEM_BINARY
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d)
PID=
trap '[ -n "$PID" ] && kill "$PID" 2>/dev/null; rm -rf "$T"' EXIT
. "$HERE/assert.sh"
command -v curl >/dev/null || { echo "curl is missing (scripts/install-deps.sh installs it)"; exit 1; }
command -v python3 >/dev/null || { echo "python3 is missing"; exit 1; }

setsid python3 "$HERE/tools/remote_provider.py" --ledger "$T/ledger" \
  --received "$T/received" --port-file "$T/port" --pid-file "$T/pid" \
  </dev/null >/dev/null 2>"$T/provider.err" &
for _ in $(seq 200); do [ -s "$T/port" ] && [ -s "$T/pid" ] && break; sleep 0.05; done
PID=$(cat "$T/pid" 2>/dev/null)
PORT=$(cat "$T/port" 2>/dev/null)
[ -n "$PORT" ] || { echo "the provider did not start: $(cat "$T/provider.err")"; exit 1; }
URL=http://127.0.0.1:$PORT
# applied / received COUNT KEY: lines of the provider's ledger / of the
# requests it accepted
applied() { grep -cxF -e "$1" "$T/ledger"; }
received() { grep -cxF -e "$1" "$T/received"; }

# the status check asks the provider by the key: 200 applied (exit 0, the
# answer is the result), 404 not applied (exit 100), anything else unknown
cat > "$T/status.sh" <<S
#!/bin/sh
curl -s -f --max-time 2 "$URL/refunds/\$IDEM_KEY"
case \$? in 0) exit 0 ;; 22) exit 100 ;; *) exit 1 ;; esac
S
# the curl recipe: exit 6 (host not resolved) and 7 (no connection) mean
# nothing was sent - not applied; 28 (its own timeout), 52, 55, 56 and
# every other status mean it may have been: unknown
policy() { # policy FILE EXTRA-FIELDS
  cat > "$1" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 3000,
  "retries": 1, "backoff_ms": 10, "wait_ms": 300 $2,
  "exit_codes": {"not_applied": [6, 7]},
  "status": {"command": "sh $T/status.sh"}}}}
P
}
ARGS='{"order_id":"ord_1","amount_cents":6000}'
# call LOG SESSION CALL POLICY QUERY [CURL OPTIONS...]: the refund through
# curl, which gives up after 0.3 s; the envelope in $out, the exit in $code
call() {
  local log=$1 session=$2 id=$3 pol=$4 query=$5
  shift 5
  out=$("$IDEM" exec --log "sqlite:$T/$log.db" --policy "$pol" --session "$session" \
    --call "$id" --tool refund_payment --args "$ARGS" -- sh -c \
    'url=$1; shift; exec curl -s --max-time 0.3 "$@" -X POST \
       -H "Idempotency-Key: $IDEM_KEY" --data-binary @- "$url"' \
    sh "$URL/refunds?$query" "$@" 2>"$T/err")
  code=$?
}
key() { "$IDEM" key --session "$1" --call "$2" --tool refund_payment "$ARGS"; }
# wait (at most 10 s) until the provider's queue holds no request of the
# keys starting with $1: every refund sent has landed
drained() {
  local i
  for i in $(seq 200); do
    curl -s --max-time 2 "$URL/pending?prefix=$1" | grep -q '"pending":0' && return 0
    sleep 0.05
  done
}

# ---- 1. the provider applies 1 s after curl gave up (default settle_ms) -----
policy "$T/p1.json" ""
K1=$(key s1 c1)
K2=$(key s1 c2)
call a s1 c1 "$T/p1.json" "delay_ms=1000"
expect "late: the first answer says unknown" 75 "$code"
has "late: outcome_unknown" "$out" '"status":"outcome_unknown"'
hasnt "late: never failed" "$out" '"status":"failed"'
hasnt "late: never safe to call again" "$out" 'safe to call'
has "late: one attempt (no retry of an attempt that may land)" "$out" '"attempts":1'
show=$("$IDEM" show --log "sqlite:$T/a.db" --json s1 c1)
has "late: in doubt" "$show" '"state":"in_doubt"'
has "late: curl's own timeout is the error" "$show" 'status 28'
has "late: nothing of it runs" "$show" '"executor":null'
expect "late: sent once" 1 "$(received "$K1")"
expect "late: not landed yet" 0 "$(applied "$K1")"
# the model re-issues it under a new call id, right after: fenced
call a s1 c2 "$T/p1.json" "delay_ms=1000"
expect "late, re-issued at once: not run" 75 "$code"
has "late, re-issued at once: unknown" "$out" '"status":"outcome_unknown"'
has "late, re-issued at once: names c1" "$out" '"duplicate_of":"c1"'
hasnt "late, re-issued at once: never safe to call" "$out" 'safe to call'
expect "late, re-issued at once: nothing sent" 0 "$(received "$K2")"
# 1.6 s later the refund has landed: the re-issue is already applied
sleep 1.6
call a s1 c2 "$T/p1.json" "delay_ms=1000"
expect "late, re-issued 1.6 s later: answered" 0 "$code"
has "late, re-issued 1.6 s later: already applied" "$out" '"status":"already_applied"'
has "late, re-issued 1.6 s later: by c1" "$out" '"duplicate_of":"c1"'
call a s1 c1 "$T/p1.json" "delay_ms=1000"
expect "late, c1 resumed: answered" 0 "$code"
has "late, c1 resumed: succeeded" "$out" '"status":"succeeded"'
has "late, c1: reconciled" "$("$IDEM" show --log "sqlite:$T/a.db" --json s1 c1)" '"resolution":"reconciled"'
drained s1:
expect "late: one refund for c1" 1 "$(applied "$K1")"
expect "late: none for c2" 0 "$(applied "$K2")"
expect "late: one refund in all" 1 "$(grep -c . "$T/ledger")"
expect "late: one request in all" 1 "$(grep -c . "$T/received")"

# ---- 2. settle_ms 500, a provider that never applies ------------------------
# the request is lost in the provider; once settle_ms has passed since curl
# gave up, "not applied" is believed: the re-issue runs, once
policy "$T/p2.json" ', "settle_ms": 500'
K1=$(key s2 c1)
K2=$(key s2 c2)
call b s2 c1 "$T/p2.json" "never=1"
expect "lost: unknown" 75 "$code"
has "lost: outcome_unknown" "$out" '"status":"outcome_unknown"'
hasnt "lost: never safe to call within settle_ms" "$out" 'safe to call'
call b s2 c2 "$T/p2.json" "never=1"
expect "lost, re-issued within settle_ms: not run" 75 "$code"
has "lost, re-issued within settle_ms: names c1" "$out" '"duplicate_of":"c1"'
expect "lost, re-issued within settle_ms: nothing sent" 0 "$(received "$K2")"
sleep 0.8
call b s2 c2 "$T/p2.json" "never=1"
has "lost, re-issued after settle_ms: ran" "$out" '"attempts":1'
hasnt "lost, re-issued after settle_ms: not fenced" "$out" '"duplicate_of"'
has "lost, re-issued after settle_ms: its own curl gave up too" "$out" '"status":"outcome_unknown"'
expect "lost, re-issued after settle_ms: sent once" 1 "$(received "$K2")"
expect "lost: c1 sent once" 1 "$(received "$K1")"
has "lost: c1 settled not applied" "$("$IDEM" show --log "sqlite:$T/b.db" --json s2 c1)" '"state":"not_applied"'
expect "lost: nothing applied for c1" 0 "$(applied "$K1")"
expect "lost: nothing applied for c2" 0 "$(applied "$K2")"
sleep 0.6
expect "lost: still one request for c2" 1 "$(received "$K2")"

# ---- 3. exit 6 and 7: nothing was sent, retried with the key, then failed ---
policy "$T/p3.json" ""
before=$(grep -c . "$T/received")
# 7: nobody listens (port 1)
out=$("$IDEM" exec --log "sqlite:$T/c.db" --policy "$T/p3.json" --session s3 --call c7 \
  --tool refund_payment --args "$ARGS" -- sh -c \
  'exec curl -s --max-time 0.3 -X POST -H "Idempotency-Key: $IDEM_KEY" --data-binary @- http://127.0.0.1:1/refunds' 2>/dev/null)
expect "exit 7: failed" 1 "$?"
has "exit 7: failed" "$out" '"status":"failed"'
has "exit 7: retried with its key" "$out" '"attempts":2'
has "exit 7: said honestly" "$out" 'did not take effect'
show=$("$IDEM" show --log "sqlite:$T/c.db" --json s3 c7)
has "exit 7: not applied" "$show" '"state":"not_applied"'
has "exit 7: curl's status" "$show" 'status 7'
# 6: the name does not resolve (DNS over HTTPS from a port nobody listens on)
out=$("$IDEM" exec --log "sqlite:$T/c.db" --policy "$T/p3.json" --session s3 --call c6 \
  --tool refund_payment --args "$ARGS" -- sh -c \
  'exec curl -s --max-time 0.3 --doh-url http://127.0.0.1:1/dns-query -X POST -H "Idempotency-Key: $IDEM_KEY" --data-binary @- http://refunds.example/refunds' 2>/dev/null)
expect "exit 6: failed" 1 "$?"
has "exit 6: failed" "$out" '"status":"failed"'
has "exit 6: retried with its key" "$out" '"attempts":2'
has "exit 6: curl's status" "$("$IDEM" show --log "sqlite:$T/c.db" --json s3 c6)" 'status 6'
# ... and without the recipe, the same 7 is only unknown: never failed
policy "$T/p3u.json" ""
sed -i 's/"not_applied": \[6, 7\]/"not_applied": [100]/' "$T/p3u.json"
out=$("$IDEM" exec --log "sqlite:$T/d.db" --policy "$T/p3u.json" --session s3 --call c7 \
  --tool refund_payment --args "$ARGS" -- sh -c \
  'exec curl -s --max-time 0.3 -X POST -H "Idempotency-Key: $IDEM_KEY" --data-binary @- http://127.0.0.1:1/refunds' 2>/dev/null)
expect "exit 7 unmapped: unknown" 75 "$?"
hasnt "exit 7 unmapped: never safe to call" "$out" 'safe to call'
expect "exit 6 and 7: nothing reached the provider" "$before" "$(grep -c . "$T/received")"

summary

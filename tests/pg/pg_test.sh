#!/bin/bash
# The guard on the PostgreSQL store, as processes, against a real server
# (run under tests/pg/with_server.sh, which sets IDEM_PG_URL and
# IDEM_PG_CTL):
#   - 8 processes x 4 threads racing the same actions and fence scopes
#     (tests/pg/race_guard.c): one application each, checked in a ledger;
#   - idem exec / ls / show / stats / recover / gc with --log postgres://...;
#   - SIGKILL of `idem exec` at every crash point, then a resume: applied
#     exactly once;
#   - the server restarted while calls run: no lost record, no double
#     application;
#   - idem recover from another host id: a live owner's record elsewhere is
#     taken over only after its lease.
#   tests/pg/pg_test.sh IDEM_BINARY RACE_GUARD_BINARY [ACTIONS]
set -u
IDEM=$1
RACE=$2
ACTIONS=${3:-25}
HERE=$(cd "$(dirname "$0")/.." && pwd)
TOOL=$HERE/tools/refund.sh
STATUS=$HERE/tools/refund_status.sh
URL=${IDEM_PG_URL:?run me under tests/pg/with_server.sh}
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
export LEDGER
. "$(dirname "$0")/../assert.sh"
count() { local n; n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
ARGS='{"order_id":"ord_1","amount_cents":6000}'
call() { # call SESSION CALL_ID [exec options]: one guarded refund
  local s=$1 c=$2
  shift 2
  "$IDEM" exec --log "$URL" --session "$s" --call "$c" --tool refund_payment \
    --args "$ARGS" --status "$STATUS" "$@" -- "$TOOL"
}

# ---- racing processes and threads ------------------------------------------
if "$RACE" "$URL" "$T/race.ledger" 8 4 "$ACTIONS"; then ok; else bad "8 x 4 race"; fi

# ---- the verbs with --log postgres:// ---------------------------------------
LEDGER=$T/verbs.ledger
: > "$LEDGER"
out=$(call v1 c1 --timeout 3000)
expect "exec exit" 0 "$?"
has "exec" "$out" '"status":"succeeded"'
out=$(call v1 c1 --timeout 3000)
has "replay" "$out" '"replayed":true'
expect "one refund" 1 "$(count)"
# the provider applies the refund and dies before answering: in doubt (no
# late result can come to change it while the verbs below look)
out=$(REFUND_MODE=crash "$IDEM" exec --log "$URL" --session v2 --call c2 \
  --tool refund_payment --args '{"order_id":"v2"}' -- "$TOOL")
expect "in doubt" 75 "$?"
out=$("$IDEM" ls --log "$URL" --json --session v1)
has "ls" "$out" '"call_id":"c1"'
out=$("$IDEM" show --log "$URL" v1 c1)
has "show" "$out" "succeeded"
out=$("$IDEM" stats --log "$URL" --json)
has "stats" "$out" '"in_doubt":1'
out=$("$IDEM" recover --log "$URL" --status "$STATUS" --json)
expect "recover exit" 0 "$?"
has "recover" "$out" '"applied":1'
out=$("$IDEM" show --log "$URL" --json v2 c2)
has "recovered" "$out" '"state":"succeeded"'
# recover --batch settles through change_many (one pipelined transaction)
for c in b1 b2 b3; do
  REFUND_MODE=crash "$IDEM" exec --log "$URL" --session v3 --call "$c" \
    --tool refund_payment --args "{\"order_id\":\"$c\"}" -- "$TOOL" > /dev/null
done
out=$("$IDEM" recover --log "$URL" --batch --status "sed 's/.*/applied/'" --json)
has "recover --batch" "$out" '"applied":3'
out=$("$IDEM" ls --log "$URL" --json --session v3)
expect "recover --batch settled" 3 "$(printf '%s\n' "$out" | grep -c '"state":"succeeded"')"
out=$("$IDEM" gc --log "$URL")
expect "gc exit" 0 "$?"
# a bad password: a clear error, and the password never printed
bad_url=$(printf '%s' "$URL" | sed 's#://idem:[^@]*@#://idem:wrongpw@#')
out=$("$IDEM" ls --log "$bad_url" 2>&1)
expect "bad password exit" 1 "$?"
has "bad password" "$out" "authentication failed"
case "$out" in *wrongpw*) bad "the password was printed: $out" ;; *) ok ;; esac
# credentials from PGPASSFILE instead of the URL
pw=$(printf '%s' "$URL" | sed 's#.*://idem:\([^@]*\)@.*#\1#')
hostport=$(printf '%s' "$URL" | sed 's#.*@\([^/]*\)/.*#\1#')
printf '%s:%s:*:idem:%s\n' "${hostport%:*}" "${hostport#*:}" "$pw" > "$T/pgpass"
chmod 600 "$T/pgpass"
out=$(PGPASSFILE=$T/pgpass "$IDEM" stats --log "postgres://idem@$hostport/idem?sslmode=disable" --json)
has "PGPASSFILE" "$out" '"succeeded":'

# ---- SIGKILL at every crash point --------------------------------------------
for point in after_pending_commit after_downstream_return before_outcome_commit \
  after_outcome_commit; do
  LEDGER=$T/$point.ledger
  : > "$LEDGER"
  IDEM_CRASH_AT=$point call "crash-$point" toolu_1 --timeout 3000 > /dev/null 2>&1
  expect "$point: killed" 137 "$?"
  # the resume: a definite answer, once applied, then replays.  A record
  # left pending by the killed process (same host, pid gone) is taken over
  # at once.
  out=$(call "crash-$point" toolu_1 --timeout 3000 2>&1)
  expect "$point: resume exit" 0 "$?"
  expect "$point: applied once" 1 "$(count)"
  out=$(call "crash-$point" toolu_1 --timeout 3000 2>&1)
  has "$point: replay" "$out" '"replayed":true'
done

# ---- the server restarted mid-run ---------------------------------------------
LEDGER=$T/restart.ledger
: > "$LEDGER"
N=24
for i in $(seq 1 $N); do
  ( ARGS="{\"order_id\":\"r$i\"}" REFUND_MODE=stall STALL=0.$((2 + RANDOM % 7)) \
      call restart "c$i" --timeout 10000 > "$T/r$i.out" 2>&1
    echo $? > "$T/r$i.code" ) &
  [ $((i % 6)) = 0 ] && sleep 0.2
  [ "$i" = 12 ] && "$IDEM_PG_CTL" restart
done
wait
# the restart did cut calls: some first attempts found no server
first_failed=$(cat "$T"/r*.code | grep -vc '^0$')
echo "restart: $first_failed of $N first attempts failed while the server was away"
# every call: answered, or re-issued until it is; each refund applied once
for i in $(seq 1 $N); do
  code=$(cat "$T/r$i.code")
  tries=0
  while [ "$code" != 0 ] && [ $tries -lt 20 ]; do
    sleep 0.5
    ARGS="{\"order_id\":\"r$i\"}" call restart "c$i" --timeout 10000 > "$T/r$i.out" 2>&1
    code=$?
    tries=$((tries + 1))
  done
  expect "restart c$i answered" 0 "$code"
done
expect "restart: each refund applied once" "$N" "$(count)"
expect "restart: no key twice" "$N" "$(sort -u "$LEDGER" | grep -c .)"
out=$("$IDEM" ls --log "$URL" --json --session restart)
expect "restart: every record there" "$N" "$(printf '%s\n' "$out" | grep -c '"state":"succeeded"')"

# ---- recover from another host id ------------------------------------------------
LEDGER=$T/hosts.ledger
: > "$LEDGER"
cat > "$T/policy.json" <<P
{"tools": {"refund_payment": {"class": "guarded", "timeout_ms": 8000, "retries": 0,
  "reconcile_timeout_ms": 500, "status": {"command": "$STATUS"}}}}
P
# a harness on host A starts a refund that stalls (its lease: 8 s of timeout,
# 0.5 s of reconciling and 10 s to spare); it is killed mid-call
IDEM_HOST_ID=host-a REFUND_MODE=stall STALL=30 "$IDEM" exec --log "$URL" \
  --policy "$T/policy.json" --session hosts --call h1 --tool refund_payment \
  --args '{"order_id":"h1"}' -- "$TOOL" > /dev/null 2>&1 &
hpid=$!
sleep 1
out=$("$IDEM" show --log "$URL" --json hosts h1)
has "host a: pending" "$out" '"state":"pending"'
has "host a: owner" "$out" '"owner":"host-a:'
# host B cannot tell whether host A's process lives: it waits for the lease
out=$(IDEM_HOST_ID=host-b "$IDEM" recover --log "$URL" --policy "$T/policy.json" --json)
has "host b: nothing taken" "$out" '"applied":0'
out=$("$IDEM" show --log "$URL" --json hosts h1)
has "host b left it pending" "$out" '"state":"pending"'
has "host b left it to host a" "$out" '"owner":"host-a:'
# kill host A's harness (its downstream call already applied the refund)
kids=$(pgrep -P "$hpid")
kill -9 "$hpid"
for k in $kids; do pkill -9 -P "$k" 2> /dev/null; kill -9 "$k" 2> /dev/null; done
wait "$hpid" 2> /dev/null
lease=$(printf '%s' "$out" | sed 's/.*"lease_until":\([0-9]*\).*/\1/')
now_ms=$(( $(date +%s%N) / 1000000 ))
sleep $(( (lease - now_ms) / 1000 + 2 ))
out=$(IDEM_HOST_ID=host-b "$IDEM" recover --log "$URL" --policy "$T/policy.json" --json)
has "host b after the lease" "$out" '"applied":1'
out=$("$IDEM" show --log "$URL" --json hosts h1)
has "host b settled it" "$out" '"state":"succeeded"'
expect "host a's refund applied once" 1 "$(count)"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

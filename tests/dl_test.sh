#!/bin/bash
# libpq and libcurl are loaded on first use (src/dl.c), not linked: neither
# is a NEEDED entry of the idem command or libidem.so, and where one is
# missing (IDEM_LIBPQ / IDEM_LIBCURL naming a file that does not exist plays
# a machine without the package) the feature that needs it fails with a
# message naming the package - no crash, no record, nothing sent - while
# everything else works.
#
#   bash tests/dl_test.sh IDEM LIBIDEM_SO PAYSIM
#
# The last line is `N passed, M failed`; exit 1 when anything failed.
set -u
IDEM=${1:?usage: dl_test.sh IDEM LIBIDEM_SO PAYSIM}
LIBIDEM=${2:?usage: dl_test.sh IDEM LIBIDEM_SO PAYSIM}
PAYSIM=${3:?usage: dl_test.sh IDEM LIBIDEM_SO PAYSIM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-dl-XXXXXX") || exit 1
SIM=
cleanup() {
  [ -n "$SIM" ] && kill "$SIM" 2>/dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "$(dirname "$0")/assert.sh"
# run CMD...: RC and ERR (stderr), stdout into OUT
run() {
  OUT=$("$@" 2>"$T/err")
  RC=$?
  ERR=$(cat "$T/err")
}
NOPQ=/nonexistent/libpq.so.5
NOCURL=/nonexistent/libcurl.so.4

# -- not linked: no NEEDED entry, and no symbol of either left undefined
for f in "$IDEM" "$LIBIDEM"; do
  needed=$(readelf -d "$f" | grep NEEDED)
  has "$f links something" "$needed" "libc.so"
  case "$needed" in
  *libpq* | *libcurl*) bad "$f: NEEDED libpq or libcurl: $needed" ;;
  *) ok ;;
  esac
  expect "$f: undefined PQ*/curl_* symbols" "" \
    "$(nm -D --undefined-only "$f" | grep -E ' (PQ|curl_)')"
done

# -- without libpq: a postgres:// log fails to open, saying what to install
for log in postgres://localhost/x 'postgresql://u:secret@localhost/x'; do
  run env IDEM_LIBPQ=$NOPQ "$IDEM" ls --log "$log"
  expect "no libpq: exit ($log)" 1 "$RC"
  has "no libpq: names the file" "$ERR" "needs libpq ($NOPQ: cannot open"
  has "no libpq: the package" "$ERR" "install the package libpq5"
  case "$ERR" in *secret*) bad "no libpq: the password printed: $ERR" ;; *) ok ;; esac
done
# a library without libpq's functions (libidem itself): the symbol named
run env IDEM_LIBPQ="$LIBIDEM" "$IDEM" ls --log postgres://localhost/x
expect "not libpq: exit" 1 "$RC"
has "not libpq: the symbol" "$ERR" "undefined symbol: PQ"
# the SQLite log never needs it
run env IDEM_LIBPQ=$NOPQ IDEM_LIBCURL=$NOCURL "$IDEM" ls --log "sqlite:$T/plain.db"
expect "sqlite without libpq and libcurl" 0 "$RC"

# -- without libcurl: idem call fails before its guard begins
"$PAYSIM" --ledger "$T/ledger.jsonl" --port 0 --port-file "$T/port" \
  2>>"$T/paysim.log" &
SIM=$!
disown "$SIM"
for _ in $(seq 200); do [ -s "$T/port" ] && break; sleep 0.05; done
[ -s "$T/port" ] || { echo "the simulator did not start" >&2; exit 1; }
export PAYSIM_URL=http://127.0.0.1:$(cat "$T/port")
cat >"$T/policy.json" <<'P'
{"tools": {
  "refund": {"class": "guarded", "timeout_ms": 2000, "retries": 0,
    "settle_ms": 100,
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds"},
    "status": {"tool": "list", "arguments": {"order_id": "{order_id}"}}},
  "list": {"class": "read_only",
    "http": {"url": "{$env:PAYSIM_URL}/v1/refunds?order_id={order_id}"}}
}}
P
LOG=sqlite:$T/log.db
call() {
  run env "$@" "$IDEM" call --policy "$T/policy.json" --log "$LOG" \
    --session s --call "$CALL" --tool refund \
    --args '{"order_id":"o1","amount_cents":500}'
}
ledger() { if [ -f "$T/ledger.jsonl" ]; then grep -c . "$T/ledger.jsonl"; else echo 0; fi; }
CALL=c1
call IDEM_LIBCURL=$NOCURL
expect "no libcurl: exit" 1 "$RC"
has "no libcurl: says so" "$ERR" "HTTP tools need libcurl ($NOCURL: cannot open"
has "no libcurl: the package" "$ERR" "install the package libcurl4"
has "no libcurl: nothing sent" "$ERR" "nothing was sent"
expect "no libcurl: no envelope" "" "$OUT"
expect "no libcurl: nothing reached the provider" 0 "$(ledger)"
run "$IDEM" show --log "$LOG" s c1
expect "no libcurl: no record" 1 "$RC"
# the same call, libcurl found: it runs (nothing of the failure was kept)
call IDEM_LIBCURL=
expect "with libcurl: exit" 0 "$RC"
has "with libcurl" "$OUT" '"status":"succeeded"'
expect "with libcurl: one refund" 1 "$(ledger)"

# -- a status check over HTTP without libcurl: the action stays in doubt,
# and recover says why; with libcurl it is settled
CALL=c2 # a later turn: the model was told c1 went through
call IDEM_TURN=turn_2 IDEM_CRASH_AT=after_pending_commit
expect "killed after the pending record" 137 "$RC"
run env IDEM_LIBCURL=$NOCURL "$IDEM" recover --log "$LOG" \
  --policy "$T/policy.json" --json
has "recover without libcurl: says so" "$ERR" \
  "status check list: HTTP tools need libcurl"
run "$IDEM" show --json --log "$LOG" s c2
has "recover without libcurl: in doubt" "$OUT" '"state":"in_doubt"'
# the killed process may have sent its request (SPEC §6a): "not applied"
# settles it only once settle_ms has passed since its deadline - or since
# its death was seen (the recover above), which came first
sleep 0.3
run "$IDEM" recover --log "$LOG" --policy "$T/policy.json" --json
expect "recover with libcurl: exit" 0 "$RC"
run "$IDEM" show --json --log "$LOG" s c2
has "recover with libcurl: settled" "$OUT" '"state":"not_applied"'
expect "still one refund" 1 "$(ledger)"

# -- idem demo is HTTP calls: it stops at once
run env IDEM_LIBCURL=$NOCURL "$IDEM" demo --paysim "$PAYSIM"
expect "demo without libcurl: exit" 1 "$RC"
has "demo without libcurl" "$ERR" "HTTP tools need libcurl"

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]

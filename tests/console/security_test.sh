#!/bin/bash
# idem serve's defences, with curl: the Host check, the token, the Origin
# and CSRF checks of POST /api/resolve (a refused write leaves the record
# as it was), the
# read-only mode, the headers of every response, the listening address,
# and the refusals at start (a log it cannot open, a short token).
#   tests/console/security_test.sh IDEM_BINARY
# (CTest: console_security.)  Needs curl.
set -u
IDEM=$1
HERE=$(cd "$(dirname "$0")/.." && pwd)
T=$(mktemp -d)
PIDS=()
cleanup() {
  local p
  for p in "${PIDS[@]}"; do kill "$p" 2> /dev/null; done
  wait 2> /dev/null
  rm -rf "$T"
}
trap cleanup EXIT
. "$HERE/assert.sh"
export IDEM_LOG=sqlite:$T/log.db
S=sec$$
CSP="default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'"
CSP="$CSP; connect-src 'self'; form-action 'none'; frame-ancestors 'none'"
CSP="$CSP; base-uri 'none'"

# an action in doubt: the command's own client gave up (exit 75)
for c in c1 c2; do
  "$IDEM" exec --session "$S" --call "$c" --tool refund_payment \
    --args "{\"order_id\":\"$c\"}" -- sh -c 'exit 75' > /dev/null
done
state() { "$IDEM" show --json "$S" "$1" | grep -o '"state":"[a-z_]*"'; }
expect "c1 in doubt" '"state":"in_doubt"' "$(state c1)"
before=$("$IDEM" show --json "$S" c1)

# start NAME [ARGS...]: idem serve in the background, its stdout in
# $T/NAME.out; URL, TOKEN and PORT from its lines
start() {
  local name=$1 i
  shift
  "$IDEM" serve "$@" > "$T/$name.out" 2> "$T/$name.err" &
  PIDS+=($!)
  PID=$!
  for i in $(seq 150); do
    grep -q '^idem serve: http://' "$T/$name.out" 2> /dev/null && break
    kill -0 "$PID" 2> /dev/null || break
    sleep 0.1
  done
  URL=$(sed -n 's|^idem serve: \(http://[^ ]*/\) (log .*|\1|p' "$T/$name.out")
  TOKEN=$(sed -n 's/^idem serve: token \(.*\)$/\1/p' "$T/$name.out")
  PORT=${URL##*:}
  PORT=${PORT%/}
  ORIGIN=${URL%/}
}

start rw --listen 127.0.0.1:0
has "the URL line" "$URL" "http://127.0.0.1:"
expect "a token of 32 hex chars" 1 \
  "$(printf '%s' "$TOKEN" | grep -cxE '[0-9a-f]{32}')"

# curl's status, headers in $T/h, body in $T/b
req() {
  curl -s -o "$T/b" -D "$T/h" -w '%{http_code}' "$@"
}
header() { grep -i "^$1:" "$T/h" | head -1 | sed 's/^[^:]*: *//' | tr -d '\r'; }

# csrf: the CSRF value of the server at $URL, and the headers that carry it
csrf() {
  code=$(req "${URL}api/info")
  CSRF=$(grep -o '"csrf":"[^"]*"' "$T/b" | cut -d'"' -f4)
  XC="X-Idem-CSRF: $CSRF"
  CK="Cookie: idem_csrf=$CSRF"
  OR="Origin: $ORIGIN"
}
csrf
expect "info" 200 "$code"
expect "info: a csrf value" yes "$([ -n "$CSRF" ] && echo yes)"
has "info: the cookie" "$(header set-cookie)" "idem_csrf=$CSRF"
has "info: SameSite=Strict" "$(header set-cookie)" "SameSite=Strict"
has "info: not read-only" "$(cat "$T/b")" '"read_only":false'

# body CALL VERDICT [RESULT]: $BODY, a verdict on CALL (RESULT: JSON text)
body() {
  local r=""
  [ $# -gt 2 ] && r=",\"result\":\"$(printf '%s' "$3" | sed 's/"/\\"/g')\""
  BODY="{\"session\":\"$S\",\"call_id\":\"$1\",\"verdict\":\"$2\""
  BODY="$BODY,\"reason\":\"seen\",\"by\":\"sec@test\"$r}"
}
body c1 applied '{"refund_id":"re_op"}'
# post [curl args...]: POST /api/resolve with $BODY and the given headers
post() {
  req -X POST -H 'Content-Type: application/json' --data "$BODY" "$@" \
    "${URL}api/resolve"
}
AUTH="Authorization: Bearer $TOKEN"

expect "no token: 401" 401 "$(post -H "$XC" -H "$CK" -H "$OR")"
has "no token: says so in JSON" "$(cat "$T/b")" '"error"'
expect "wrong token: 401" 401 \
  "$(post -H "Authorization: Bearer x${TOKEN:1}" -H "$XC" -H "$CK" -H "$OR")"
expect "not Bearer: 401" 401 \
  "$(post -H "Authorization: Basic $TOKEN" -H "$XC" -H "$CK" -H "$OR")"
expect "another Origin: 403" 403 \
  "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "Origin: http://evil.example")"
expect "another port: 403" 403 \
  "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "Origin: http://127.0.0.1:1")"
expect "https Origin: 403" 403 \
  "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "Origin: https://127.0.0.1:$PORT")"
expect "no CSRF header: 403" 403 "$(post -H "$AUTH" -H "$CK" -H "$OR")"
expect "no CSRF cookie: 403" 403 "$(post -H "$AUTH" -H "$XC" -H "$OR")"
expect "CSRF mismatch: 403" 403 \
  "$(post -H "$AUTH" -H "X-Idem-CSRF: x$CSRF" -H "$CK" -H "$OR")"
expect "CSRF both forged: 403" 403 \
  "$(post -H "$AUTH" -H "X-Idem-CSRF: forged" -H "Cookie: idem_csrf=forged" \
    -H "$OR")"
expect "GET /api/resolve: 405" 405 "$(req "${URL}api/resolve")"
# a name made to resolve to 127.0.0.1 (DNS rebinding) gets nothing
expect "another Host: 403" 403 \
  "$(req -H "Host: evil.example:$PORT" "${URL}api/doubt")"
hasnt "another Host: no record" "$(cat "$T/b")" "$S"
expect "another Host, a write: 403" 403 \
  "$(post -H "Host: evil.example:$PORT" -H "$AUTH" -H "$XC" -H "$CK")"
expect "localhost: 200" 200 \
  "$(req -H "Host: localhost:$PORT" "${URL}api/doubt")"
has "localhost: the records" "$(cat "$T/b")" "$S"
expect "refused writes changed nothing" "$before" \
  "$("$IDEM" show --json "$S" c1)"

# bad bodies: 400, nothing changes
body c1 maybe
expect "bad verdict: 400" 400 "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"
BODY='{"session":'
expect "not JSON: 400" 400 "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"
body c1 applied '{bad'
expect "result not JSON: 400" 400 \
  "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"
expect "bad bodies changed nothing" "$before" "$("$IDEM" show --json "$S" c1)"
body nosuch applied
expect "no such record: 404" 404 "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"

# the verdict, with and without an Origin (curl sends none), then again
body c1 applied '{"refund_id":"re_op"}'
expect "the verdict: 200" 200 "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"
has "the verdict: ok" "$(cat "$T/b")" '"ok":true'
expect "c1 succeeded" '"state":"succeeded"' "$(state c1)"
has "by whom" "$("$IDEM" show --json "$S" c1)" '"resolved_by":"sec@test'
has "its result" "$("$IDEM" show --json "$S" c1)" '"result":{"refund_id":"re_op"}'
expect "again: 409" 409 "$(post -H "$AUTH" -H "$XC" -H "$CK" -H "$OR")"
has "again: no longer in doubt" "$(cat "$T/b")" "no longer in doubt"
body c2 not_applied
expect "no Origin header: 200" 200 "$(post -H "$AUTH" -H "$XC" -H "$CK")"
expect "c2 not applied" '"state":"not_applied"' "$(state c2)"

# the headers of every response, whatever its status
for p in "" app.js style.css metrics api/info api/doubt api/stats \
  "api/record?session=$S&call_id=c1" "api/record?session=$S&call_id=no" \
  api/resolve nosuch; do
  code=$(req "$URL$p")
  expect "/$p: the CSP" "$CSP" "$(header content-security-policy)"
  expect "/$p: nosniff" nosniff "$(header x-content-type-options)"
  expect "/$p: no referrer" no-referrer "$(header referrer-policy)"
  expect "/$p: no-store" no-store "$(header cache-control)"
done
expect "an unknown path: 404" 404 "$code"
code=$(post -H "$XC" -H "$CK" -H "$OR")
expect "401: the CSP" "$CSP" "$(header content-security-policy)"
# the page has no inline script or style
code=$(req "$URL")
hasnt "no inline script" \
  "$(tr -d '\n' < "$T/b" | grep -o '<script[^>]*>[^<]')" "<script"
hasnt "no inline style" "$(cat "$T/b")" "<style"
hasnt "no style attribute" "$(cat "$T/b")" " style="

# 127.0.0.1 only: no listener of its port on any other address
listeners() { # the local addresses listening on port $1 (hex)
  local hp
  hp=$(printf '%04X' "$1")
  awk -v p=":$hp" '$4 == "0A" && substr($2, length($2) - 4) == p { print $2 }' \
    /proc/net/tcp /proc/net/tcp6 2> /dev/null
}
expect "bound to 127.0.0.1 only" "0100007F:$(printf '%04X' "$PORT")" \
  "$(listeners "$PORT")"
# the default address (port 8787, unless something else holds it)
if [ -z "$(listeners 8787)" ]; then
  start dflt
  if [ -n "$URL" ]; then
    has "default: 127.0.0.1:8787" "$URL" "http://127.0.0.1:8787/"
    expect "default: bound to 127.0.0.1 only" "0100007F:2253" \
      "$(listeners 8787)"
    kill "$PID"
    wait "$PID"
    expect "default: exit 0 on SIGTERM" 0 "$?"
  elif grep -qi "in use" "$T/dflt.err"; then
    echo "note: port 8787 was taken meanwhile; the default is not checked"
  else
    bad "default: did not start: $(cat "$T/dflt.err")"
  fi
else
  echo "note: port 8787 is taken; the default address is not checked"
fi

# read-only: no token, no write, info says so
start ro --read-only --listen 127.0.0.1:0
csrf
expect "read-only: no token line" "" "$TOKEN"
expect "read-only: no line names a token" 0 "$(grep -ci token "$T/ro.out")"
expect "read-only: POST 404" 404 "$(post -H "$XC" -H "$CK" -H "$OR")"
expect "read-only: GET 404" 404 "$(req "${URL}api/resolve")"
req "${URL}api/info" > /dev/null
has "read-only: info" "$(cat "$T/b")" '"read_only":true'
kill -INT "$PID"
wait "$PID"
expect "read-only: exit 0 on SIGINT" 0 "$?"

# IDEM_SERVE_TOKEN: at least 16 characters
IDEM_SERVE_TOKEN=short0123456789 "$IDEM" serve --listen 127.0.0.1:0 \
  > "$T/short.out" 2> "$T/short.err" &
PIDS+=($!)
wait $!
expect "a 15-char token: exit 2" 2 "$?"
# (a usage error: its line, then the usage)
has "a 15-char token: says so first" "$(head -1 "$T/short.err")" \
  "idem: IDEM_SERVE_TOKEN"
expect "a 15-char token: nothing served" "" "$(cat "$T/short.out")"
# the token line shows it, or says where it came from, never another one
IDEM_SERVE_TOKEN=a-token-of-16-ch start tok --listen 127.0.0.1:0
case "$TOKEN" in
  a-token-of-16-ch | "from IDEM_SERVE_TOKEN") ok ;;
  *) bad "a 16-char token: the token line says '$TOKEN'" ;;
esac
csrf
expect "a 16-char token opens the door (c2 is settled: 409)" 409 \
  "$(post -H "Authorization: Bearer a-token-of-16-ch" -H "$XC" -H "$CK")"
expect "... and no other does" 401 \
  "$(post -H "Authorization: Bearer a-token-of-16-cx" -H "$XC" -H "$CK")"
kill "$PID"

# a log it cannot open: one line, exit 1
"$IDEM" serve --log sqlite:/nonexistent/dir/x.db --listen 127.0.0.1:0 \
  > "$T/bad.out" 2> "$T/bad.err" &
PIDS+=($!)
wait $!
expect "unopenable log: exit 1" 1 "$?"
expect "unopenable log: one line" 1 "$(grep -c . "$T/bad.err")"
has "unopenable log: idem: ..." "$(cat "$T/bad.err")" "idem: "
expect "unopenable log: nothing on stdout" "" "$(cat "$T/bad.out")"
summary

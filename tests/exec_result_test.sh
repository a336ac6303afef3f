#!/bin/bash
# `idem exec` with a result larger than the limit on arguments (1 MiB): the
# command's output comes back whole on the first answer and on the replay,
# JSON and text alike, and the command runs once.
#   tests/exec_result_test.sh IDEM_BINARY
set -u
IDEM=$1
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
. "$(dirname "$0")/assert.sh"
export LEDGER=$T/ledger
: > "$LEDGER"
# 2 MiB of x, as a JSON object or as plain text
cat > "$T/export.sh" <<'S'
#!/bin/sh
echo "$IDEM_KEY" >> "$LEDGER"
[ "$1" = json ] && printf '{"blob":"'
head -c 2097152 /dev/zero | tr '\0' x
[ "$1" = json ] && printf '"}'
exit 0
S
chmod +x "$T/export.sh"
applied() { local n; n=$(grep -c . "$LEDGER" 2>/dev/null); echo "${n:-0}"; }
run() { # run KIND: envelope in $out, its result member in $res
  out=$("$IDEM" exec --log "sqlite:$T/log.db" --session "s_$1" --call c1 \
    --tool export --args '{}' -- "$T/export.sh" "$1")
  code=$?
  res=${out#*\"result\":}
  res=${res%\}} # the envelope's own closing brace
}
x=$(head -c 2097152 /dev/zero | tr '\0' x)
for kind in json text; do
  if [ "$kind" = json ]; then want="{\"blob\":\"$x\"}"; else want="\"$x\""; fi
  run "$kind"
  expect "$kind: exit" 0 "$code"
  has "$kind: first" "${out:0:200}" '"status":"succeeded"'
  has "$kind: first" "${out:0:200}" '"replayed":false'
  expect "$kind: first answer's result (bytes)" "${#want}" "${#res}"
  [ "$res" = "$want" ] && ok || bad "$kind: first answer's result differs"
  run "$kind"
  expect "$kind: replay exit" 0 "$code"
  has "$kind: replay" "${out:0:200}" '"replayed":true'
  expect "$kind: replay's result (bytes)" "${#want}" "${#res}"
  [ "$res" = "$want" ] && ok || bad "$kind: replay's result differs"
done
expect "each ran once" 2 "$(applied)"
summary

#!/usr/bin/env bash
# policy_cli_test.sh - `idem policy check` and `idem policy explain` as a user
# sees them (SPEC §8, §9).
#
#   bash tests/policy_cli_test.sh PATH_TO_IDEM
#
# Checks the exit codes (0 ok, 1 unreadable file, 2 usage, 65 invalid
# policy), the `FILE: ok (N tools: ...)` line, the one-line
# `idem: FILE: field: what` errors (the file named once, also for syntax
# errors), and that explain says the key facts in lines of at most 76
# columns.  The last line is `N passed, M failed`; the exit status is 1 when
# anything failed.

set -u
IDEM=${1:?usage: policy_cli_test.sh PATH_TO_IDEM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-policy-cli-XXXXXX") || exit 1
trap 'chmod -R u+rwx "$T" 2>/dev/null; rm -rf "$T"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  printf 'FAIL: %s\n' "$*" >&2
}

# run ARGS...: run idem; RC, $T/out and $T/err hold the result.
run() {
  "$IDEM" "$@" </dev/null >"$T/out" 2>"$T/err"
  RC=$?
}

show_err() { head -c 300 "$T/err" | head -3 | sed 's/^/      stderr: /' >&2; }

expect_rc() { # WANT WHAT
  if [ "$RC" -eq "$1" ]; then ok; else
    bad "$2: exit $RC, want $1"
    show_err
  fi
}

expect_out() { # TEXT WHAT: stdout is TEXT and a newline
  printf '%s\n' "$1" >"$T/want"
  if cmp -s "$T/out" "$T/want"; then ok; else
    bad "$2: stdout '$(head -c 300 "$T/out")', want '$1'"
  fi
}

expect_err_line() { # TEXT WHAT: the first line of stderr is TEXT
  if [ "$(head -n 1 "$T/err")" = "$1" ]; then ok; else
    bad "$2: stderr '$(head -n 1 "$T/err")', want '$1'"
  fi
}

expect_err_re() { # ERE WHAT: the first line of stderr matches ERE
  if head -n 1 "$T/err" | grep -Eq -- "$1"; then ok; else
    bad "$2: stderr '$(head -n 1 "$T/err")' does not match /$1/"
  fi
}

expect_no_out() { # WHAT
  if [ ! -s "$T/out" ]; then ok; else bad "$1: unexpected stdout '$(head -c 200 "$T/out")'"; fi
}

expect_usage() { # WHAT: stderr is one idem: line, then the usage text
  if [ "$(sed -n 2p "$T/err")" = "usage: idem policy check FILE" ]; then ok; else
    bad "$1: no usage after the error line"
    show_err
  fi
}

expect_said() { # TEXT WHAT: stdout, its lines joined, contains TEXT
  if tr '\n' ' ' <"$T/out" | tr -s ' ' | grep -Fq -- "$1"; then ok; else
    bad "$2: no '$1' in the explanation"
  fi
}

# ---- the policies --------------------------------------------------------------
cat >"$T/spec.json" <<'JSON'
{
  "unknown_tools": "refuse",
  "tools": {
    "refund_payment": {
      "class": "guarded", "timeout_ms": 8000, "retries": 2,
      "provider_dedupes": true, "provider_key_ttl_s": 86400,
      "key_arg": "idempotency_key", "key_max_len": 255,
      "fence": ["order_id"], "fence_scope": "session",
      "status": {"tool": "get_refund_status", "arguments": {"order_id": "{order_id}"},
                 "applied_when": "key_present"},
      "retention_s": 604800
    },
    "get_refund_status": {"class": "read_only"}
  }
}
JSON
printf '{"tools": {}}\n' >"$T/empty.json"
printf '{"unknown_tools": "pass", "tools": {"lookup": {"class": "idempotent"}}}\n' >"$T/one.json"
printf '{"tools": {"b c": {"class": "read_only"}, "a,b": {"class": "read_only"}}}\n' >"$T/odd.json"
printf '{"tools": {"refund": {"class": "guarded", "timeoutms": 5000}}}\n' >"$T/typo.json"
printf '{"tools": {\n  "refund": {"class": "guarded",}\n}}\n' >"$T/syntax.json"
printf '{"tools": {"refund": {"class": "guarded", "status": {"tool": "refund"}}}}\n' >"$T/self.json"

# ---- check -----------------------------------------------------------------------
run policy check "$T/spec.json"
expect_rc 0 "check a valid policy"
expect_out "$T/spec.json: ok (2 tools: get_refund_status, refund_payment)" "check a valid policy"
if [ ! -s "$T/err" ]; then ok; else bad "check a valid policy: stderr '$(head -c 200 "$T/err")'"; fi

run policy check "$T/empty.json"
expect_rc 0 "check an empty policy"
expect_out "$T/empty.json: ok (0 tools)" "check an empty policy"

run policy check "$T/one.json"
expect_rc 0 "check a one-tool policy"
expect_out "$T/one.json: ok (1 tool: lookup)" "check a one-tool policy"

run policy check "$T/odd.json"
expect_rc 0 "check odd names"
expect_out "$T/odd.json: ok (2 tools: \"a,b\", \"b c\")" "check odd names: quoted"

run policy check "$T/typo.json"
expect_rc 65 "check an unknown field"
expect_err_line "idem: $T/typo.json: tools.refund.timeoutms: unknown field (did you mean timeout_ms?)" \
  "check an unknown field"
expect_no_out "check an unknown field"

run policy check "$T/syntax.json"
expect_rc 65 "check a syntax error"
expect_err_line "idem: $T/syntax.json: line 2, column 33: string or '}' expected near '}'" \
  "check a syntax error: file, line and column, once"

run policy check "$T/self.json"
expect_rc 65 "check a status tool that is the tool itself"
expect_err_re "^idem: .*/self\.json: tools\.refund\.status\.tool: is the tool itself" \
  "check a status tool that is the tool itself"

# a status query that sends the key: the bare key_present would count the
# query echoed back, so check refuses it and says what to write
printf '{"tools": {"refund": {"class": "guarded", "status": {"tool": "find",
  "arguments": {"client_ref": "{$key}"}}}, "find": {"class": "read_only"}}}\n' >"$T/echo.json"
run policy check "$T/echo.json"
expect_rc 65 "check key_present with the key sent"
expect_err_re "^idem: .*/echo\.json: tools\.refund\.status\.applied_when: the status request sends the key, .*\"key_present\": true\}$" \
  "check key_present with the key sent"

# names that differ only in case or Unicode normalization: valid, with a
# warning for each pair on stderr, naming both
printf '{"tools": {"Refund": {"class": "guarded"}, "refund": {"class": "read_only"},
  "caf\xc3\xa9": {"class": "read_only"}, "cafe\xcc\x81": {"class": "guarded"}}}\n' >"$T/fold.json"
run policy check "$T/fold.json"
expect_rc 0 "check names equal after folding"
if [ "$(grep -c ': warning: ' "$T/err")" = 2 ]; then ok; else
  bad "check names equal after folding: want 2 warnings, stderr '$(cat "$T/err")'"
fi
expect_err_line "idem: $T/fold.json: warning: tools: \"cafe$(printf '\xcc\x81')\" and \"caf$(printf '\xc3\xa9')\" (\"cafe\\u0301\" and \"caf\\u00e9\") differ only in case or Unicode normalization (NFC); idem tells them apart, so each has its own rule - name each tool once" \
  "check names equal after NFC"
if grep -q 'warning: tools: "Refund" and "refund" differ only in case' "$T/err"; then ok; else
  bad "check names equal after case folding: stderr '$(cat "$T/err")'"
fi

# a 100 KB tool name is echoed cut, with its length: in check's report, in
# a warning, in explain and in an error
long=$(head -c 100000 /dev/zero | tr '\0' a)
printf '{"tools": {"%s": {"class": "guarded"}, "A%s": {"class": "guarded"}}}\n' \
  "$long" "${long:1}" >"$T/long.json"
run policy check "$T/long.json"
expect_rc 0 "check a 100 KB name"
cut=$(head -c 64 /dev/zero | tr '\0' a)
expect_out "$T/long.json: ok (2 tools: \"A${cut:1}...\" (100000 bytes), \"$cut...\" (100000 bytes))" \
  "check a 100 KB name: cut"
if [ "$(wc -c <"$T/err")" -lt 600 ] && grep -q '\.\.\." (100000 bytes) differ only' "$T/err"; then ok; else
  bad "check a 100 KB name: the warning is $(wc -c <"$T/err") bytes"
fi
run policy explain "$T/long.json" "$long"
expect_rc 0 "explain a 100 KB name"
if [ "$(wc -c <"$T/out")" -lt 4000 ] && grep -q '(100000 bytes)' "$T/out"; then ok; else
  bad "explain a 100 KB name: $(wc -c <"$T/out") bytes"
fi
printf '{"tools": {"%s": {"class": "guarded", "retries": "x"}}}\n' "$long" >"$T/long_bad.json"
run policy check "$T/long_bad.json"
expect_rc 65 "check a bad rule of a 100 KB name"
expect_err_re '^idem: .*long_bad\.json: tools\["a+\.\.\." \(100000 bytes\)\]\.retries: expected an integer' \
  "check a bad rule of a 100 KB name: cut"
if [ "$(wc -c <"$T/err")" -lt 400 ]; then ok; else bad "check a bad rule of a 100 KB name: $(wc -c <"$T/err") bytes"; fi

# a retention shorter than an attempt may take to land: accepted, with a
# warning naming the field; a tool that is not guarded, or whose retention
# is long enough, draws none
printf '%s\n' '{"tools": {"refund": {"class": "guarded", "timeout_ms": 30000,' \
  '"settle_ms": 1000, "retention_s": 1}, "ok": {"class": "guarded",' \
  '"timeout_ms": 2000, "settle_ms": 1000, "retention_s": 3},' \
  '"peek": {"class": "read_only", "timeout_ms": 30000}}}' >"$T/short.json"
run policy check "$T/short.json"
expect_rc 0 "check a retention shorter than timeout + settle"
expect_out "$T/short.json: ok (3 tools: ok, peek, refund)" \
  "check a retention shorter than timeout + settle"
expect_err_line "idem: $T/short.json: warning: tools.refund.retention_s: 1 s is shorter than timeout_ms + settle_ms (31000 ms), the time an attempt may take to land: a call retried after waiting that long may find its record deleted by idem gc, and run again" \
  "check a retention shorter than timeout + settle: warned"
if [ "$(wc -l <"$T/err")" -eq 1 ]; then ok; else
  bad "check a retention shorter than timeout + settle: $(wc -l <"$T/err") warnings, want 1"
fi

run policy check "$T/missing.json"
expect_rc 1 "check a missing file"
expect_err_line "idem: $T/missing.json: No such file or directory" "check a missing file"

run policy check "$T"
expect_rc 1 "check a directory"
expect_err_re "^idem: .*: Is a directory$" "check a directory"

# An unreadable file.  File modes bind only a user the kernel holds to them,
# and CI runs as root: then idem runs as nobody (65534, setpriv) from a copy
# that user may execute, so the case is never skipped.
cp "$T/spec.json" "$T/locked.json"
chmod 000 "$T/locked.json"
if [ "$(id -u)" -eq 0 ]; then
  mkdir "$T/nobody" && cp "$IDEM" "$T/nobody/idem" &&
    chmod 711 "$T" && chmod 755 "$T/nobody" || bad "a copy of idem for nobody"
  setpriv --reuid=65534 --regid=65534 --clear-groups "$T/nobody/idem" \
    policy check "$T/locked.json" </dev/null >"$T/out" 2>"$T/err"
  RC=$?
else
  run policy check "$T/locked.json"
fi
expect_rc 1 "check an unreadable file"
expect_err_re "^idem: .*locked\.json: Permission denied$" "check an unreadable file"

# ---- explain -----------------------------------------------------------------------
run policy explain "$T/spec.json" refund_payment
expect_rc 0 "explain a guarded tool"
for said in "refund_payment is guarded" "the same session, the same tool-call id" \
  'leaving out the argument "idempotency_key"' 'the same value of "order_id"' \
  "8000 ms to answer" "outcome unknown" "status tool get_refund_status" \
  "Reconciling gives up after 8000 ms" "604800 s (7 days)" \
  '"order_id" (compared by text' '1001 and "1001" are one value' \
  'null, "null" and a missing argument'; do
  expect_said "$said" "explain refund_payment"
done
long=$(awk 'length($0) > 76' "$T/out" | head -1)
if [ -z "$long" ]; then ok; else bad "explain: a line longer than 76 columns: '$long'"; fi
if grep -q '^$' "$T/out"; then ok; else bad "explain: no blank line between paragraphs"; fi

expect_said "a result with isError true means unknown (the default)" "explain refund_payment"
run policy explain "$(dirname "$0")/mcp/wall_policy.json" is_error_rejected
expect_said 'isError true means rejected: nothing applied, and the call is answered failed (on_is_error "rejected")' \
  "explain on_is_error"

run policy explain "$T/spec.json" get_refund_status
expect_rc 0 "explain a read-only tool"
expect_said "get_refund_status is read-only" "explain get_refund_status"
expect_said "status check of refund_payment" "explain get_refund_status"

run policy explain "$T/spec.json" delete_account
expect_rc 0 "explain an unknown tool"
expect_said "answered refused, and nothing runs" "explain an unknown tool"

run policy explain "$T/one.json" lookup
expect_rc 0 "explain an idempotent tool"
expect_said "lookup is idempotent" "explain an idempotent tool"

run policy explain "$T/typo.json" refund
expect_rc 65 "explain under an invalid policy"
expect_err_re "^idem: .*typo\.json: tools\.refund\.timeoutms: unknown field" "explain under an invalid policy"
expect_no_out "explain under an invalid policy"

run policy explain "$T/missing.json" refund
expect_rc 1 "explain under a missing file"

# ---- usage ---------------------------------------------------------------------------
run policy
expect_rc 2 "policy without a sub-verb"
expect_err_line "idem: policy needs a sub-verb: check or explain" "policy without a sub-verb"
expect_usage "policy without a sub-verb"

run policy verify "$T/spec.json"
expect_rc 2 "an unknown sub-verb"
expect_err_re "^idem: no sub-verb 'verify' for policy" "an unknown sub-verb"
expect_usage "an unknown sub-verb"

run policy check
expect_rc 2 "check without FILE"
expect_err_re "^idem: policy check takes one FILE" "check without FILE"

run policy check "$T/spec.json" "$T/one.json"
expect_rc 2 "check with two files"

run policy explain "$T/spec.json"
expect_rc 2 "explain without TOOL"
expect_err_re "^idem: policy explain takes FILE and TOOL" "explain without TOOL"

run policy explain "$T/spec.json" ""
expect_rc 2 "explain an empty TOOL"

run policy check --bogus "$T/spec.json"
expect_rc 2 "an unknown option"
expect_err_line "idem: no option '--bogus' for policy" "an unknown option"
expect_usage "an unknown option"

run policy --help
expect_rc 0 "policy --help"
if grep -q '^usage: idem policy check FILE' "$T/out" &&
  grep -q 'idem policy explain FILE TOOL' "$T/out"; then ok; else bad "policy --help: usage on stdout"; fi

run help policy
expect_rc 0 "idem help policy"
if grep -q 'idem policy explain FILE TOOL' "$T/out"; then ok; else bad "idem help policy"; fi

run help
if grep -Eq '^  policy +check a policy file' "$T/out"; then ok; else bad "idem help lists policy"; fi

printf '%d passed, %d failed\n' "$pass" "$fail"
[ "$fail" -eq 0 ]

#!/usr/bin/env bash
# cli_test.sh - the idem command line, as a user sees it (SPEC §9).
#
#   bash tests/cli_test.sh PATH_TO_IDEM
#
# Checks exit codes (0 ok, 1 failure, 2 usage, 65 bad data), the one-line
# `idem: what (and where)` errors, `canon` and `key` on files, stdin and
# --lines, and the --max-depth / --max-bytes limits, including inputs that
# must be refused without a crash (a 2 MiB line, 100,000-deep nesting).
# Each check prints what failed with both sides; the last line is
# `N passed, M failed`, and the exit status is 1 when anything failed.
# Needs bash, coreutils and (for the --json check) python3.

set -u
IDEM=${1:?usage: cli_test.sh PATH_TO_IDEM}
T=$(mktemp -d "${TMPDIR:-/tmp}/idem-cli-XXXXXX") || exit 1
trap 'rm -rf "$T"' EXIT
pass=0
fail=0

ok() { pass=$((pass + 1)); }
bad() {
  fail=$((fail + 1))
  printf 'FAIL: %s\n' "$*" >&2
}

# run [--in FILE] ARGS...: run idem; RC, $T/out and $T/err hold the result.
run() {
  local in=/dev/null
  if [ "$1" = --in ]; then
    in=$2
    shift 2
  fi
  "$IDEM" "$@" <"$in" >"$T/out" 2>"$T/err"
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
    bad "$2: stdout '$(head -c 200 "$T/out")', want '$1'"
  fi
}

expect_out_file() { # FILE WHAT: stdout is byte-identical to FILE
  if cmp -s "$T/out" "$1"; then ok; else
    bad "$2: stdout ($(wc -c <"$T/out") bytes) differs from $1 ($(wc -c <"$1") bytes)"
  fi
}

expect_err() { # ERE WHAT: the first line of stderr matches ERE
  local first
  first=$(head -n 1 "$T/err")
  if printf '%s\n' "$first" | grep -Eq -- "$1"; then ok; else
    bad "$2: first stderr line '$first' does not match /$1/"
  fi
}

expect_err_lines() { # N WHAT: stderr holds exactly N lines
  local n
  n=$(wc -l <"$T/err")
  if [ "$n" -eq "$1" ]; then ok; else
    bad "$2: $n lines on stderr, want $1"
    show_err
  fi
}

expect_no_crash() { # WHAT
  if [ "$RC" -lt 128 ]; then ok; else bad "$1: killed by signal $((RC - 128))"; fi
}

# ---- version and help -------------------------------------------------------

run --version
expect_rc 0 "idem --version"
expect_err '^$' "idem --version prints nothing on stderr"
if grep -Eqx 'idem [0-9]+\.[0-9]+\.[0-9]+' "$T/out" && [ "$(wc -l <"$T/out")" -eq 1 ]; then
  ok
else
  bad "idem --version prints '$(cat "$T/out")', want 'idem X.Y.Z'"
fi

run help
expect_rc 0 "idem help"
for v in canon key bench; do
  if grep -q "^  $v " "$T/out"; then ok; else bad "idem help lists $v"; fi
done
for v in canon key; do
  run help $v
  expect_rc 0 "idem help $v"
  if grep -q "^usage: idem $v" "$T/out"; then ok; else bad "idem help $v shows its usage"; fi
  run $v --help
  expect_rc 0 "idem $v --help"
done
run help nosuch
expect_rc 2 "idem help nosuch"
expect_err '^idem: ' "idem help nosuch: error first"

# ---- usage errors: exit 2 and a one-line `idem: ...` first -----------------

usage_error() { # WHAT ARGS...
  local what=$1
  shift
  run "$@"
  expect_rc 2 "$what"
  expect_err '^idem: .+' "$what: one-line 'idem: ...' error first"
}
usage_error "unknown verb" frobnicate
usage_error "unknown verb that looks like an option" --frobnicate
usage_error "canon: unknown option" canon --bogus
usage_error "key: unknown option" key --bogus --session s --call c --tool t '{}'
usage_error "canon: --max-depth needs a value" canon --max-depth
usage_error "canon: --max-depth 0" canon --max-depth 0
usage_error "canon: --max-depth abc" canon --max-depth abc
usage_error "canon: --max-bytes -1" canon --max-bytes -1
usage_error "canon: --max-depth beyond its range" canon --max-depth 99999999999
usage_error "canon: two files" canon a b
usage_error "canon: --lines with a file" canon --lines "$T/x"
usage_error "key: --key-max-len below 66" key --key-max-len 10 --session s --call c --tool t '{}'
usage_error "key: --lines with --session" key --lines --session s
usage_error "key: too many arguments" key --session s --call c --tool t '{}' '{}'
usage_error "bench: --only nope" bench --only nope
usage_error "bench: an argument" bench extra
usage_error "bench: unknown option" bench --bogus
usage_error "bench: --dir needs a value" bench --dir

# ---- canon: file, stdin, errors ---------------------------------------------

printf '{"b":[1,2.50,"x\\u00e9"],"a":{"d":1e21,"c":-0,"e":6000.0}}' >"$T/doc.json"
CANON='{"a":{"c":0,"d":1e+21,"e":6000},"b":[1,2.5,"xé"]}'
run canon "$T/doc.json"
expect_rc 0 "canon FILE"
expect_out "$CANON" "canon FILE"
run --in "$T/doc.json" canon
expect_rc 0 "canon < FILE"
expect_out "$CANON" "canon < FILE"
run --in "$T/doc.json" canon -
expect_rc 0 "canon - < FILE"
expect_out "$CANON" "canon - < FILE"

run canon "$T/no-such-file.json"
expect_rc 1 "canon: a missing file"
expect_err "^idem: $T/no-such-file.json: No such file or directory$" "canon: a missing file"
expect_err_lines 1 "canon: a missing file"

bad_json() { # FILE-CONTENT ERE-OF-THE-REASON WHAT
  printf '%s' "$1" >"$T/bad.json"
  run canon "$T/bad.json"
  expect_rc 65 "canon: $3"
  expect_err "^idem: $T/bad.json: .*$2.* at byte [0-9]+$" "canon: $3"
  expect_err_lines 1 "canon: $3"
  if [ -s "$T/out" ]; then bad "canon: $3: prints '$(head -c 100 "$T/out")'"; else ok; fi
}
bad_json '{"a":1,}' 'member name' "a trailing comma"
bad_json '{"a":1} x' 'after the JSON text' "trailing bytes"
bad_json '{"a":1,"a":2}' 'duplicate' "a duplicate member"
bad_json '[9007199254740993]' '2\^53' "an integer beyond 2^53"
bad_json '"\ud800"' 'surrogate' "a lone surrogate"
bad_json $'\xef\xbb\xbf{}' 'byte-order mark' "a BOM"
bad_json $'"\xc3"' 'UTF-8' "invalid UTF-8"
bad_json '' '' "an empty file"
printf '{"a":1,}' >"$T/bad.json"
run canon "$T/bad.json"
expect_err "^idem: $T/bad.json: .* at byte 7$" "canon: the offset of a trailing comma"
run --in "$T/bad.json" canon
expect_rc 65 "canon: bad JSON on stdin"
expect_err '^idem: stdin: .* at byte 7$' "canon: bad JSON on stdin"

# ---- canon --lines ------------------------------------------------------------

printf '%s\n' '{"b":1,"a":2}' '{"a":' '[1, 2.0 ,3e0]' 'nope' '' '"é"' >"$T/lines.in"
printf '{"z":null,"y":[true,false]}' >>"$T/lines.in" # no final newline
printf '%s\n' '{"a":2,"b":1}' '' '[1,2,3]' '' '' '"é"' '{"y":[true,false],"z":null}' >"$T/lines.want"
run --in "$T/lines.in" canon --lines
expect_rc 65 "canon --lines with bad lines"
expect_out_file "$T/lines.want" "canon --lines: bad lines are empty lines"
if [ "$(wc -l <"$T/out")" -eq 7 ]; then ok; else bad "canon --lines: $(wc -l <"$T/out") output lines for 7 input lines"; fi
expect_err_lines 3 "canon --lines: one error per bad line"
for n in 2 4 5; do
  if grep -Eq "^idem: line $n: .+ at byte [0-9]+$" "$T/err"; then ok; else
    bad "canon --lines: no 'idem: line $n: ... at byte N' error"
    show_err
  fi
done
head -n 1 "$T/lines.in" >"$T/one.in"
run --in "$T/one.in" canon --lines
expect_rc 0 "canon --lines, all good"
expect_out '{"a":2,"b":1}' "canon --lines, all good"

# ---- limits ---------------------------------------------------------------------

printf '[[[1]]]' >"$T/d3.json"
printf '[[[[1]]]]' >"$T/d4.json"
run canon --max-depth 3 "$T/d3.json"
expect_rc 0 "--max-depth 3 accepts depth 3"
expect_out '[[[1]]]' "--max-depth 3 accepts depth 3"
run canon --max-depth 3 "$T/d4.json"
expect_rc 65 "--max-depth 3 refuses depth 4"
expect_err 'nesting.* at byte [0-9]+$' "--max-depth 3 refuses depth 4"
run canon --max-depth 4 "$T/d4.json"
expect_rc 0 "--max-depth 4 accepts depth 4"
printf '%*s' 128 '' | tr ' ' '[' >"$T/d128.json"
printf '%*s' 128 '' | tr ' ' ']' >>"$T/d128.json"
run canon "$T/d128.json"
expect_rc 0 "the default depth accepts 128"
printf '[%s' "$(cat "$T/d128.json")]" >"$T/d129.json"
run canon "$T/d129.json"
expect_rc 65 "the default depth refuses 129"

# 100,000 levels: refused by default, never a stack overflow.
head -c 100000 /dev/zero | tr '\0' '[' >"$T/deep.json"
head -c 100000 /dev/zero | tr '\0' ']' >>"$T/deep.json"
run canon "$T/deep.json"
expect_no_crash "canon: 100,000-deep nesting"
expect_rc 65 "canon: 100,000-deep nesting is refused"
expect_err 'nesting.* at byte 128$' "canon: 100,000-deep nesting"
run --in "$T/deep.json" canon --lines
expect_rc 65 "canon --lines: 100,000-deep nesting is refused"
run --in "$T/deep.json" key --session s --call c --tool t
expect_no_crash "key: 100,000-deep arguments"
expect_rc 65 "key: 100,000-deep arguments are refused"
printf '\n' >>"$T/deep.json"
run canon --max-depth 1000000 "$T/deep.json"
expect_no_crash "canon --max-depth 1000000: 100,000-deep nesting"
expect_rc 0 "canon --max-depth 1000000 accepts 100,000-deep nesting"
expect_out_file "$T/deep.json" "canon --max-depth 1000000: 100,000-deep output"

# A 2 MiB line: refused by default (1 MiB), accepted with --max-bytes 3000000.
{
  printf '"'
  head -c 2097152 /dev/zero | tr '\0' 'a'
  printf '"\n'
} >"$T/big.json"
run canon "$T/big.json"
expect_no_crash "canon: a 2 MiB text"
expect_rc 65 "canon: a 2 MiB text is refused by default"
expect_err "^idem: $T/big.json: .*larger.* at byte [0-9]+$" "canon: a 2 MiB text"
run canon --max-bytes 3000000 "$T/big.json"
expect_rc 0 "canon --max-bytes 3000000: a 2 MiB text"
expect_out_file "$T/big.json" "canon --max-bytes 3000000: a 2 MiB text"
cat "$T/big.json" "$T/one.in" >"$T/big.lines"
run --in "$T/big.lines" canon --lines
expect_no_crash "canon --lines: a 2 MiB line"
expect_rc 65 "canon --lines: a 2 MiB line is refused by default"
printf '\n{"a":2,"b":1}\n' >"$T/want"
expect_out_file "$T/want" "canon --lines: an empty line for the 2 MiB line, then the next line"
expect_err '^idem: line 1: .*larger' "canon --lines: the 2 MiB line is line 1"
run --in "$T/big.lines" canon --lines --max-bytes 3000000
expect_rc 0 "canon --lines --max-bytes 3000000: a 2 MiB line"
printf '{"a":2,"b":1}\n' >>"$T/big.want.tmp"
cat "$T/big.json" "$T/big.want.tmp" >"$T/want"
expect_out_file "$T/want" "canon --lines --max-bytes 3000000: a 2 MiB line"
# Many blocks (the reader works in 8 MiB blocks, and a mapped file's blocks
# overlap: one is written while the next is canonicalized): bad lines in
# the first, a middle and the last block keep their numbers and their place
# among the answers, from a file and from a pipe.
awk 'BEGIN { for (i = 1; i <= 300000; i++) {
  if (i == 1 || i == 150001 || i == 300000) print "{\"bad\":" i ",}";
  else printf "{\"z\":%d,\"a\":[%d.50,\"line %d padded to be longer\"]}\n", i, i, i } }' >"$T/many.in"
for how in file pipe; do
  if [ $how = file ]; then
    "$IDEM" canon --lines <"$T/many.in" >"$T/out" 2>&1
  else
    cat "$T/many.in" | "$IDEM" canon --lines >"$T/out" 2>&1
  fi
  RC=$?
  expect_rc 65 "canon --lines, many blocks ($how)"
  if awk 'BEGIN { want[1]; want[150001]; want[300000] }
    /^idem: line / { n = $3; sub(":", "", n); if (!(n in want) || seen != n - 1) exit 1; errs++; next }
    { seen++; if ((seen in want) ? $0 != "" : $0 !~ /^\{"a":\[[0-9]+\.5,"line [0-9]+ padded/) exit 1 }
    END { exit !(errs == 3 && seen == 300000) }' "$T/out"; then ok; else
    bad "canon --lines, many blocks ($how): answers or errors out of place"
  fi
done

printf '{"b":1,"a":2}' >"$T/small.json"
run canon --max-bytes 12 "$T/small.json"
expect_rc 65 "--max-bytes 12 refuses 13 bytes"
run canon --max-bytes 13 "$T/small.json"
expect_rc 0 "--max-bytes 13 accepts 13 bytes"

# ---- key --------------------------------------------------------------------------

ARGS='{"b":[1,"x"],"a":1}'
PAYLOAD='{"args":{"a":1,"b":[1,"x"]},"tool":"refund"}'
FP=$(printf '%s' "$PAYLOAD" | sha256sum | cut -c1-64)
KEY="sess_1:toolu_1:${FP:0:16}"
run key --session sess_1 --call toolu_1 --tool refund "$ARGS"
expect_rc 0 "key with ARGS"
expect_out "$KEY" "key with ARGS"
printf '%s' "$ARGS" >"$T/args.json"
run --in "$T/args.json" key --session sess_1 --call toolu_1 --tool refund
expect_rc 0 "key with ARGS on stdin"
expect_out "$KEY" "key with ARGS on stdin"
run key --session 'a b' --call 'c/1:2' --tool refund "$ARGS"
expect_out "a%20b:c%2F1%3A2:${FP:0:16}" "key percent-encodes the ids"

for missing in session call tool; do
  args=()
  for o in session call tool; do [ "$o" = "$missing" ] || args+=("--$o" x); done
  run key "${args[@]}" '{}'
  expect_rc 2 "key without --$missing"
  expect_err "^idem: .*--$missing" "key without --$missing names it"
done

run key --json --session sess_1 --call toolu_1 --tool refund "$ARGS"
expect_rc 0 "key --json"
if command -v python3 >/dev/null 2>&1; then
  if python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
assert set(d) >= {"fingerprint", "key", "payload"}, d
assert d["fingerprint"] == sys.argv[2], d["fingerprint"]
assert d["key"] == sys.argv[3], d["key"]
assert d["payload"] == {"args": {"a": 1, "b": [1, "x"]}, "tool": "refund"}, d["payload"]
' "$T/out" "$FP" "$KEY" 2>"$T/py.err"; then ok; else
    bad "key --json: $(tail -n 1 "$T/py.err") in '$(head -c 300 "$T/out")'"
  fi
else
  printf 'note: python3 not found; key --json output not parsed\n' >&2
fi
if grep -Fq "\"payload\":$PAYLOAD}" "$T/out"; then ok; else
  bad "key --json: payload bytes are not '$PAYLOAD' in '$(cat "$T/out")'"
fi

not_object() { # ARGS REASON
  run key --session s --call c --tool t "$1"
  expect_rc 65 "key with arguments $1"
  expect_err "^idem: .*not $2.* at byte [0-9]+$" "key with arguments $1 says 'not $2'"
}
not_object '[1,2]' 'an array'
not_object '"x"' 'a string'
not_object '7' 'a number'
not_object 'null' 'null'
not_object 'true' 'a boolean'
run key --session s --call c --tool t '{"a":'
expect_rc 65 "key with bad JSON arguments"
expect_err '^idem: .* at byte 5$' "key with bad JSON arguments"

# key --lines: good and bad lines
{
  printf '%s\n' '{"session":"sess_1","call":"toolu_1","tool":"refund","args":{"b":[1,"x"],"a":1}}'
  printf '%s\n' 'not json'
  printf '%s\n' '{"session":"s","call":"c","tool":"t","args":[1]}'
  printf '%s\n' '{"session":"s","call":"c","args":{}}'
  printf '%s\n' '{"args":{"a":1,"b":[1,"x"]},"tool":"refund","call":"toolu_1","session":"sess_1"}'
} >"$T/keys.in"
printf '%s\n' "$KEY" '' '' '' "$KEY" >"$T/keys.want"
run --in "$T/keys.in" key --lines
expect_rc 65 "key --lines with bad lines"
expect_out_file "$T/keys.want" "key --lines: bad lines are empty lines"
if [ "$(wc -l <"$T/out")" -eq 5 ]; then ok; else bad "key --lines: $(wc -l <"$T/out") output lines for 5 input lines"; fi
expect_err_lines 3 "key --lines: one error per bad line"
for n in 2 3 4; do
  if grep -Eq "^idem: line $n: .+" "$T/err"; then ok; else
    bad "key --lines: no 'idem: line $n: ...' error"
    show_err
  fi
done
if grep -Eq '^idem: line 3: .*not an array' "$T/err"; then ok; else bad "key --lines: line 3 says 'not an array'"; fi
head -n 1 "$T/keys.in" >"$T/key1.in"
run --in "$T/key1.in" key --lines
expect_rc 0 "key --lines, all good"
expect_out "$KEY" "key --lines, all good"
run --in "$T/key1.in" key --lines --json
expect_rc 0 "key --lines --json"
if grep -Fq "\"key\":\"$KEY\"" "$T/out"; then ok; else bad "key --lines --json holds the key"; fi

printf '%d passed, %d failed\n' "$pass" "$fail"
[ "$fail" -eq 0 ]

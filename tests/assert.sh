# assert.sh - the checks the shell test scripts count, sourced by each:
#   ok; bad WHAT; expect NAME WANT GOT; has NAME TEXT NEEDLE;
#   hasnt NAME TEXT NEEDLE; summary (the closing line and the exit code)
# Each script ends with: echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]
pass=0 fail=0
ok() { pass=$((pass + 1)); }
bad() { fail=$((fail + 1)); echo "FAIL: $*" >&2; }
expect() { if [ "$2" = "$3" ]; then ok; else bad "$1: expected '$2', got '$3'"; fi; }
has() { case "$2" in *"$3"*) ok ;; *) bad "$1: '$3' not in: $2" ;; esac; }
hasnt() { case "$2" in *"$3"*) bad "$1: '$3' in: $2" ;; *) ok ;; esac; }
summary() { echo "$pass passed, $fail failed"; [ "$fail" -eq 0 ]; }

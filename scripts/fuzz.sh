#!/bin/sh
# Run each libFuzzer target for a while from a copy of its committed corpus.
#   scripts/fuzz.sh BUILD_DIR SECONDS
# New inputs land in BUILD_DIR/fuzz-work; to keep interesting ones, merge
# them into fuzz/corpus/<target> with `fuzz_<target> -merge=1`.
set -eu
build=$1
secs=$2
here=$(cd "$(dirname "$0")/.." && pwd)
for t in canon key policy http mcp serve sse; do
  work="$build/fuzz-work/$t"
  mkdir -p "$work"
  cp "$here/fuzz/corpus/$t"/* "$work/"
  echo "fuzz: $t for ${secs}s"
  "$build/fuzz/fuzz_$t" -max_total_time="$secs" -max_len=4096 -print_final_stats=1 \
    "$work" 2>"$build/fuzz-$t.log" || { tail -50 "$build/fuzz-$t.log"; exit 1; }
  grep -E 'stat::number_of_executed_units|Done' "$build/fuzz-$t.log" | head -2
done

#!/bin/sh
# bench_smoke.sh IDEM - `idem bench --quick` as an agreement test, with every
# peer required.
#
# Not a timing test: idem bench exits non-zero when idem's and a peer's
# outputs differ.  But a peer that is not installed only makes its figure
# "skipped" - right for someone measuring on their own machine, wrong for a
# test, which would then compare nothing and pass.  So here every peer must
# have run: python3 (key_lines, python_sqlite3), node and the npm package
# canonicalize of tests/peers (canon_lines), and both agreement figures must
# say their outputs match.  `make test` (and so CI) installs the peers first
# (scripts/install-deps.sh --peers); without one this test fails and says
# which.
set -u
IDEM=$1

out=$("$IDEM" bench --quick)
rc=$?
printf '%s\n' "$out"
fail=0
if [ "$rc" -ne 0 ]; then
  echo "bench_smoke: idem bench exited $rc"
  fail=1
fi
if printf '%s\n' "$out" | grep -q '"skipped"'; then
  echo "bench_smoke: a peer is missing (the \"skipped\" figures above);" \
    "scripts/install-deps.sh --peers installs them"
  fail=1
fi
for b in key_lines canon_lines; do
  if ! printf '%s\n' "$out" | grep "^{\"bench\":\"$b\"," |
    grep -q '"outputs_match":true'; then
    echo "bench_smoke: $b: no \"outputs_match\":true from idem and its peer"
    fail=1
  fi
done
exit $fail

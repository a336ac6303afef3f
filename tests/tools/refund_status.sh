#!/bin/sh
# The status check of tests/tools/refund.sh: was the refund with key
# $IDEM_KEY applied?  0 and the record if so, 100 if certainly not.
if grep -qxF "$IDEM_KEY" "$LEDGER" 2>/dev/null; then
  printf '{"applied":true,"key":"%s"}\n' "$IDEM_KEY"
  exit 0
fi
exit 100

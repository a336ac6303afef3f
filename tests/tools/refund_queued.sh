#!/bin/sh
# A refund command whose provider applies it LATER, outside the command:
# the request is handed to a provider's queue, here a process of its own
# session and process group (setsid), which appends $IDEM_KEY to $LEDGER
# under flock $QUEUE_DELAY seconds later (default 1; never deduping), or,
# with QUEUE_UNTIL=PATH, once PATH exists (the test says when: at most
# 30 s; a queue that lands on cue does not race a loaded machine).  So
# nothing the command's executor can see - the command's exit, its process
# group, the death of its runner - says whether the refund will land: an
# attempt that ENDED without a verdict has not FINISHED (SPEC §6a).
# After the hand-off the command touches $QUEUED (when set), then:
#   QUEUE_THEN=exit:N   exits N at once (default exit:75: its own client
#                       gave up; any status the policy does not map is
#                       "unknown")
#   QUEUE_THEN=kill     dies by SIGKILL
#   QUEUE_THEN=hang:S   sleeps S seconds (in steps of 0.1 s, so that
#                       nothing of it outlives it by more), then exits 75
# The status check is tests/tools/refund_status.sh (it reads $LEDGER).
set -u
if [ "${1:-}" = __apply ]; then # the queue: __apply DELAY KEY LEDGER ACK [UNTIL]
  : > "$5" # received (in a session of its own already: setsid execs it)
  if [ -n "${6:-}" ]; then
    i=0
    while [ ! -e "$6" ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i + 1)); done
  else
    sleep "$2"
  fi
  ( flock 9; printf '%s\n' "$3" >> "$4" ) 9>>"$4.lock"
  exit 0
fi
cat >/dev/null
# hand it on, and wait (at most 5 s) for the queue to say it has it
ack=$LEDGER.ack.$$
setsid sh "$0" __apply "${QUEUE_DELAY:-1}" "$IDEM_KEY" "$LEDGER" "$ack" "${QUEUE_UNTIL:-}" \
  </dev/null >/dev/null 2>&1 &
i=0
while [ ! -e "$ack" ] && [ $i -lt 500 ]; do sleep 0.01; i=$((i + 1)); done
rm -f "$ack"
[ -n "${QUEUED:-}" ] && : > "$QUEUED"
then=${QUEUE_THEN:-exit:75}
case "$then" in
  exit:*) exit "${then#exit:}" ;;
  kill) kill -9 $$ ;;
  hang:*)
    n=$(awk -v s="${then#hang:}" 'BEGIN { printf "%d", s * 10 }')
    while [ "$n" -gt 0 ]; do sleep 0.1; n=$((n - 1)); done
    exit 75 ;;
esac
exit 75

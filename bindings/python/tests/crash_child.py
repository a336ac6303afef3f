"""One harness process for test_crash: guard one refund whose provider
appends the idempotency key to a ledger file (no deduplication), with a
status function that looks the key up there; print the envelope.

    crash_child.py LOG LEDGER CALL_ID [crash_in_tool]

Run with IDEM_CRASH_AT=POINT it is killed by SIGKILL at that point."""
import fcntl
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import idem  # noqa: E402

# The refund is a local write, done when its process dies: settle_ms 0
# (SPEC §6a).  CRASH_SETTLE_MS=none leaves settle_ms out (no bound).
POLICY = """{"tools":{"refund_payment":{"class":"guarded","timeout_ms":5000,
  "retries":1,"backoff_ms":1,"wait_ms":5000,%s
  "status":{"tool":"get_refund_status","arguments":{"order_id":"{order_id}"}}},
  "get_refund_status":{"class":"read_only"}}}"""


def main():
    log, ledger, call_id = sys.argv[1:4]
    crash_in_tool = len(sys.argv) > 4

    def refund(args, key):
        fd = os.open(ledger, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            os.write(fd, (key + "\n").encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        if crash_in_tool:
            os.kill(os.getpid(), signal.SIGKILL)
        return {"refund_id": "re_" + key[-4:], "order_id": args["order_id"]}

    def status(args, key):
        try:
            with open(ledger) as f:
                keys = f.read().split()
        except FileNotFoundError:
            keys = []
        return {"applied": True, "key": key} if key in keys else None

    settle = os.environ.get("CRASH_SETTLE_MS", "0")
    policy = POLICY % ("" if settle == "none" else '"settle_ms":%s,' % settle)
    g = idem.Guard(log, idem.Policy(text=policy))
    tool = g.tool("refund_payment", status=status)(refund)
    print(tool.call_json("sess", call_id,
                         '{"order_id":"ord_1","amount_cents":6000}'))
    sys.stdout.flush()
    g.close()


if __name__ == "__main__":
    main()

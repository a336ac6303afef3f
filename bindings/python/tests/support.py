"""What the Python binding's tests share: a payment provider with a ledger,
policies, temporary logs, and the scale of the sanitizer build."""
import os
import shutil
import sys
import tempfile
import threading
import itertools
import time
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.dirname(HERE)
REPO = os.path.dirname(os.path.dirname(PKG))
sys.path.insert(0, PKG)

import idem  # noqa: E402

# Under ASan every call is several times slower: loops scale down.
SCALE = float(os.environ.get("IDEM_TEST_SCALE", "1"))

ARGS = '{"order_id":"ord_1","amount_cents":6000}'

REFUND_POLICY = """{"tools":{
  "refund_payment":{"class":"guarded","timeout_ms":%(t)d,"retries":1,
    "backoff_ms":1,"wait_ms":%(w)d,
    "status":{"tool":"get_refund_status",
              "arguments":{"order_id":"{order_id}"}}},
  "get_refund_status":{"class":"read_only"},
  "lookup":{"class":"read_only"}}}"""

NOCHECK_POLICY = """{"tools":{
  "refund_payment":{"class":"guarded","timeout_ms":%(t)d,"retries":0,
    "backoff_ms":1,"wait_ms":%(t)d}}}"""


def policy(text, timeout_ms=300, wait_ms=3000):
    return idem.Policy(text=text % {"t": timeout_ms, "w": wait_ms},
                       origin="test")


class Provider:
    """A fake payment provider that does NOT dedupe on the key: every double
    application the guard failed to prevent shows in its ledger.  Modes:
    ok, stall (apply, then answer after stall_s), fail_before (nothing
    applied, NotApplied), reject (Rejected), boom (apply, then raise)."""

    def __init__(self):
        self.mu = threading.Lock()
        self.reset()

    def reset(self, mode="ok", stall_s=0.0):
        with self.mu:
            self.mode, self.stall_s = mode, stall_s
            self.ledger = []  # keys of applied refunds, in order
            self.calls = self.checks = 0
            self.seen_args = []

    def applied(self):
        with self.mu:
            return len(self.ledger)

    def refund(self, args, key):
        with self.mu:
            self.calls += 1
            self.seen_args.append(args)
            mode, stall = self.mode, self.stall_s
            if mode == "fail_before":
                raise idem.NotApplied("connection refused")
            if mode == "reject":
                raise idem.Rejected("card expired")
            self.ledger.append(key)
            n = len(self.ledger)
        if stall:
            time.sleep(stall)
        if mode == "boom":
            raise RuntimeError("connection reset after sending")
        return {"refund_id": "re_%d" % n, "amount_cents": args["amount_cents"]}

    def status(self, args, key):
        with self.mu:
            self.checks += 1
            if key in self.ledger:
                return {"refund_id": "re_%d" % (self.ledger.index(key) + 1),
                        "status": "applied"}
        return None


class LogTest(unittest.TestCase):
    """A fresh directory for attempt logs per test."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="idem-py-")
        self.n = 0

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def log(self):
        self.n += 1
        return "sqlite:%s/log%d.db" % (self.dir, self.n)


_turns = itertools.count(1)


def next_turn():
    """A later turn of the model, the model having been told: its id, for
    the calls of that turn (``turn=``).  Identical calls of one turn, or
    without turn ids within coalesce_ms of each other, are one decision."""
    return "turn_%d" % next(_turns)


def together(n, fn):
    """fn(i) for i in range(n), on n threads released at once (a barrier):
    the results in order, and the exceptions any of them raised."""
    results, errors = [None] * n, []
    go = threading.Barrier(n)

    def one(i):
        try:
            go.wait()
            results[i] = fn(i)
        except BaseException as e:  # reported by the caller, never lost
            errors.append(e)

    ts = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    return results, errors

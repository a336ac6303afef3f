"""SPEC §6a through the Python binding: a refund that hangs past the
deadline and THEN applies.

Reproduction 2 of the issue: the tool sleeps 0.5 s and then applies,
timeout_ms is 300, and a status tool says "applied" only once it has.
Before §6a the status check's "not applied" let the guard run the tool
again: 2 refunds, and the model was told "succeeded, attempts: 1".  Now the
first call answers outcome_unknown, a re-issue during the hang (the same
call id, or a new one) runs nothing, the late landing is recorded, and
there is exactly one refund.  Every case counts refunds in the provider's
ledger, which does not dedupe on the key."""
import threading
import os
import time
import unittest

from .support import idem, LogTest, ARGS

HANG_S = 0.5
TIMEOUT_MS = 300


def policy(settle_ms=None, timeout_ms=TIMEOUT_MS):
    settle = "" if settle_ms is None else '"settle_ms":%d,' % settle_ms
    return idem.Policy(text="""{"tools":{
      "refund_payment":{"class":"guarded","timeout_ms":%d,"retries":1,
        "backoff_ms":1,"wait_ms":300,%s
        "status":{"tool":"get_refund_status",
                  "arguments":{"order_id":"{order_id}"}}},
      "get_refund_status":{"class":"read_only"}}}""" % (timeout_ms, settle),
                       origin="test")


class LateProvider:
    """A payment provider that holds each request for hang_s, THEN applies
    the refund; its status check shows a refund only once it is applied.
    It does not dedupe on the key: every application is in the ledger."""

    def __init__(self, hang_s=HANG_S):
        self.mu = threading.Lock()
        self.hang_s = hang_s
        self.ledger = []  # keys of applied refunds, in order
        self.sent = []  # keys of every request, in order
        self.landed = 0  # requests that have finished

    def refund(self, args, key):
        with self.mu:
            self.sent.append(key)
        time.sleep(self.hang_s)
        with self.mu:
            self.ledger.append(key)
            self.landed += 1
            n = len(self.ledger)
        return {"refund_id": "re_%d" % n, "amount_cents": args["amount_cents"]}

    def status(self, args, key):
        with self.mu:
            if key in self.ledger:
                return {"refund_id": "re_%d" % (self.ledger.index(key) + 1),
                        "status": "applied"}
        return None

    def calls(self):
        with self.mu:
            return len(self.sent)

    def applied(self):
        with self.mu:
            return len(self.ledger)


def wait_for(cond, timeout_s=5.0):
    until = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < until:
        time.sleep(0.01)
    return cond()


class InFlight(LogTest):

    def guard(self, p, settle_ms=None):
        g = idem.Guard(self.log(), policy(settle_ms))
        self.addCleanup(g.close)
        return g, g.tool("refund_payment", status=p.status)(p.refund)

    def hang_then_land(self, settle_ms=None):
        p = LateProvider()
        g, tool = self.guard(p, settle_ms)
        t0 = time.monotonic()
        env = tool("sess", "toolu_1", ARGS)
        self.assertEqual(env.status, "outcome_unknown", env)
        self.assertEqual(env["attempts"], 1, env)
        self.assertNotIn("safe to call", env["message"])
        self.assertNotIn("result", env)
        self.assertEqual(env["check_with"]["tool"], "get_refund_status")
        self.assertEqual(p.calls(), 1)
        rec = g.record("sess", "toolu_1")
        self.assertEqual(rec["state"], "in_doubt")
        # this process runs the attempt: it may still land
        self.assertEqual(rec["executor"].split(":")[1], str(os.getpid()))
        self.assertEqual(rec["pgid"], 0)
        self.assertGreater(rec["settle_from"], 0)
        # the same call again while it hangs: the executor is at work
        env = tool("sess", "toolu_1", ARGS)
        self.assertEqual(env.status, "in_progress", env)
        self.assertNotIn("safe to call", env["message"])
        # the model re-issues it under a new call id: fenced
        env = tool("sess", "toolu_2", ARGS)
        self.assertEqual(env.status, "outcome_unknown", env)
        self.assertEqual(env["duplicate_of"], "toolu_1", env)
        self.assertEqual(p.calls(), 1)
        self.assertEqual(p.applied(), 0)
        # (all of the above happened during the hang)
        self.assertLess(time.monotonic() - t0, HANG_S)
        # the refund lands: the late result is recorded
        self.assertTrue(wait_for(lambda: p.landed == 1))
        self.assertTrue(wait_for(
            lambda: g.record("sess", "toolu_1")["state"] == "succeeded"))
        rec = g.record("sess", "toolu_1")
        self.assertEqual(rec["resolution"], "late")
        self.assertIsNone(rec["executor"])  # it ended
        self.assertEqual(rec["result"]["refund_id"], "re_1")
        # the re-issue before the model was told: already applied
        env = tool("sess", "toolu_2", ARGS)
        self.assertEqual(env.status, "already_applied", env)
        self.assertEqual(env["duplicate_of"], "toolu_1")
        self.assertEqual(env["result"]["refund_id"], "re_1")
        # the first call replays the late outcome
        env = tool("sess", "toolu_1", ARGS)
        self.assertEqual(env.status, "succeeded", env)
        self.assertTrue(env["replayed"])
        self.assertEqual(env["result"]["refund_id"], "re_1")
        # exactly one refund, sent once
        self.assertEqual(p.applied(), 1)
        self.assertEqual(p.calls(), 1)
        self.assertEqual(p.ledger, [rec["key"]])

    def test_reproduction_2(self):
        self.hang_then_land()

    def test_reproduction_2_with_settle_ms(self):
        # settle_ms longer than the hang: the same, one refund
        self.hang_then_land(settle_ms=2000)

    def test_settle_ms_shorter_than_the_hang(self):
        # the documented trade-off: settle_ms 0 says an attempt cannot land
        # after its deadline, so a check that does not show it lets the
        # guard send it again (same key) - for this provider, that is two
        # refunds, counted here
        p = LateProvider()
        g, tool = self.guard(p, settle_ms=0)
        tool("sess", "toolu_1", ARGS)
        self.assertEqual(p.calls(), 2)
        self.assertEqual(len(set(p.sent)), 1)
        self.assertTrue(wait_for(lambda: p.landed == 2))
        self.assertEqual(p.applied(), 2)


if __name__ == "__main__":
    unittest.main()

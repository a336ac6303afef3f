"""One model turn, one refund (SPEC 6.4), through the Python binding as a
harness uses it: 16 threads, 16 distinct call ids, one fast refund tool,
one turn.  Run 100 times: one application every time, the other 15 answered
already_applied naming the call that ran.  Then the next turn's repeat
runs, and calls without a turn id coalesce within coalesce_ms only."""
import time
import unittest

from tests.support import idem, ARGS, policy, Provider, LogTest, together

POLICY = """{"tools":{"refund_payment":{"class":"guarded",
  "timeout_ms":10000,"wait_ms":10000,"coalesce_ms":300}}}"""


class OneTurnOneRefund(LogTest):
    N = 16
    RUNS = 100

    def burst(self, refund, session, turn):
        envs, errors = together(self.N, lambda i: refund(
            session, "call_%d" % i, ARGS, turn=turn))
        self.assertEqual(errors, [])
        return envs

    def check_one(self, envs, what):
        ran = [e for e in envs if e["status"] == "succeeded"]
        self.assertEqual(len(ran), 1, what)
        first = ran[0]["call_id"]
        for e in envs:
            if e is ran[0]:
                continue
            self.assertEqual(e["status"], "already_applied", (what, e))
            self.assertEqual(e["duplicate_of"], first, what)
            self.assertEqual(e["result"], ran[0]["result"], what)
            self.assertIn("already made in this turn", e["message"], what)

    def test_sixteen_threads_one_turn_a_hundred_runs(self):
        p = Provider()
        with idem.Guard(self.log(), policy(POLICY)) as g:
            refund = g.tool("refund_payment")(p.refund)
            for run in range(self.RUNS):
                before = p.applied()
                envs = self.burst(refund, "s%d" % run, "turn_1")
                self.assertEqual(p.applied() - before, 1, "run %d" % run)
                self.check_one(envs, "run %d" % run)
                # the model was told; its next turn decides again
                env = refund("s%d" % run, "call_next", ARGS, turn="turn_2")
                self.assertEqual(env["status"], "succeeded")
                self.assertEqual(p.applied() - before, 2)
            rec = g.record("s0", "call_next")
            self.assertEqual(rec["turn"], "turn_2")

    def test_without_turn_ids_the_window_decides(self):
        p = Provider()
        with idem.Guard(self.log(), policy(POLICY)) as g:
            refund = g.tool("refund_payment")(p.refund)
            for run in range(20):
                before = p.applied()
                envs = self.burst(refund, "w%d" % run, None)
                self.assertEqual(p.applied() - before, 1, "run %d" % run)
                self.check_one(envs, "run %d" % run)
            time.sleep(0.4)  # past coalesce_ms: a new decision
            env = refund("w0", "call_late", ARGS)
            self.assertEqual(env["status"], "succeeded")
            self.assertEqual(p.applied(), 21)

    def test_turn_must_be_text(self):
        p = Provider()
        with idem.Guard(self.log(), policy(POLICY)) as g:
            refund = g.tool("refund_payment")(p.refund)
            with self.assertRaises(idem.InvalidError):
                refund("s", "c", ARGS, turn="")
            with self.assertRaises(idem.MisuseError):
                refund("s", "c", ARGS, turn=7)


if __name__ == "__main__":
    unittest.main()

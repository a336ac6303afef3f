"""Threads racing one call through the Python binding: the tool runs on the
library's worker threads (ctypes callbacks taking the GIL) while other
Python threads wait in the guard; one application, counted in a ledger."""
import threading
import unittest

from tests.support import idem, ARGS, REFUND_POLICY, policy, Provider, \
    LogTest, SCALE, together


class Races(LogTest):
    N = max(4, int(8 * SCALE))

    def race(self, refund, call_ids):
        envs, errors = together(
            len(call_ids), lambda i: refund("sess_r", call_ids[i], ARGS))
        self.assertEqual(errors, [])
        return envs

    def test_threads_racing_one_call(self):
        p = Provider()
        p.reset("ok", 0.05)
        with idem.Guard(self.log(), policy(REFUND_POLICY)) as g:
            refund = g.tool("refund_payment", status=p.status)(p.refund)
            envs = self.race(refund, ["toolu_same"] * self.N)
            self.assertEqual(p.applied(), 1)
            self.assertEqual([e["status"] for e in envs],
                             ["succeeded"] * self.N)
            self.assertEqual(sum(not e["replayed"] for e in envs), 1)
            self.assertEqual({e["result"]["refund_id"] for e in envs},
                             {"re_1"})

    def test_parallel_identical_calls_of_one_turn(self):
        p = Provider()
        p.reset("ok", 0.05)
        with idem.Guard(self.log(), policy(REFUND_POLICY)) as g:
            refund = g.tool("refund_payment", status=p.status)(p.refund)
            envs = self.race(refund,
                             ["toolu_p%d" % i for i in range(self.N)])
            self.assertEqual(p.applied(), 1)
            st = sorted(e["status"] for e in envs)
            self.assertEqual(st, ["already_applied"] * (self.N - 1)
                             + ["succeeded"])
            first = [e["call_id"] for e in envs if e["status"] == "succeeded"]
            for e in envs:
                if e["status"] == "already_applied":
                    self.assertEqual(e["duplicate_of"], first[0])

    def test_many_sessions_share_one_guard(self):
        # distinct actions from many threads at once: each applied once,
        # and the canon workspaces of keys/canon are per thread
        p = Provider()
        rounds = max(5, int(20 * SCALE))
        with idem.Guard(self.log(), policy(REFUND_POLICY)) as g:
            refund = g.tool("refund_payment", status=p.status)(p.refund)
            errors = []

            def worker(t):
                try:
                    for i in range(rounds):
                        sid = "sess_%d" % t
                        a = {"order_id": "o%d_%d" % (t, i),
                             "amount_cents": i + 1}
                        for _ in range(2):  # the call, then its replay
                            e = refund(sid, "call_%d" % i, a)
                            assert e["status"] == "succeeded", e
                        k = idem.key(sid, "call_%d" % i, "refund_payment", a)
                        assert e["idempotency_key"] == k.key
                except BaseException as ex:
                    errors.append(ex)

            ts = [threading.Thread(target=worker, args=(t,))
                  for t in range(4)]
            for t in ts:
                t.start()
            for t in ts:
                t.join(120)
            self.assertEqual(errors, [])
            self.assertEqual(p.applied(), 4 * rounds)
            self.assertEqual(len(set(p.ledger)), 4 * rounds)


if __name__ == "__main__":
    unittest.main()

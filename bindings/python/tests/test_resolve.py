"""Guard.resolve: an operator's verdict on an action in doubt (SPEC 9).

The tool hands the refund to a provider that never confirms it and raises
(its own client gave up): the action stays in doubt, the model is told
outcome_unknown, and no status check can settle it.  A person checks with
the provider and records the verdict; the tool never runs again for an
applied verdict, and runs once more for a not-applied one."""
import unittest

from tests.support import idem, LogTest, next_turn

POLICY = """{"tools":{"refund_payment":{"class":"guarded","timeout_ms":3000,
  "retries":0}}}"""
ARGS = {"order_id": "ord_1", "amount_cents": 6000}


class Resolve(LogTest):
    def setUp(self):
        super().setUp()
        self.g = idem.Guard(self.log(), idem.Policy(text=POLICY))
        self.sent = []
        self.fail = True

    def call(self, call_id):
        def run(args, key):
            self.sent.append(args["order_id"])
            if self.fail:
                raise TimeoutError("the provider did not answer in 0.3 s")
            return {"refund_id": "re_%d" % len(self.sent)}
        return self.g.call("s", call_id, "refund_payment", ARGS, run,
                           turn=next_turn())

    def tearDown(self):
        self.g.close()
        super().tearDown()

    def doubt(self, call_id):
        env = self.call(call_id)
        self.assertEqual(env["status"], "outcome_unknown", env)
        self.assertEqual(self.g.record("s", call_id)["state"], "in_doubt")

    def test_applied(self):
        self.doubt("c1")
        self.g.resolve("s", "c1", applied=True, result={"refund_id": "re_op"},
                       by="alice@ops")
        rec = self.g.record("s", "c1")
        self.assertEqual(rec["state"], "succeeded")
        self.assertEqual(rec["resolution"], "operator")
        self.assertEqual(rec["resolved_by"], "alice@ops")
        self.assertGreater(rec["resolved_at"], 0)
        self.assertEqual(rec["result"], {"refund_id": "re_op"})
        # the model's re-issue, then the replay: the verdict, nothing runs
        env = self.call("c2")
        self.assertEqual(env["status"], "already_applied", env)
        self.assertEqual(env["result"], {"refund_id": "re_op"})
        env = self.call("c1")
        self.assertEqual(env["status"], "succeeded", env)
        self.assertEqual(self.sent, ["ord_1"])
        # a second verdict is refused, and says who gave the first
        with self.assertRaises(idem.StaleError) as e:
            self.g.resolve("s", "c1", applied=False, reason="cancelled")
        self.assertIn("not in doubt", str(e.exception))
        self.assertIn("alice@ops", str(e.exception))

    def test_not_applied(self):
        self.doubt("c1")
        self.g.resolve("s", "c1", applied=False,
                       reason="provider: no such refund")
        rec = self.g.record("s", "c1")
        self.assertEqual(rec["state"], "not_applied")
        self.assertEqual(rec["error"], "provider: no such refund")
        self.assertTrue(rec["resolved_by"])  # the guard's owner id
        self.fail = False
        env = self.call("c1")
        self.assertEqual(env["status"], "succeeded", env)
        self.assertEqual(self.sent, ["ord_1", "ord_1"])
        self.assertEqual(env["attempts"], 2)

    def test_refused(self):
        with self.assertRaises(idem.NotFoundError):
            self.g.resolve("s", "nope", applied=True)
        self.doubt("c1")
        with self.assertRaises(idem.MisuseError):
            self.g.resolve("s", "c1", applied=False)  # no reason
        with self.assertRaises(idem.MisuseError):
            self.g.resolve("s", "c1", applied=False, reason="x", result={})
        with self.assertRaises(idem.MisuseError):
            self.g.resolve("s", "c1", applied=1)
        with self.assertRaises(idem.InvalidError):
            self.g.resolve("s", "c1", applied=True, result_json="{bad")
        self.assertEqual(self.g.record("s", "c1")["state"], "in_doubt")


if __name__ == "__main__":
    unittest.main()

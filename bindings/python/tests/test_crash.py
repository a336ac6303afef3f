"""Crashes: a harness process using the binding is killed by SIGKILL at
each crash point of the library (IDEM_CRASH_AT, SPEC §11) and inside the
tool itself, then resumed by a fresh process making the same call; the
provider's ledger must hold the refund exactly once."""
import json
import os
import signal
import subprocess
import sys
import unittest

from tests.support import LogTest, HERE

CHILD = os.path.join(HERE, "crash_child.py")
POINTS = ("after_pending_commit", "after_downstream_return",
          "before_outcome_commit", "after_outcome_commit")


class Crashes(LogTest):
    def child(self, log, ledger, crash_at=None, extra=()):
        env = dict(os.environ)
        env.pop("IDEM_CRASH_AT", None)
        if crash_at:
            env["IDEM_CRASH_AT"] = crash_at
        return subprocess.run([sys.executable, CHILD, log, ledger, "toolu_1",
                               *extra], env=env, capture_output=True,
                              text=True, timeout=120)

    def ledger_count(self, ledger):
        try:
            with open(ledger) as f:
                return len(f.read().split())
        except FileNotFoundError:
            return 0

    def killed_then_resumed(self, name, crash_at=None, extra=()):
        log = self.log()
        ledger = os.path.join(self.dir, name + ".ledger")
        r = self.child(log, ledger, crash_at, extra)
        self.assertEqual(r.returncode, -signal.SIGKILL,
                         "%s: not killed: %s %s" % (name, r.stdout, r.stderr))
        self.assertEqual(r.stdout, "")  # it died before answering
        # resume: a fresh harness process re-issues the same call
        r = self.child(log, ledger)
        self.assertEqual(r.returncode, 0, r.stderr)
        env = json.loads(r.stdout)
        self.assertEqual(env["status"], "succeeded", "%s: %s" % (name, env))
        self.assertEqual(self.ledger_count(ledger), 1,
                         "%s: refunds in the ledger" % name)
        # and from now on it replays
        r = self.child(log, ledger)
        env = json.loads(r.stdout)
        self.assertIs(env["replayed"], True)
        self.assertEqual(self.ledger_count(ledger), 1)
        return env

    def test_each_crash_point(self):
        for point in POINTS:
            with self.subTest(point=point):
                self.killed_then_resumed(point, crash_at=point)

    def test_crash_inside_the_tool(self):
        self.killed_then_resumed("tool", extra=("crash_in_tool",))

    def test_crash_before_the_tool_without_settle_ms(self):
        # SPEC §6a: the process died after the pending record; without a
        # settle_ms nobody can tell whether its tool had sent the refund,
        # so the resume is honest (outcome_unknown), runs nothing, and a
        # re-issue under a new call id is fenced
        log = self.log()
        ledger = os.path.join(self.dir, "nosettle.ledger")
        os.environ["CRASH_SETTLE_MS"] = "none"
        try:
            r = self.child(log, ledger, "after_pending_commit")
            self.assertEqual(r.returncode, -signal.SIGKILL)
            r = self.child(log, ledger)
            env = json.loads(r.stdout)
            self.assertEqual(env["status"], "outcome_unknown", env)
            self.assertNotIn("safe to call", env["message"])
            self.assertEqual(self.ledger_count(ledger), 0)
        finally:
            del os.environ["CRASH_SETTLE_MS"]
        # with settle_ms 0 (a local write ends with its process) the same
        # record is settled not applied and the call runs, once
        r = self.child(log, ledger)
        env = json.loads(r.stdout)
        self.assertEqual(env["status"], "succeeded", env)
        self.assertEqual(self.ledger_count(ledger), 1)

    def test_crash_point_names_are_inert_when_unset(self):
        log = self.log()
        ledger = os.path.join(self.dir, "none.ledger")
        r = self.child(log, ledger, crash_at="no_such_point")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["status"], "succeeded")
        self.assertEqual(self.ledger_count(ledger), 1)


if __name__ == "__main__":
    unittest.main()


EXIT_EARLY = """
import sys, time
sys.path.insert(0, %(pkg)r)
import idem
pol = idem.Policy(text='{"tools":{"refund_payment":{"class":"guarded",'
                  '"timeout_ms":200,"retries":0}}}')
g = idem.Guard(sys.argv[1], pol)
def refund(args, key):
    time.sleep(0.6)
    return {"refund_id": "re_late"}
t = g.tool("refund_payment")(refund)
print(t.call_json("sess", "toolu_1", '{"order_id":"ord_1"}'))
# the script ends here, while refund() is still running on the worker
"""


class ExitWhileToolRuns(LogTest):
    def test_late_result_recorded_at_exit(self):
        from tests.support import idem, PKG
        log = self.log()
        r = subprocess.run([sys.executable, "-c", EXIT_EARLY % {"pkg": PKG},
                            log], capture_output=True, text=True, timeout=60)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertEqual(json.loads(r.stdout)["status"], "outcome_unknown")
        self.assertEqual(r.stderr, "")
        with idem.Guard(log, None) as g:
            rec = g.record("sess", "toolu_1")
        self.assertEqual(rec["state"], "succeeded")
        self.assertEqual(rec["resolution"], "late")
        self.assertEqual(rec["result"], {"refund_id": "re_late"})

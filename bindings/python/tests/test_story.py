"""The refund story of SPEC §1 through the Python binding: the synchronous
API (a guarded Python function), the two-phase API, the envelope as a dict,
the policy, keys and canon, and the example harness."""
import json
import os
import subprocess
import sys
import time
import unittest

from tests.support import (idem, ARGS, REFUND_POLICY, NOCHECK_POLICY, policy,
                           Provider, LogTest, next_turn, PKG)


def _get(d, keys):
    for k in keys:
        d = d[k]
    return d


class RefundStory(LogTest):
    def setUp(self):
        super().setUp()
        self.p = Provider()
        self.guard = idem.Guard(self.log(), policy(REFUND_POLICY))
        self.refund = self.guard.tool("refund_payment",
                                      status=self.p.status)(self.p.refund)

    def tearDown(self):
        self.guard.close()
        super().tearDown()

    def test_first_call_replay_conflict_second_refund(self):
        # first call
        env = self.refund("sess_1", "toolu_7", ARGS)
        self.assertIsInstance(env, dict)
        self.assertEqual(env["status"], "succeeded")
        self.assertIs(env["replayed"], False)
        self.assertEqual(env["idempotency_key"],
                         "sess_1:toolu_7:a280fb850f483293")
        self.assertEqual(env["result"],
                         {"refund_id": "re_1", "amount_cents": 6000})
        self.assertEqual(json.loads(env.text), env)
        self.assertEqual(self.p.ledger, ["sess_1:toolu_7:a280fb850f483293"])
        # the tool got the arguments as a dict
        self.assertEqual(self.p.seen_args,
                         [{"amount_cents": 6000, "order_id": "ord_1"}])
        # replay: the same call again, nothing downstream
        env = self.refund("sess_1", "toolu_7", ARGS)
        self.assertEqual(env["status"], "succeeded")
        self.assertIs(env["replayed"], True)
        self.assertEqual(env["result"]["refund_id"], "re_1")
        self.assertEqual(self.p.applied(), 1)
        # reformatted arguments (and as a dict, as Anthropic sends them) are
        # the same action
        for args in (' {"amount_cents": 6000.0, "order_id" : "ord_1"} ',
                     {"order_id": "ord_1", "amount_cents": 6000}):
            env = self.refund("sess_1", "toolu_7", args)
            self.assertEqual(env["status"], "succeeded")
            self.assertIs(env["replayed"], True)
        self.assertEqual(self.p.applied(), 1)
        # conflict: the call id reused with other arguments
        env = self.refund("sess_1", "toolu_7",
                          {"order_id": "ord_1", "amount_cents": 9000})
        self.assertEqual(env["status"], "conflict")
        self.assertIn("message", env)
        self.assertEqual(self.p.applied(), 1)
        # a legitimate second refund: a new decision after the model was told
        env = self.refund("sess_1", "call_9", ARGS, turn=next_turn())
        self.assertEqual(env["status"], "succeeded")
        self.assertIs(env["replayed"], False)
        self.assertEqual(self.p.applied(), 2)
        rec = self.guard.record("sess_1", "toolu_7")
        self.assertEqual(rec["state"], "succeeded")
        self.assertEqual(rec["resolution"], "executed")
        self.assertEqual(rec["attempts"], 1)
        self.assertGreaterEqual(rec["delivered"], rec["created"])
        self.assertEqual(rec["args"],
                         '{"amount_cents":6000,"order_id":"ord_1"}')

    def test_process_metrics_count_this_process(self):
        # what the log cannot know: answers, replays, attempts, latency
        before = idem.process_metrics()
        self.refund("sess_m", "c1", ARGS)            # runs
        self.refund("sess_m", "c1", ARGS)            # replays
        after = idem.process_metrics()
        d = lambda *k: (_get(after, k) - _get(before, k))
        self.assertEqual(d("answers", "succeeded"), 2)
        self.assertEqual(d("replays"), 1)
        self.assertEqual(d("attempts"), 1)
        self.assertEqual(d("latency", "count"), 2)
        self.assertGreater(d("latency", "sum_seconds"), 0)
        b = after["latency"]["buckets"]
        self.assertEqual(len(b), 16)
        self.assertEqual([le for le, _ in b], sorted(le for le, _ in b))
        self.assertEqual([n for _, n in b], sorted(n for _, n in b))
        self.assertLessEqual(b[-1][1], after["latency"]["count"])
        self.assertEqual(set(after["checks"]),
                         {"applied", "rejected", "not_applied", "unknown"})

    def test_bad_arguments_refused_read_only_are_answers(self):
        env = self.refund("sess_1", "toolu_10",
                          '{"order_id":"ord_1","order_id":"ord_2"}')
        self.assertEqual(env["status"], "invalid_arguments")
        self.assertIn("duplicate member name", env["message"])
        env = self.refund("sess_1", "toolu_11", "not json at all")
        self.assertEqual(env["status"], "invalid_arguments")
        env = self.refund("sess_1", "toolu_12", "[1]")
        self.assertEqual(env["status"], "invalid_arguments")
        for cid in ("toolu_10", "toolu_11", "toolu_12"):
            with self.assertRaises(idem.NotFoundError):
                self.guard.record("sess_1", cid)
        drop = self.guard.tool("drop_database")(self.p.refund)
        self.assertEqual(drop("sess_1", "toolu_13", "{}")["status"],
                         "refused")
        lookup = self.guard.tool("lookup")(lambda a, k: {"found": a})
        env = lookup("sess_1", "toolu_14", '{"q":1}')
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(env["result"], {"found": {"q": 1}})
        with self.assertRaises(idem.NotFoundError):
            self.guard.record("sess_1", "toolu_14")
        self.assertEqual(self.p.applied(), 0)

    def test_tool_exceptions_follow_the_contract(self):
        # NotApplied: retried with the same key, then failed, safe to retry
        self.p.reset("fail_before")
        env = self.refund("sess_4", "toolu_1", ARGS)
        self.assertEqual(env["status"], "failed")
        self.assertEqual(env["attempts"], 2)
        self.assertIn("safe to call it again", env["message"])
        self.assertIn("connection refused", env["message"])
        self.assertEqual(self.guard.record("sess_4", "toolu_1")["state"],
                         "not_applied")
        # the provider is back: the same call executes, with the same key
        self.p.reset("ok")
        env = self.refund("sess_4", "toolu_1", ARGS)
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(self.p.ledger, ["sess_4:toolu_1:a280fb850f483293"])
        # Rejected: a definite failure, not retried, replayed
        self.p.reset("reject")
        env = self.refund("sess_4", "toolu_2", ARGS, turn=next_turn())
        self.assertEqual(env["status"], "failed")
        self.assertIn("card expired", env["message"])
        self.assertEqual(self.p.calls, 1)
        env = self.refund("sess_4", "toolu_2", ARGS)
        self.assertIs(env["replayed"], True)
        self.assertEqual(self.p.calls, 1)
        # any other exception: the outcome is unknown, reconciled by the
        # status function (the refund went out before the error)
        self.p.reset("boom")
        env = self.refund("sess_4", "toolu_3", ARGS, turn=next_turn())
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(env["result"]["status"], "applied")
        rec = self.guard.record("sess_4", "toolu_3")
        self.assertEqual(rec["resolution"], "reconciled")
        self.assertEqual(self.p.applied(), 1)
        self.assertEqual(self.p.checks, 1)

    def test_status_function_that_fails_leaves_it_unknown(self):
        def broken_status(args, key):
            raise ConnectionError("status API down")
        refund = self.guard.tool("refund_payment",
                                 status=broken_status)(self.p.refund)
        self.p.reset("boom")
        env = refund("sess_7", "toolu_1", ARGS)
        self.assertEqual(env["status"], "outcome_unknown")
        self.assertEqual(env["check_with"]["tool"], "get_refund_status")
        self.assertEqual(self.guard.record("sess_7", "toolu_1")["state"],
                         "in_doubt")
        # a re-issue with a new id is fenced, the provider is not called
        env = refund("sess_7", "toolu_2", ARGS)
        self.assertEqual(env["status"], "outcome_unknown")
        self.assertEqual(env["duplicate_of"], "toolu_1")
        self.assertEqual(self.p.applied(), 1)

    def test_timeout_reconciled_by_status_function(self):
        self.p.reset("stall", 0.9)
        t0 = time.monotonic()
        env = self.refund("sess_2", "toolu_1", ARGS)
        # the guard owns the deadline: it answered before the tool returned
        self.assertLess(time.monotonic() - t0, 0.85)
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(env["result"]["status"], "applied")
        self.assertEqual(self.p.applied(), 1)
        self.assertEqual(self.p.checks, 1)
        rec = self.guard.record("sess_2", "toolu_1")
        self.assertEqual(rec["resolution"], "reconciled")
        time.sleep(1.0)  # let the stalled run end (its late result is moot)
        self.assertEqual(self.guard.record("sess_2", "toolu_1")["resolution"],
                         "reconciled")


class ToolResults(LogTest):
    """What a tool returns is what is recorded: an async def tool is run
    to its end (its coroutine is never taken for the result), and a value
    json cannot encode is an error - the outcome unknown - never its str()
    recorded as succeeded (issue 17: a refund the record says went through
    and that never happened)."""

    def test_async_tool_runs_and_its_result_is_recorded(self):
        ledger = []
        with idem.Guard(self.log(), policy(NOCHECK_POLICY, 5000)) as g:
            @g.tool("refund_payment")
            async def refund(args, key):
                import asyncio
                await asyncio.sleep(0.01)
                ledger.append(key)
                return {"refund_id": "re_async"}
            env = refund("sess_a", "toolu_1", ARGS)
            self.assertEqual(env["status"], "succeeded", env)
            self.assertEqual(env["result"], {"refund_id": "re_async"})
            self.assertEqual(len(ledger), 1)
            rec = g.record("sess_a", "toolu_1")
            self.assertEqual(rec["result"], {"refund_id": "re_async"})

    def test_a_result_that_is_not_json_is_unknown_not_succeeded(self):
        ledger = []
        with idem.Guard(self.log(), policy(NOCHECK_POLICY, 5000)) as g:
            @g.tool("refund_payment")
            def refund(args, key):
                ledger.append(key)
                return object()
            env = refund("sess_b", "toolu_1", ARGS)
            self.assertEqual(env["status"], "outcome_unknown", env)
            self.assertIn("not JSON", env["message"])
            rec = g.record("sess_b", "toolu_1")
            self.assertEqual(rec["state"], "in_doubt")
            self.assertNotIn("object at", json.dumps(rec))
            self.assertEqual(len(ledger), 1)
            # and the step API refuses it outright
            step = g.begin("sess_b", "toolu_2", "refund_payment",
                           '{"order_id":"x"}')
            self.assertEqual(step.next, idem.Next.EXECUTE)
            with self.assertRaises(idem.MisuseError):
                step.finish(idem.APPLIED, result={1, 2})
            step.close()


class TimeoutWithoutStatus(LogTest):
    def test_unknown_fenced_late_already_applied(self):
        p = Provider()
        guard = idem.Guard(self.log(), policy(NOCHECK_POLICY))
        refund = guard.tool("refund_payment")(p.refund)
        p.reset("stall", 0.7)
        env = refund("sess_3", "toolu_1", ARGS)
        self.assertEqual(env["status"], "outcome_unknown")
        self.assertIn("Do not call refund_payment again", env["message"])
        # the model re-issues at once with a new call id: fenced
        env = refund("sess_3", "toolu_2", ARGS)
        self.assertEqual(env["status"], "outcome_unknown")
        self.assertEqual(env["duplicate_of"], "toolu_1")
        self.assertEqual(p.applied(), 1)
        # the provider finishes: the late result is recorded
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            rec = guard.record("sess_3", "toolu_1")
            if rec["state"] == "succeeded":
                break
            time.sleep(0.05)
        self.assertEqual(rec["state"], "succeeded")
        self.assertEqual(rec["resolution"], "late")
        self.assertEqual(rec["delivered"], 0)
        self.assertEqual(rec["result"]["refund_id"], "re_1")
        p.reset("ok")
        # the next re-issue: already applied, with the earlier result
        env = refund("sess_3", "toolu_3", ARGS)
        self.assertEqual(env["status"], "already_applied")
        self.assertEqual(env["duplicate_of"], "toolu_1")
        self.assertEqual(env["result"]["refund_id"], "re_1")
        self.assertEqual(p.applied(), 0)
        env = refund("sess_3", "toolu_3", ARGS)
        self.assertEqual(env["status"], "already_applied")
        self.assertIs(env["replayed"], True)
        # now the model has been told: a new identical call is a real repeat
        self.assertEqual(refund("sess_3", "toolu_4", ARGS,
                                turn=next_turn())["status"], "succeeded")
        self.assertEqual(p.applied(), 1)
        guard.close()


class TwoPhase(LogTest):
    def test_steps(self):
        guard = idem.Guard(self.log(), policy(REFUND_POLICY))
        with guard.begin("sess_5", "toolu_1", "refund_payment", ARGS) as s:
            self.assertEqual(s.next, idem.Next.EXECUTE)
            self.assertEqual(s.key, "sess_5:toolu_1:a280fb850f483293")
            self.assertEqual(s.args,
                             '{"amount_cents":6000,"order_id":"ord_1"}')
            self.assertEqual(s.attempt, 1)
            self.assertEqual(s.deadline_ms, 300)
            # the downstream call times out
            s.finish(idem.UNKNOWN, error="timeout")
            self.assertEqual(s.next, idem.Next.CHECK)
            self.assertEqual(s.check_tool, "get_refund_status")
            self.assertEqual(s.check_args, '{"order_id":"ord_1"}')
            self.assertEqual(s.check_key, "sess_5:toolu_1:a280fb850f483293")
            s.resolve(idem.UNKNOWN)
            self.assertEqual(s.next, idem.Next.ANSWER)
            self.assertEqual(s.answer, "outcome_unknown")
            env = s.envelope
            self.assertEqual(env["check_with"],
                             {"tool": "get_refund_status",
                              "arguments": {"order_id": "ord_1"}})
            s.delivered()
            # the late result arrives
            s.finish(idem.APPLIED, {"refund_id": "re_9"})
        with guard.begin("sess_5", "toolu_1", "refund_payment", ARGS) as s:
            self.assertEqual(s.next, idem.Next.ANSWER)
            self.assertEqual(s.answer, "succeeded")
            self.assertEqual(s.envelope["result"], {"refund_id": "re_9"})
            self.assertIs(s.envelope["replayed"], True)
        self.assertEqual(guard.record("sess_5", "toolu_1")["resolution"],
                         "late")
        # recover, settle and late by token
        with guard.begin("sess_5", "toolu_2", "refund_payment",
                         '{"order_id":"ord_2","amount_cents":1}') as s:
            s.finish(idem.UNKNOWN, error="reset")
            s.resolve(idem.UNKNOWN)
            self.assertEqual(s.answer, "outcome_unknown")
        with guard.recover("sess_5", "toolu_2") as s:
            self.assertEqual(s.next, idem.Next.CHECK)
            s.resolve(idem.APPLIED, result_json='{"refund_id":"re_10"}')
            self.assertEqual(s.answer, "succeeded")
        rec = guard.record("sess_5", "toolu_2")
        self.assertEqual((rec["state"], rec["resolution"]),
                         ("succeeded", "reconciled"))
        with self.assertRaises(idem.StaleError):
            guard.settle("sess_5", "toolu_2", rec["token"] - 1, idem.APPLIED,
                         {"x": 1})
        with self.assertRaises(idem.NotFoundError):
            guard.recover("sess_5", "nope")
        guard.close()
        with self.assertRaises(idem.MisuseError):
            guard.begin("s", "c", "refund_payment", ARGS)


class CallAndLate(LogTest):
    def test_undelivered_fences_again(self):
        # the answer's write failed: "told" is undone, so the model's
        # re-issue (a later turn, a new call id) is fenced, not run
        guard = idem.Guard(self.log(), policy(REFUND_POLICY))
        self.addCleanup(guard.close)
        with guard.begin("sess_u", "u1", "refund_payment", ARGS, "t1") as s:
            self.assertEqual(s.next, idem.Next.EXECUTE)
            s.finish(idem.APPLIED, {"refund_id": "re_u"})
            s.delivered()
            self.assertGreater(guard.record("sess_u", "u1")["delivered"], 0)
            s.undelivered()
        self.assertEqual(guard.record("sess_u", "u1")["delivered"], 0)
        with guard.begin("sess_u", "u2", "refund_payment", ARGS, "t2") as s:
            self.assertEqual(s.answer, "already_applied")
            self.assertEqual(s.envelope["duplicate_of"], "u1")

    def test_guard_call_and_late_by_token(self):
        p = Provider()
        with idem.Guard(self.log(), policy(NOCHECK_POLICY)) as g:
            # guard.call: the same as a decorated tool
            env = g.call("sess_6", "toolu_1", "refund_payment", ARGS,
                         p.refund)
            self.assertEqual(env["status"], "succeeded")
            env = g.call("sess_6", "toolu_1", "refund_payment", ARGS,
                         p.refund)
            self.assertIs(env["replayed"], True)
            self.assertEqual(p.applied(), 1)
            # a result that arrives elsewhere, after the deadline, by token
            args2 = '{"order_id":"ord_2","amount_cents":1}'
            with g.begin("sess_6", "toolu_2", "refund_payment", args2) as s:
                self.assertEqual(s.next, idem.Next.EXECUTE)
                token = s.token
                s.finish(idem.UNKNOWN, error="timeout")
                self.assertEqual(s.answer, "outcome_unknown")
                self.assertNotIn("check_with", s.envelope)  # no status
            self.assertEqual(g.record("sess_6", "toolu_2")["state"],
                             "in_doubt")
            g.late("sess_6", "toolu_2", token, idem.APPLIED,
                   {"refund_id": "re_late"})
            rec = g.record("sess_6", "toolu_2")
            self.assertEqual((rec["state"], rec["resolution"]),
                             ("succeeded", "late"))
            self.assertEqual(rec["result"], {"refund_id": "re_late"})
            # a second late result changes nothing
            g.late("sess_6", "toolu_2", token, idem.REJECTED, error="x")
            self.assertEqual(g.record("sess_6", "toolu_2")["state"],
                             "succeeded")


class PortablePath(LogTest):
    def test_call_json_without_the_bytes_layout(self):
        # the path taken where CPython's bytes layout cannot be measured
        from idem.guard import _call_json_portable as cj
        p = Provider()
        with idem.Guard(self.log(), policy(NOCHECK_POLICY)) as g:
            t = g.tool("refund_payment")(p.refund)
            e1 = json.loads(cj(t, "sess_8", "toolu_1", ARGS))
            e2 = json.loads(cj(t, "sess_8", "toolu_1", json.loads(ARGS)))
            self.assertEqual((e1["status"], e1["replayed"]),
                             ("succeeded", False))
            self.assertIs(e2["replayed"], True)
            self.assertEqual(t.call_json("sess_8", "toolu_1", ARGS),
                             cj(t, "sess_8", "toolu_1", ARGS))
            self.assertEqual(p.applied(), 1)
            with self.assertRaises(idem.InvalidError):
                cj(t, "sess_8", "a\0b", ARGS)


class PolicyKeysCanon(unittest.TestCase):
    def test_policy_file_and_explain(self):
        path = os.path.join(os.path.dirname(PKG), "..", "docs", "POLICY.md")
        self.assertTrue(os.path.exists(path))
        p = policy(REFUND_POLICY)
        self.assertEqual(p.tool_class("refund_payment"), "guarded")
        self.assertEqual(p.tool_class("get_refund_status"), "read_only")
        self.assertEqual(p.tool_class("rm_rf"), "refused")
        self.assertIn("get_refund_status", p.explain("refund_payment"))

    def test_keys_match_the_spec_snippet(self):
        import hashlib
        args = {"order_id": "ord_1", "amount_cents": 6000, "note": "x y"}
        snippet = json.dumps({"tool": "refund_payment", "args": args},
                             sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(snippet.encode()).hexdigest()
        k = idem.key("sess 1", "toolu_7", "refund_payment", args)
        self.assertEqual(k.key, "sess%201:toolu_7:" + digest[:16])
        self.assertEqual(k.fingerprint, digest)
        self.assertEqual(k.payload, snippet)
        k = idem.key("s", "c", "refund_payment",
                     {"order_id": "o", "idempotency_key": "model-made"},
                     key_arg="idempotency_key")
        self.assertEqual(k.args, '{"order_id":"o"}')
        self.assertTrue(idem.key("s", "c" * 300, "t", "{}").key
                        .startswith("h:"))

    def test_canon(self):
        self.assertEqual(idem.canon('{"b":1e3,"a":[6000.0,"\\u00e9"]}'),
                         '{"a":[6000,"é"],"b":1000}')
        self.assertEqual(idem.canon({"z": 1e21, "a": -0.0}),
                         '{"a":0,"z":1e+21}')
        with self.assertRaises(idem.DepthError):
            idem.canon("[[[1]]]", max_depth=2)
        self.assertEqual(idem.canon("[[[1]]]"), "[[[1]]]")  # limit restored


class ExampleHarness(LogTest):
    def test_example_runs_both_styles(self):
        ex = os.path.join(PKG, "examples", "refund_harness.py")
        out = subprocess.run([sys.executable, ex, "--log", self.log()],
                             capture_output=True, text=True, timeout=120,
                             env=dict(os.environ, PYTHONPATH=PKG))
        self.assertEqual(out.returncode, 0, out.stderr)
        lines = [json.loads(x) for x in out.stdout.splitlines()
                 if x.startswith("{")]
        by = {(x["style"], x["call_id"]): x["envelope"] for x in lines}
        self.assertEqual(by[("openai", "call_A1")]["status"], "succeeded")
        self.assertIs(by[("openai", "call_A1")]["replayed"], False)
        # the same decision delivered again (a transport retry)
        self.assertIs(by[("openai-retry", "call_A1")]["replayed"], True)
        # Anthropic style, reformatted arguments, a new id after the model
        # was told: a legitimate second refund
        self.assertEqual(by[("anthropic", "toolu_B1")]["status"],
                         "succeeded")
        self.assertEqual(by[("anthropic", "toolu_B1")]["result"]["refund_id"],
                         "re_2")
        self.assertEqual(by[("openai", "call_bad")]["status"],
                         "invalid_arguments")
        self.assertIn("refunds applied: 2", out.stdout)


class ToolCalls(unittest.TestCase):
    def test_parse(self):
        T = idem.ToolCall.parse
        self.assertEqual(
            T({"id": "call_1", "type": "function",
               "function": {"name": "refund_payment", "arguments": ARGS}}),
            ("call_1", "refund_payment", ARGS))
        self.assertEqual(
            T({"type": "tool_use", "id": "toolu_1", "name": "refund_payment",
               "input": {"order_id": "ord_1"}}),
            ("toolu_1", "refund_payment", {"order_id": "ord_1"}))
        self.assertEqual(
            T({"type": "function_call", "call_id": "call_2", "name": "x",
               "arguments": "{}"}), ("call_2", "x", "{}"))
        for bad in ({"id": "call_1", "function": {"arguments": "{}"}},
                    {"type": "tool_use", "name": "x", "input": {}},
                    {"type": "tool_use", "id": "toolu_1", "name": "x",
                     "input": 5},
                    {"foo": 1}):
            with self.assertRaises(idem.InvalidError):
                T(bad)
        with self.assertRaises(idem.MisuseError):
            T("call_1")


if __name__ == "__main__":
    unittest.main()

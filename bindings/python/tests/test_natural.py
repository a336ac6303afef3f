"""Natural tools (@guard.tool over a function with its own parameters):
the guarded function reads like the bare one, a call replays, fences and
coalesces as SPEC §6 says, the deadline is the guard's, what the tool
returns is what is recorded, and the ids come from idem.call_context (or
say what is missing).  Every refund is counted in a provider that does NOT
dedupe on the key."""
import asyncio
import contextvars
import inspect
import json
import time
import typing
import unittest
from concurrent.futures import ThreadPoolExecutor

from tests.support import (idem, ARGS, NOCHECK_POLICY, Provider, LogTest,
                           policy)

request_id = contextvars.ContextVar("request_id", default=None)


def refund_payment(order_id: str, amount_cents: int,
                   reason: str = "goodwill") -> dict:
    """Refund part of an order.

    Args:
        order_id: the order to refund.
        amount_cents: how much, in cents.
    """
    raise AssertionError("the bare function is never called here")


async def refund_payment_async(order_id: str, amount_cents: int) -> dict:
    """Refund part of an order, from asyncio."""
    raise AssertionError("the bare function is never called here")


class NaturalTest(LogTest):
    def guard(self, timeout_ms=3000, text=NOCHECK_POLICY):
        return idem.Guard(self.log(), policy(text, timeout_ms))

    def refund_tools(self, g, p):
        """A sync and an async natural refund tool over provider p."""
        @g.tool("refund_payment")
        def refund(order_id: str, amount_cents: int) -> dict:
            """Refund part of an order."""
            return p.refund({"order_id": order_id,
                             "amount_cents": amount_cents},
                            idem.current_key())

        @g.tool("refund_payment")
        async def refund_async(order_id: str, amount_cents: int) -> dict:
            """Refund part of an order."""
            await asyncio.sleep(0.01)
            return p.refund({"order_id": order_id,
                             "amount_cents": amount_cents},
                            idem.current_key())
        return refund, refund_async

    def statuses(self, envs):
        return sorted(e["status"] for e in envs)


class ReadsLikeTheBareFunction(NaturalTest):
    def test_signature_hints_docstring_wrapped(self):
        with self.guard() as g:
            for bare in (refund_payment, refund_payment_async):
                with self.subTest(bare=bare.__name__):
                    t = g.tool("refund_payment")(bare)
                    self.assertEqual(inspect.signature(t),
                                     inspect.signature(bare))
                    # __signature__, for a reader that does not unwrap
                    self.assertEqual(inspect.signature(
                        t, follow_wrapped=False), inspect.signature(bare))
                    self.assertEqual(
                        typing.get_type_hints(t, include_extras=True),
                        typing.get_type_hints(bare, include_extras=True))
                    self.assertEqual(t.__doc__, bare.__doc__)
                    self.assertEqual(inspect.getdoc(t), inspect.getdoc(bare))
                    self.assertEqual(t.__name__, bare.__name__)
                    self.assertEqual(t.__qualname__, bare.__qualname__)
                    self.assertEqual(t.__module__, bare.__module__)
                    self.assertIs(t.__wrapped__, bare)
                    self.assertIs(t.__globals__, bare.__globals__)
                    self.assertEqual(inspect.iscoroutinefunction(t),
                                     inspect.iscoroutinefunction(bare))
                    self.assertIsInstance(t.guarded, idem.GuardedTool)

    def test_the_forms_told_apart(self):
        with self.guard() as g:
            def old(args, key):
                return {"ok": 1}

            def typed_old(args: dict, key: str) -> dict:
                return {"ok": 1}
            for fn in (old, typed_old, lambda a, k: {"ok": 1},
                       Provider().refund):
                self.assertIsInstance(g.tool("t")(fn), idem.GuardedTool)
            for fn in (refund_payment, lambda order_id=1: 1,
                       lambda a, k, c: 1):
                self.assertNotIsInstance(g.tool("t")(fn), idem.GuardedTool)
            self.assertNotIsInstance(g.tool("t", natural=True)(old),
                                     idem.GuardedTool)
            self.assertIsInstance(g.tool("t", natural=False)(refund_payment),
                                  idem.GuardedTool)
            # the tool's name defaults to the function's
            self.assertEqual(g.tool()(refund_payment).guarded.name,
                             "refund_payment")


class OneTurnThreeRefunds(NaturalTest):
    """One model turn carrying three identical refunds with distinct
    tool-call ids: one refund, answered succeeded / already_applied x2."""

    def test_thread_pool_like_tool_node(self):
        p = Provider()
        with self.guard() as g:
            refund, _ = self.refund_tools(g, p)

            def one(i):
                with idem.call_context(call_id="call_%d" % i):
                    return refund("ord_1", 6000)
            with idem.call_context(session="s1", turn="ai_msg_1"):
                with ThreadPoolExecutor(3) as pool:
                    # each task in a copy of the harness's context, made
                    # where it is submitted, as LangChain's executor does
                    envs = [f.result() for f in [
                        pool.submit(contextvars.copy_context().run, one, i)
                        for i in range(3)]]
            self.assertEqual(p.applied(), 1)
            self.assertEqual(self.statuses(envs), [
                "already_applied", "already_applied", "succeeded"])
            ran = [e for e in envs if e["status"] == "succeeded"][0]
            for e in envs:
                self.assertEqual(e["result"], ran["result"])

    def test_asyncio_gather(self):
        p = Provider()
        with self.guard() as g:
            _, refund = self.refund_tools(g, p)

            async def one(i):
                with idem.call_context(call_id="call_%d" % i):
                    return await refund("ord_1", 6000)

            async def turn():
                with idem.call_context(session="s2", turn="resp_1"):
                    return await asyncio.gather(*[one(i) for i in range(3)])
            envs = asyncio.run(turn())
            self.assertEqual(p.applied(), 1)
            self.assertEqual(self.statuses(envs), [
                "already_applied", "already_applied", "succeeded"])


class Replays(NaturalTest):
    def test_twice_with_the_same_call_id_runs_once(self):
        p = Provider()
        with self.guard() as g:
            refund, refund_async = self.refund_tools(g, p)
            with idem.call_context(session="s3", call_id="toolu_1"):
                first = refund("ord_1", 6000)
                again = refund("ord_1", 6000)
            self.assertEqual(first["status"], "succeeded")
            self.assertIs(first["replayed"], False)
            self.assertIs(again["replayed"], True)
            self.assertEqual(again["result"], first["result"])
            self.assertEqual(p.calls, 1)

            async def twice():
                with idem.call_context(session="s3", call_id="toolu_2"):
                    return (await refund_async("ord_2", 100),
                            await refund_async("ord_2", 100))
            first, again = asyncio.run(twice())
            self.assertIs(first["replayed"], False)
            self.assertIs(again["replayed"], True)
            self.assertEqual(p.calls, 2)
            # the key is the SPEC §3 key of the arguments as given
            self.assertEqual(p.ledger[0], idem.key(
                "s3", "toolu_1", "refund_payment", ARGS).key)

    def test_the_answer_is_the_envelope(self):
        p = Provider()
        with self.guard() as g:
            refund, _ = self.refund_tools(g, p)
            with idem.call_context(session="s4", call_id="toolu_1"):
                env = refund(order_id="ord_1", amount_cents=6000)
            self.assertIsInstance(env, idem.Envelope)
            self.assertEqual(str(env), env.text)
            self.assertEqual(json.loads(str(env)), env)
            self.assertEqual(env["result"], {"refund_id": "re_1",
                                             "amount_cents": 6000})


class TheDeadlineIsTheGuards(NaturalTest):
    """A refund that hangs past the deadline and then applies, sync and
    async: outcome_unknown at the deadline, the model's re-issue (a new
    call id, a later turn) fenced while it may land, one refund in the
    end."""

    def check(self, kind):
        ledger = []
        with self.guard(timeout_ms=200) as g:
            if kind == "sync":
                @g.tool("refund_payment")
                def refund(order_id: str, amount_cents: int) -> dict:
                    time.sleep(0.6)
                    ledger.append(idem.current_key())
                    return {"refund_id": "late"}

                async def call(call_id, turn):
                    with idem.call_context(call_id=call_id, turn=turn):
                        return refund("ord_1", 6000)  # blocks: fine here
            else:
                @g.tool("refund_payment")
                async def refund(order_id: str, amount_cents: int) -> dict:
                    await asyncio.sleep(0.6)
                    ledger.append(idem.current_key())
                    return {"refund_id": "late"}

                async def call(call_id, turn):
                    with idem.call_context(call_id=call_id, turn=turn):
                        return await refund("ord_1", 6000)

            async def story():
                with idem.call_context(session="s5"):
                    first = await call("c1", "t1")
                    again = await call("c2", "t2")  # while it hangs
                    await asyncio.sleep(0.8)  # it lands, and is recorded
                    return first, again
            first, again = asyncio.run(story())
            self.assertEqual(first["status"], "outcome_unknown", kind)
            self.assertIn("no answer within 200 ms", first["message"])
            self.assertEqual(again["status"], "outcome_unknown", kind)
            self.assertEqual(again["duplicate_of"], "c1", kind)
            rec = g.record("s5", "c1")
            self.assertEqual(rec["state"], "succeeded", kind)
            self.assertEqual(rec["resolution"], "late", kind)

            async def later():
                with idem.call_context(session="s5"):
                    return await call("c3", "t3")
            third = asyncio.run(later())
            self.assertEqual(len(ledger), 1, kind)
            self.assertEqual(third["status"], "already_applied", kind)

    def test_a_late_status_check_proves_nothing(self):
        # through acall, a status check that answers "not applied" after
        # its own deadline, while the refund is still on its way: dropped,
        # not recorded; the refund lands and is the one recorded
        text = """{"tools":{"refund_payment":{"class":"guarded",
          "timeout_ms":%(t)d,"reconcile_timeout_ms":100,"retries":0,
          "status":{"tool":"get_refund_status","arguments":{}}},
          "get_refund_status":{"class":"read_only"}}}"""
        ledger = []

        def status(args, key):
            time.sleep(0.3)  # answers after its deadline: not applied yet
            return None
        with self.guard(timeout_ms=150, text=text) as g:
            @g.tool("refund_payment", status=status)
            def refund(order_id: str) -> dict:
                time.sleep(0.8)
                ledger.append(idem.current_key())
                return {"refund_id": "late"}

            async def main():
                with idem.call_context(session="s10", call_id="c1"):
                    env = await refund.guarded.acall(
                        "s10", "c1", {"order_id": "o"})
                await asyncio.sleep(0.4)  # the check's late "not applied"
                mid = g.record("s10", "c1")["state"]
                await asyncio.sleep(0.6)  # the refund lands
                return env, mid
            env, mid = asyncio.run(main())
            self.assertEqual(env["status"], "outcome_unknown")
            self.assertEqual(mid, "in_doubt")
            rec = g.record("s10", "c1")
            self.assertEqual((rec["state"], rec["resolution"]),
                             ("succeeded", "late"))
            self.assertEqual(len(ledger), 1)

    def test_sync(self):
        self.check("sync")

    def test_async(self):
        self.check("async")


class WhatIsRecorded(NaturalTest):
    def test_an_async_tool_applies_once_with_its_result(self):
        p = Provider()
        with self.guard() as g:
            _, refund = self.refund_tools(g, p)

            async def main():
                with idem.call_context(session="s6", call_id="c1"):
                    return await refund("ord_1", 6000)
            env = asyncio.run(main())
            self.assertEqual(env["status"], "succeeded")
            self.assertEqual(env["result"], {"refund_id": "re_1",
                                             "amount_cents": 6000})
            self.assertEqual(p.applied(), 1)
            rec = g.record("s6", "c1")
            self.assertEqual(rec["state"], "succeeded")
            self.assertEqual(rec["result"], env["result"])

    def test_a_result_that_is_not_json_is_an_error_recorded_unknown(self):
        ran = []
        with self.guard() as g:
            @g.tool("refund_payment")
            def refund(order_id: str, amount_cents: int) -> dict:
                ran.append(order_id)
                return object()

            @g.tool("refund_payment")
            async def refund_async(order_id: str, amount_cents: int) -> dict:
                ran.append(order_id)
                return {1, 2}
            with idem.call_context(session="s7", call_id="c1"):
                env = refund("ord_1", 6000)

            async def main():
                with idem.call_context(session="s7", call_id="c2"):
                    return await refund_async("ord_2", 6000)
            env2 = asyncio.run(main())
            for e, call_id, what in ((env, "c1", "object"),
                                     (env2, "c2", "set")):
                self.assertEqual(e["status"], "outcome_unknown", e)
                self.assertIn("returned %s, which is not JSON" % what,
                              e["message"])
                rec = g.record("s7", call_id)
                self.assertEqual(rec["state"], "in_doubt")
                self.assertIsNone(rec["result"])
                self.assertNotIn(" at 0x", json.dumps(rec))
            self.assertEqual(ran, ["ord_1", "ord_2"])


class CallContexts(NaturalTest):
    def test_contextvars_reach_the_tool(self):
        seen = []
        with self.guard() as g:
            @g.tool("refund_payment")
            def refund(order_id: str) -> dict:
                seen.append((order_id, request_id.get(),
                             idem.current_key() is not None))
                return {"ok": True}

            @g.tool("refund_payment")
            async def refund_async(order_id: str) -> dict:
                seen.append((order_id, request_id.get(),
                             idem.current_key() is not None))
                return {"ok": True}
            request_id.set("req-1")
            with idem.call_context(session="s8", call_id="c1"):
                refund("a")  # the tool runs on the guard's worker thread

            def on_a_thread():
                request_id.set("req-2")
                with idem.call_context(session="s8", call_id="c2"):
                    return refund("b")
            with ThreadPoolExecutor(1) as pool:
                pool.submit(on_a_thread).result()

            async def main():
                request_id.set("req-3")
                with idem.call_context(session="s8", call_id="c3"):
                    await refund_async("c")
                with idem.call_context(session="s8", call_id="c4"):
                    await refund.guarded.acall("s8", "c4", {"order_id": "d"})
            asyncio.run(main())
        self.assertEqual(seen, [("a", "req-1", True), ("b", "req-2", True),
                                ("c", "req-3", True), ("d", "req-3", True)])
        self.assertIsNone(idem.current_key())

    def test_no_context_says_what_to_set_and_runs_nothing(self):
        p = Provider()
        with self.guard() as g:
            refund, refund_async = self.refund_tools(g, p)
            with self.assertRaises(idem.MisuseError) as cm:
                refund("ord_1", 6000)
            msg = str(cm.exception)
            self.assertIn("no call id", msg)
            self.assertIn("idem.call_context(", msg)
            self.assertIn("InjectedToolCallId", msg)
            self.assertIn("ToolContext", msg)
            with idem.call_context(call_id="c1"):
                with self.assertRaises(idem.MisuseError) as cm:
                    asyncio.run(refund_async("ord_1", 6000))
            self.assertIn("no session", str(cm.exception))
            self.assertIn("session=", str(cm.exception))
            self.assertEqual(p.calls, 0)
            with self.assertRaises(idem.NotFoundError):
                g.record("s", "c1")
            # the decorator's default session
            dflt = g.tool("refund_payment", session="dflt")(
                lambda order_id=None: {"ok": 1})
            with idem.call_context(call_id="c9"):
                self.assertEqual(dflt(order_id="o")["status"], "succeeded")
            self.assertEqual(g.record("dflt", "c9")["state"], "succeeded")

    def test_call_context_nests_and_checks(self):
        self.assertEqual(idem.current_call(), (None, None, None))
        with idem.call_context(session="run_1"):
            with idem.call_context(turn="msg_1"):
                with idem.call_context(call_id="call_1") as c:
                    self.assertEqual(c, ("run_1", "call_1", "msg_1"))
                    self.assertEqual(idem.current_call(), c)
                with idem.call_context(session="run_2"):
                    self.assertEqual(idem.current_call(),
                                     ("run_2", None, "msg_1"))
            self.assertEqual(idem.current_call(), ("run_1", None, None))
        with self.assertRaises(idem.MisuseError):
            with idem.call_context(call_id=7):
                pass
        with self.assertRaises(idem.InvalidError):
            with idem.call_context(turn=""):
                pass

    def test_key_arg_gets_the_key_not_the_models_value(self):
        text = """{"tools":{"refund_payment":{"class":"guarded",
          "timeout_ms":%(t)d,"key_arg":"idempotency_key"}}}"""
        got = []
        with self.guard(text=text) as g:
            @g.tool("refund_payment")
            def refund(order_id: str, idempotency_key: str = "") -> dict:
                got.append((idempotency_key, idem.current_key()))
                return {"ok": True}
            with idem.call_context(session="s9", call_id="c1"):
                env = refund("ord_1", idempotency_key="chosen-by-the-model")

            @g.tool("refund_payment")
            def plain(order_id: str) -> dict:
                return {"key": idem.current_key()}
            # called with explicit ids: the arguments by name, less the key
            # the library wrote into a key_arg the function does not take
            env2 = plain.guarded("s9", "c2", {"order_id": "o",
                                              "idempotency_key": "x"})
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(got, [(env["idempotency_key"],) * 2])
        self.assertEqual(env2["status"], "succeeded", env2)
        self.assertEqual(env2["result"]["key"], env2["idempotency_key"])


if __name__ == "__main__":
    unittest.main()

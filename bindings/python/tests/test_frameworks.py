"""Guarded natural tools under the decorators of LangChain / LangGraph, the
OpenAI Agents SDK and the MCP Python SDK (FastMCP), without installing
them: each framework's schema is read from the guarded function exactly as
that framework reads it (tests/frameworks.py: inspect.signature,
typing.get_type_hints, the docstring, what it injects) and compared with
the bare function's; then the guarded tool is driven the way the framework
calls it - ToolNode: a thread pool over one AI message's tool calls (or
asyncio.gather from ainvoke); the Agents SDK: asyncio.gather over one
response's function calls, with a ToolContext first; FastMCP: concurrent
requests with a Context - and the ids are read from what the framework
hands the tool.  One refund per turn in a provider that does not dedupe."""
import asyncio
import contextvars
import inspect
import json
import typing
import unittest
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Annotated

from tests import frameworks as fw, future_tools
from tests.support import idem, NOCHECK_POLICY, Provider, LogTest, policy

REFUND = {"order_id": "ord_1", "amount_cents": 6000}


class Frameworks(LogTest):
    def setUp(self):
        super().setUp()
        self.p = Provider()
        self.g = idem.Guard(self.log(), policy(NOCHECK_POLICY, 3000))

    def tearDown(self):
        self.g.close()
        super().tearDown()

    def apply(self, order_id, amount_cents):
        return self.p.refund({"order_id": order_id,
                              "amount_cents": amount_cents},
                             idem.current_key())

    def one_refund(self, envs):
        self.assertEqual(self.p.applied(), 1)
        self.assertEqual(sorted(e["status"] for e in envs),
                         ["already_applied", "already_applied", "succeeded"])
        ran = [e for e in envs if e["status"] == "succeeded"][0]
        for e in envs:
            if e is not ran:
                self.assertEqual(e["duplicate_of"], ran["call_id"])
        return ran


class LangGraph(Frameworks):
    def tools(self):
        apply = self.apply

        def refund_payment(order_id: str, amount_cents: int,
                           tool_call_id: Annotated[str,
                                                   fw.InjectedToolCallId],
                           state: Annotated[dict, fw.InjectedState]) -> dict:
            """Refund part of an order."""
            return apply(order_id, amount_cents)

        async def refund_async(order_id: str, amount_cents: int,
                               tool_call_id: Annotated[
                                   str, fw.InjectedToolCallId()]) -> dict:
            """Refund part of an order."""
            await asyncio.sleep(0.01)
            return apply(order_id, amount_cents)
        return refund_payment, refund_async

    def ai_message(self, msg_id):
        return fw.AIMessage("", [{"name": "refund_payment", "args": REFUND,
                                  "id": "call_%s" % c, "type": "tool_call"}
                                 for c in "abc"], id=msg_id)

    def test_the_schema_is_the_bare_functions(self):
        for bare in self.tools() + (future_tools.refund_tool_node,):
            with self.subTest(bare=bare.__name__):
                guarded = self.g.tool("refund_payment")(bare)
                want = fw.langchain_schema(bare)
                self.assertEqual(fw.langchain_schema(guarded), want)
                # the injected id stays in the signature the framework
                # sees, annotated, so that it fills it in and hides it
                self.assertIn("tool_call_id", [n for n, _ in want["injected"]])
                self.assertNotIn("tool_call_id",
                                 [m[0] for m in want["model"]])

    def test_tool_node_thread_pool_one_turn(self):
        bare, _ = self.tools()
        tool = self.g.tool("refund_payment")(bare)
        msg = self.ai_message("run-ai-1")
        state = {"messages": [msg]}

        def node():
            # ToolNode.invoke: each tool call on an executor that runs it
            # in a copy of the context (as langchain's executor submits),
            # the id and the state filled in from the tool call
            with ThreadPoolExecutor(len(msg.tool_calls)) as pool:
                fs = [pool.submit(contextvars.copy_context().run, tool,
                                  **tc["args"], tool_call_id=tc["id"],
                                  state=state)
                      for tc in msg.tool_calls]
                return [f.result() for f in fs]
        with idem.call_context(session="thread_1"):  # around graph.invoke
            envs = node()
        ran = self.one_refund(envs)
        rec = self.g.record("thread_1", ran["call_id"])
        self.assertEqual(rec["turn"], "run-ai-1")  # the AI message's id
        # the model's next turn re-issues it: a new decision
        msg2 = fw.AIMessage("", [{"name": "refund_payment", "args": REFUND,
                                  "id": "call_d"}], id="run-ai-2")
        with idem.call_context(session="thread_1"):
            env = tool(**REFUND, tool_call_id="call_d",
                       state={"messages": [msg, msg2]})
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(self.g.record("thread_1", "call_d")["turn"],
                         "run-ai-2")
        self.assertEqual(self.p.applied(), 2)

    def test_tool_node_ainvoke_gather_one_turn(self):
        _, bare = self.tools()
        tool = self.g.tool("refund_payment")(bare)
        msg = self.ai_message("run-ai-7")

        async def graph():
            with idem.call_context(session="thread_2", turn=msg.id):
                return await asyncio.gather(*[
                    tool(**tc["args"], tool_call_id=tc["id"])
                    for tc in msg.tool_calls])
        self.one_refund(asyncio.run(graph()))

    def test_tool_runtime_carries_every_id(self):
        apply = self.apply

        def refund_payment(order_id: str, amount_cents: int,
                           runtime: fw.ToolRuntime) -> dict:
            """Refund part of an order."""
            return apply(order_id, amount_cents)
        tool = self.g.tool("refund_payment")(refund_payment)
        self.assertEqual(fw.langchain_schema(tool),
                         fw.langchain_schema(refund_payment))
        msg = self.ai_message("run-ai-9")
        config = {"configurable": {"thread_id": "thread_9"}}
        with ThreadPoolExecutor(3) as pool:
            envs = list(pool.map(lambda tc: tool(**tc["args"], runtime=(
                fw.ToolRuntime({"messages": [msg]}, None, config, None,
                               tc["id"], None))), msg.tool_calls))
        ran = self.one_refund(envs)
        self.assertEqual(self.g.record("thread_9", ran["call_id"])["turn"],
                         "run-ai-9")

    def test_runnable_config_names_the_session(self):
        apply = self.apply

        def refund_payment(order_id: str, amount_cents: int,
                           tool_call_id: Annotated[str,
                                                   fw.InjectedToolCallId],
                           config: fw.RunnableConfig) -> dict:
            """Refund part of an order."""
            return apply(order_id, amount_cents)
        tool = self.g.tool("refund_payment")(refund_payment)
        self.assertEqual(fw.langchain_schema(tool),
                         fw.langchain_schema(refund_payment))
        env = tool(**REFUND, tool_call_id="call_x",
                   config={"configurable": {"thread_id": "thread_x"}})
        self.assertEqual(env["status"], "succeeded")
        self.assertEqual(self.g.record("thread_x", "call_x")["state"],
                         "succeeded")


class AgentsSDK(Frameworks):
    def tools(self):
        apply = self.apply

        async def refund_payment(ctx: fw.ToolContext, order_id: str,
                                 amount_cents: int) -> dict:
            """Refund part of an order.

            Args:
                order_id: the order to refund.
                amount_cents: how much, in cents.
            """
            await asyncio.sleep(0.01)
            return apply(order_id, amount_cents)

        def refund_sync(ctx: fw.RunContextWrapper, order_id: str,
                        amount_cents: int) -> dict:
            """Refund part of an order."""
            return apply(order_id, amount_cents)
        return refund_payment, refund_sync

    def test_the_schema_is_the_bare_functions(self):
        for bare in self.tools():
            with self.subTest(bare=bare.__name__):
                guarded = self.g.tool("refund_payment")(bare)
                want = fw.agents_schema(bare)
                self.assertTrue(want["takes_context"])
                self.assertEqual(fw.agents_schema(guarded), want)

    def run_response(self, tool, sync=False):
        """The Runner's turn: one model response's function calls at once,
        each given a ToolContext; a sync tool on a thread
        (asyncio.to_thread, which carries the context)."""
        async def invoke(call_id):
            ctx = fw.ToolContext(context=None, tool_name="refund_payment",
                                 tool_call_id=call_id,
                                 tool_arguments=json.dumps(REFUND))
            if sync:
                return await asyncio.to_thread(tool, ctx, **REFUND)
            return await tool(ctx, **REFUND)

        async def run():
            with idem.call_context(session="run_1"):  # around Runner.run
                return await asyncio.gather(*[
                    invoke("call_%s_%d" % (sync, i)) for i in range(3)])
        return asyncio.run(run())

    def test_one_response_three_calls_async(self):
        tool, _ = self.tools()
        # no turn id: the Agents SDK has none to give; the three calls
        # begin together, within coalesce_ms: one turn
        self.one_refund(self.run_response(self.g.tool("refund_payment")(tool)))

    def test_one_response_three_calls_sync_on_threads(self):
        _, tool = self.tools()
        self.one_refund(self.run_response(self.g.tool("refund_payment")(tool),
                                          sync=True))


class MCP(Frameworks):
    def tools(self):
        apply = self.apply

        async def refund_payment(order_id: str, amount_cents: int,
                                 ctx: fw.Context) -> dict:
            """Refund part of an order."""
            await asyncio.sleep(0.01)
            return apply(order_id, amount_cents)
        return refund_payment

    def context(self, request_id, connection, **meta):
        return fw.Context(fw.RequestContext(
            request_id, fw.Meta(**meta) if meta else None, connection))

    def test_the_schema_is_the_bare_functions(self):
        for bare in (self.tools(), future_tools.refund_payment):
            with self.subTest(bare=bare.__module__):
                guarded = self.g.tool("refund_payment")(bare)
                want = fw.mcp_schema(bare)
                self.assertEqual(want["context_kwarg"], "ctx")
                self.assertEqual(fw.mcp_schema(guarded), want)
        # text annotations resolve through the guarded function too
        guarded = self.g.tool("refund_payment")(future_tools.refund_payment)
        self.assertEqual(
            typing.get_type_hints(guarded),
            typing.get_type_hints(future_tools.refund_payment))

    def test_meta_ids_one_turn(self):
        tool = self.g.tool("refund_payment")(self.tools())
        conn = fw.ServerSession()

        async def requests():
            return await asyncio.gather(*[tool(**REFUND, ctx=self.context(
                i, conn, **{"io.idem/session": "run_5",
                            "io.idem/call_id": "toolu_%d" % i,
                            "io.idem/turn": "msg_5"})) for i in range(3)])
        ran = self.one_refund(asyncio.run(requests()))
        self.assertEqual(self.g.record("run_5", ran["call_id"])["turn"],
                         "msg_5")
        # a bad id in _meta: refused, nothing run
        with self.assertRaises(idem.InvalidError) as cm:
            asyncio.run(tool(**REFUND, ctx=self.context(
                9, conn, **{"io.idem/call_id": ""})))
        self.assertIn('_meta "io.idem/call_id" is empty', str(cm.exception))
        self.assertEqual(self.p.calls, 1)

    def test_request_ids_are_scoped_to_their_connection(self):
        tool = self.g.tool("refund_payment", session="desktop")(self.tools())
        first, second = fw.ServerSession(), fw.ServerSession()

        async def request(rid, conn, args):
            return await tool(**args, ctx=self.context(rid, conn))
        a = asyncio.run(request(1, first, REFUND))
        again = asyncio.run(request(1, first, REFUND))
        self.assertEqual(a["status"], "succeeded")
        self.assertIs(again["replayed"], True)
        self.assertTrue(a["call_id"].startswith("jsonrpc:"), a["call_id"])
        self.assertTrue(a["call_id"].endswith(":1"), a["call_id"])
        # a client restarted numbers its requests from 1 again: a new
        # connection, a new call (a refund of another order is made)
        other = dict(REFUND, order_id="ord_2")
        b = asyncio.run(request(1, second, other))
        self.assertEqual(b["status"], "succeeded")
        self.assertIs(b["replayed"], False)
        self.assertNotEqual(b["call_id"], a["call_id"])
        self.assertEqual(self.p.applied(), 2)

    def test_no_session_anywhere_draws_one_and_says_so(self):
        tool = self.g.tool("refund_payment")(self.tools())
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            env = asyncio.run(tool(**REFUND, ctx=self.context(
                3, fw.ServerSession(), **{"io.idem/call_id": "toolu_9"})))
        self.assertEqual(env["status"], "succeeded")
        self.assertTrue(env["idempotency_key"].startswith("mcp-"))
        self.assertTrue(any("no session" in str(x.message) for x in w))

    def test_outside_a_request_says_what_to_set(self):
        tool = self.g.tool("refund_payment")(self.tools())
        with self.assertRaises(idem.MisuseError) as cm:
            asyncio.run(tool(**REFUND, ctx=fw.Context(None)))
        self.assertIn("no call id", str(cm.exception))
        self.assertEqual(self.p.calls, 0)


class Recognised(unittest.TestCase):
    """The markers, by name and module, never by import."""

    def test_kinds(self):
        from idem.natural import kind_of
        cases = [
            (Annotated[str, fw.InjectedToolCallId], "tool_call_id"),
            (Annotated[str, fw.InjectedToolCallId()], "tool_call_id"),
            (Annotated[dict, fw.InjectedState("messages")], "state"),
            (Annotated[object, fw.InjectedStore()], "injected"),
            (fw.ToolRuntime, "runtime"),
            (fw.RunnableConfig, "config"),
            (typing.Optional[fw.RunnableConfig], "config"),
            (fw.ToolContext, "agents"),
            (fw.RunContextWrapper, "agents"),
            (fw.Context, "mcp"),
            ("Annotated[str, InjectedToolCallId]", "tool_call_id"),
            (str, None), (int, None), (dict, None),
            (Annotated[str, "a description"], None),
            (inspect.Parameter.empty, None),
        ]
        for ann, kind in cases:
            with self.subTest(ann=ann):
                self.assertEqual(kind_of(ann), kind)

        class Context:  # another package's Context is an argument
            pass
        self.assertIsNone(kind_of(Context))


if __name__ == "__main__":
    unittest.main()

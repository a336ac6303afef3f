#!/usr/bin/env python3
"""A LangGraph / LangChain tool guarded by idem: ToolNode runs one AI
message's three identical refund calls (the model repeated itself) and one
refund is made; the other two are answered already_applied.

Needs langgraph and langchain-core (pip install langgraph); no model, no
API key: the AI message is written here as a model would send it.

    PYTHONPATH=bindings/python python3 bindings/python/examples/langgraph_refund.py

The three lines: the Guard, @guard.tool under @tool, and the tool's
``tool_call_id: Annotated[str, InjectedToolCallId]`` parameter (LangGraph
fills it in and hides it from the model; idem reads the call id there).
The ``state: Annotated[dict, InjectedState]`` parameter gives idem the turn
(the id of the AI message carrying the call); the session is the graph's
thread, named with idem.call_context around the invocation.
"""
import os
import tempfile
import threading
from typing import Annotated

from langchain_core.messages import AIMessage, HumanMessage
from langchain_core.tools import InjectedToolCallId, tool
from langgraph.prebuilt import InjectedState, ToolNode

import idem

POLICY = """{"tools": {"refund_payment": {"class": "guarded",
  "timeout_ms": 5000, "retries": 1}}}"""


class PaymentProvider:
    """Stand-in for a payment API; it does NOT dedupe: every call refunds."""

    def __init__(self):
        self.mu = threading.Lock()
        self.refunds = []

    def create_refund(self, order_id, amount_cents, idempotency_key):
        with self.mu:
            self.refunds.append((order_id, amount_cents, idempotency_key))
            return {"refund_id": "re_%d" % len(self.refunds)}

    def find_refund(self, idempotency_key):
        with self.mu:
            for i, r in enumerate(self.refunds):
                if r[2] == idempotency_key:
                    return {"refund_id": "re_%d" % (i + 1)}
        return None


psp = PaymentProvider()
log = os.environ.get("IDEM_LOG") or "sqlite:" + os.path.join(
    tempfile.mkdtemp(), "attempts.db")
guard = idem.Guard(log, idem.Policy(text=POLICY))


@tool
@guard.tool("refund_payment",
            status=lambda args, key: psp.find_refund(key))
def refund_payment(order_id: str, amount_cents: int,
                   tool_call_id: Annotated[str, InjectedToolCallId],
                   state: Annotated[dict, InjectedState]) -> dict:
    """Refund part of an order to the customer's card."""
    return psp.create_refund(order_id, amount_cents,
                             idempotency_key=idem.current_key())


def main():
    node = ToolNode([refund_payment])
    call = {"name": "refund_payment", "type": "tool_call",
            "args": {"order_id": "ord_1", "amount_cents": 6000}}
    ai = AIMessage(content="", id="run-ai-1", tool_calls=[
        dict(call, id="call_%d" % i) for i in range(3)])
    with idem.call_context(session="thread-1"):  # the graph's thread
        out = node.invoke({"messages": [HumanMessage("refund order 1"), ai]})
    for m in out["messages"]:
        print(m.tool_call_id, m.content)
    print("refunds made: %d" % len(psp.refunds))  # 1


if __name__ == "__main__":
    main()

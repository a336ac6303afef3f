#!/usr/bin/env python3
"""An OpenAI Agents SDK tool guarded by idem.

Needs openai-agents (pip install openai-agents).  Without a model (no
OPENAI_API_KEY) it invokes the tool the way the Runner does for one model
response with three identical refund calls - each with its ToolContext,
all at once - and one refund is made; with OPENAI_API_KEY set it also runs
the agent.

    PYTHONPATH=bindings/python python3 bindings/python/examples/agents_sdk_refund.py

The three lines: the Guard, @guard.tool under @function_tool, and the
tool's first parameter ``ctx: ToolContext`` (the SDK passes it and keeps
it out of the schema; idem reads ``ctx.tool_call_id``).  The session is the
agent's run, named with idem.call_context around Runner.run.  The SDK has
no id for the model response: identical calls that begin within the
tool's coalesce_ms (one second by default) count as one turn.
"""
import asyncio
import json
import os
import tempfile

from agents import Agent, Runner, function_tool
from agents.tool_context import ToolContext

import idem

POLICY = """{"tools": {"refund_payment": {"class": "guarded",
  "timeout_ms": 5000, "retries": 1}}}"""

refunds = {}  # idempotency key -> refund: a stand-in for the payment API
log = os.environ.get("IDEM_LOG") or "sqlite:" + os.path.join(
    tempfile.mkdtemp(), "attempts.db")
guard = idem.Guard(log, idem.Policy(text=POLICY))


@function_tool
@guard.tool("refund_payment", status=lambda args, key: refunds.get(key))
async def refund_payment(ctx: ToolContext, order_id: str,
                         amount_cents: int) -> dict:
    """Refund part of an order to the customer's card.

    Args:
        order_id: The order to refund.
        amount_cents: How much to refund, in cents.
    """
    await asyncio.sleep(0.05)  # the payment API
    key = idem.current_key()
    refunds[key] = {"refund_id": "re_%d" % (len(refunds) + 1),
                    "order_id": order_id, "amount_cents": amount_cents}
    return refunds[key]


async def one_response():
    """Three identical function calls of one model response, invoked as
    the Runner invokes them."""
    args = json.dumps({"order_id": "ord_1", "amount_cents": 6000})

    async def invoke(call_id):
        ctx = ToolContext(context=None, tool_name="refund_payment",
                          tool_call_id=call_id, tool_arguments=args)
        return await refund_payment.on_invoke_tool(ctx, args)
    with idem.call_context(session="run-1"):
        return await asyncio.gather(*[invoke("call_%d" % i)
                                      for i in range(3)])


async def main():
    for out in await one_response():
        print(out)
    print("refunds made: %d" % len(refunds))  # 1
    if os.environ.get("OPENAI_API_KEY"):
        agent = Agent(name="Support", tools=[refund_payment],
                      instructions="Refund what the customer asks for.")
        with idem.call_context(session="run-2"):
            result = await Runner.run(agent, "Refund 60 dollars on ord_2.")
        print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())

#!/usr/bin/env python3
"""An MCP server (the MCP Python SDK's FastMCP) whose refund tool is
guarded by idem in the server itself.

Needs mcp (pip install mcp).

    PYTHONPATH=bindings/python python3 bindings/python/examples/fastmcp_refund.py
        # serves MCP over stdio
    PYTHONPATH=bindings/python python3 bindings/python/examples/fastmcp_refund.py --self-test
        # calls the tool three times as one turn, in process: one refund

The three lines: the Guard, @guard.tool under @mcp.tool(), and the tool's
``ctx: Context`` parameter (FastMCP passes it and keeps it out of the
schema).  idem reads the request's ``_meta`` there: ``io.idem/session``,
``io.idem/call_id`` (the model's tool-call id) and ``io.idem/turn``, as
idem's MCP gateway does; a client that sends none gets the JSON-RPC id as
the call id, scoped to its connection, and the session given here (or one
drawn for the process, with a warning).  Put the ids in ``_meta`` for real
use: a request id names a request on one connection, not a decision.
"""
import asyncio
import os
import sys
import tempfile

from mcp.server.fastmcp import Context, FastMCP

import idem

POLICY = """{"tools": {"refund_payment": {"class": "guarded",
  "timeout_ms": 5000, "retries": 1}}}"""

refunds = {}  # idempotency key -> refund: a stand-in for the payment API
log = os.environ.get("IDEM_LOG") or "sqlite:" + os.path.join(
    tempfile.mkdtemp(), "attempts.db")
guard = idem.Guard(log, idem.Policy(text=POLICY))
mcp = FastMCP("refunds")


@mcp.tool()
@guard.tool("refund_payment", session=os.environ.get("IDEM_SESSION"),
            status=lambda args, key: refunds.get(key))
async def refund_payment(order_id: str, amount_cents: int,
                         ctx: Context) -> dict:
    """Refund part of an order to the customer's card."""
    await asyncio.sleep(0.05)  # the payment API
    key = idem.current_key()
    refunds[key] = {"refund_id": "re_%d" % (len(refunds) + 1),
                    "order_id": order_id, "amount_cents": amount_cents}
    return refunds[key]


async def self_test():
    args = {"order_id": "ord_1", "amount_cents": 6000}

    async def call(call_id):
        # outside a request the Context has no _meta: the harness's
        # context names the call
        with idem.call_context(call_id=call_id):
            return await mcp.call_tool("refund_payment", args)
    with idem.call_context(session="demo", turn="msg_1"):
        for out in await asyncio.gather(*[call("toolu_%d" % i)
                                          for i in range(3)]):
            print(out)
    print("refunds made: %d" % len(refunds))  # 1


if __name__ == "__main__":
    if "--self-test" in sys.argv:
        asyncio.run(self_test())
    else:
        mcp.run()

#!/usr/bin/env python3
"""An agent harness loop with idem guarding its refund tool.

The model's tool calls arrive in either API's shape - OpenAI
(``{"id": "call_…", "function": {"name", "arguments": "<JSON text>"}}``) or
Anthropic (``{"type": "tool_use", "id": "toolu_…", "name", "input": {…}}``)
- and every one goes through the guard: the harness, never the model, mints
the idempotency key; a repeat of a call replays its outcome; a timeout is
reconciled with get_refund_status.  The tool result goes back to the model
as the envelope's JSON text.

    python3 examples/refund_harness.py [--log sqlite:PATH] [--policy FILE]

The "provider" here is a dict standing in for a payment API that honours
an idempotency key, as Stripe's does.  Each model turn prints one JSON line:
{"style", "call_id", "envelope"}.
"""
import argparse
import json
import os
import sys
import tempfile
import threading
import time

import idem

HERE = os.path.dirname(os.path.abspath(__file__))


class PaymentProvider:
    """Stand-in for a payment API: refunds by idempotency key."""

    def __init__(self):
        self.mu = threading.Lock()
        self.refunds = {}  # idempotency key -> refund

    def create_refund(self, order_id, amount_cents, idempotency_key):
        with self.mu:
            if idempotency_key not in self.refunds:
                self.refunds[idempotency_key] = {
                    "refund_id": "re_%d" % (len(self.refunds) + 1),
                    "order_id": order_id, "amount_cents": amount_cents}
            return self.refunds[idempotency_key]

    def find_refund(self, idempotency_key):
        with self.mu:
            return self.refunds.get(idempotency_key)


def make_tools(guard, psp):
    """The harness's tools, by name, each guarded as the policy says."""

    def refund_status(args, key):
        # the status check: None means "not applied"
        return psp.find_refund(key)

    @guard.tool("refund_payment", status=refund_status)
    def refund_payment(args, key):
        # args["idempotency_key"] was written by the guard (the policy's
        # key_arg): whatever the model put there is gone
        if args["amount_cents"] <= 0:
            raise idem.Rejected("the amount must be positive")
        return psp.create_refund(args["order_id"], args["amount_cents"],
                                 args["idempotency_key"])

    @guard.tool("get_refund_status")
    def get_refund_status(args, key):
        return {"refunds": [r for r in psp.refunds.values()
                            if r["order_id"] == args.get("order_id")]}

    return {t.name: t for t in (refund_payment, get_refund_status)}


def tool_result(style, call, env):
    """The message that carries the envelope back to the model."""
    if style.startswith("openai"):
        return {"role": "tool", "tool_call_id": call.id, "content": env.text}
    return {"type": "tool_result", "tool_use_id": call.id,
            "content": env.text,
            "is_error": env["status"] not in ("succeeded", "already_applied")}


def run_turn(session, turn, tools, style, raw_calls):
    """One model turn: guard each tool call, return the results.  turn is
    the id of the model response that made the calls: identical calls of
    one turn are one decision (run once), a later turn's are new ones."""
    results = []
    for raw in raw_calls:
        call = idem.ToolCall.parse(raw)
        tool = tools.get(call.name)
        if tool is None:
            env = idem.Envelope(json.dumps({
                "status": "refused", "tool": call.name, "call_id": call.id,
                "message": "No such tool. Do not call it again."}))
        else:
            env = tool(session, call.id, call.arguments, turn=turn)
        print(json.dumps({"style": style, "call_id": call.id,
                          "envelope": env}))
        results.append(tool_result(style, call, env))
    return results


# What the model asked for, turn by turn (the response's id, then its tool
# calls), in each API's shape.
TURNS = [
    ("resp_1", "openai", [{"id": "call_A1", "type": "function", "function": {
        "name": "refund_payment",
        "arguments": '{"order_id": "ord_1", "amount_cents": 6000,'
                     ' "idempotency_key": "made-up-by-the-model"}'}}]),
    # the transport delivers the same tool call again
    ("resp_1", "openai-retry", [{"id": "call_A1", "type": "function", "function": {
        "name": "refund_payment",
        "arguments": '{"amount_cents":6000,"order_id":"ord_1"}'}}]),
    # a later decision (a goodwill refund), from a Claude sub-agent
    ("resp_2", "anthropic", [{"type": "tool_use", "id": "toolu_B1",
                    "name": "refund_payment",
                    "input": {"order_id": "ord_1", "amount_cents": 6000.0}},
                   {"type": "tool_use", "id": "toolu_B2",
                    "name": "get_refund_status",
                    "input": {"order_id": "ord_1"}}]),
    ("resp_3", "openai", [{"id": "call_bad", "type": "function", "function": {
        "name": "refund_payment",
        "arguments": '{"order_id": "ord_1", "amount_cents": }'}}]),
]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--log", help="the attempt log (default: a temp file)")
    ap.add_argument("--policy", default=os.path.join(HERE, "policy.json"))
    ap.add_argument("--session", default="sess_demo")
    o = ap.parse_args()
    log = o.log or "sqlite:" + os.path.join(tempfile.mkdtemp(), "attempts.db")
    psp = PaymentProvider()
    with idem.Guard(log, idem.Policy(o.policy)) as guard:
        tools = make_tools(guard, psp)
        for turn, style, calls in TURNS:
            run_turn(o.session, turn, tools, style, calls)
            time.sleep(0.01)  # the model thinks between turns
    print("refunds applied: %d" % len(psp.refunds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

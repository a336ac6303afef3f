"""Tools written with ``from __future__ import annotations``: their
annotations are text, which a framework evaluates in the function's
``__globals__`` (test_frameworks)."""
from __future__ import annotations

from typing import Annotated

from tests.frameworks import Context, InjectedToolCallId


async def refund_payment(order_id: str, amount_cents: int,
                         ctx: Context) -> dict:
    """Refund part of an order."""
    raise AssertionError("the bare function is never called here")


def refund_tool_node(order_id: str, amount_cents: int,
                     tool_call_id: Annotated[str, InjectedToolCallId]
                     ) -> dict:
    """Refund part of an order."""
    raise AssertionError("the bare function is never called here")

"""idem for Python: make the side-effecting tool calls of an agent take
effect at most once.  A ctypes binding of libidem (standard library only).

    import idem
    guard = idem.Guard("sqlite:/var/lib/agent/attempts.db", "policy.json")

    @guard.tool("refund_payment", status=lambda args, key: psp.find(key))
    async def refund_payment(order_id: str, amount_cents: int) -> dict:
        return await psp.refund(order_id, amount_cents,
                                key=idem.current_key())

    with idem.call_context(session=run_id, call_id=tool_call_id,
                           turn=response_id):
        env = await refund_payment(order_id="ord_1", amount_cents=6000)
    # env is a dict: {"status": "succeeded", ..., "result": {...}};
    # str(env) is the JSON text to give back to the model.

The guarded function keeps its signature, so a framework's decorator
(@function_tool, @mcp.tool(), @tool) stacks on top of it; the call id
comes from the framework's injected parameter where it has one.  The
first form, fn(args, key), is called with the ids:
refund(session, call_id, args).  See bindings/python/README.md.
"""
from .errors import (
    IdemError, LibraryNotFound, NoMemoryError, MisuseError, InvalidError,
    RangeError, IdemIOError, JSONError, JSONSyntaxError, TrailingBytesError,
    UTF8Error, SurrogateError, DuplicateMemberError, NumberOverflowError,
    NumberUnderflowError, BigIntError, DepthError, TooBigError, BOMError,
    NotObjectError, PolicyError, NotFoundError, StoreError, BusyError,
    CorruptError, StaleError, ToolOutcome, Rejected, NotApplied)
from .core import (canon, key, Key, Policy, strerror, version,
                   process_metrics)
from .guard import (Guard, Step, GuardedTool, Envelope, Outcome, Next,
                    current_key, http_missing)
from .natural import call_context, current_call, CallContext
from .harness import ToolCall
from . import _lib

__all__ = [
    "IdemError", "LibraryNotFound", "NoMemoryError", "MisuseError",
    "InvalidError", "RangeError", "IdemIOError", "JSONError",
    "JSONSyntaxError", "TrailingBytesError", "UTF8Error", "SurrogateError",
    "DuplicateMemberError", "NumberOverflowError", "NumberUnderflowError",
    "BigIntError", "DepthError", "TooBigError", "BOMError", "NotObjectError",
    "PolicyError", "NotFoundError", "StoreError", "BusyError", "CorruptError",
    "StaleError", "ToolOutcome", "Rejected", "NotApplied",
    "canon", "key", "Key", "Policy", "strerror", "version",
    "Guard", "Step", "GuardedTool", "Envelope", "Outcome", "Next", "ToolCall",
    "APPLIED", "REJECTED", "NOT_APPLIED", "UNKNOWN", "library_path",
    "current_key", "http_missing", "call_context", "current_call", "CallContext",
    "process_metrics",
]

__version__ = "0.4.0"
library_path = _lib.path

APPLIED = Outcome.APPLIED
REJECTED = Outcome.REJECTED
NOT_APPLIED = Outcome.NOT_APPLIED
UNKNOWN = Outcome.UNKNOWN

"""Typed exceptions, one per status code of include/idem.h.

Every exception the binding raises for a failure of the library is an
IdemError carrying ``code`` (the C status), ``name`` (its short name, as in
``idem_status_name``), ``message`` (what went wrong, and where) and, for
JSON errors, ``offset`` (the 0-based byte offset into the text).  Each class
also derives from the nearest built-in exception, so ``except ValueError``
catches bad JSON and ``except TypeError`` catches misuse.
"""
from typing import Dict, Optional, Type


class IdemError(Exception):
    """A failure reported by libidem (IDEM_ERROR and the base of the rest)."""

    code: int = 1
    name: str = "error"

    def __init__(self, message: str, code: Optional[int] = None,
                 offset: Optional[int] = None) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.offset = offset

    def __str__(self) -> str:
        return "idem: " + self.message


class LibraryNotFound(IdemError, ImportError):
    """libidem could not be found or loaded (not a C status)."""

    code = -1
    name = "library"


class NoMemoryError(IdemError, MemoryError):
    code, name = 2, "nomem"


class MisuseError(IdemError, TypeError):
    """The library was used incorrectly: a wrong type, a closed handle."""

    code, name = 3, "misuse"


class InvalidError(IdemError, ValueError):
    """An invalid argument (an empty session or call id, ...)."""

    code, name = 4, "invalid"


class RangeError(IdemError, ValueError):
    code, name = 5, "range"


class IdemIOError(IdemError, OSError):
    code, name = 6, "io"


class JSONError(IdemError, ValueError):
    """The base of every rejection of a JSON text (SPEC §4)."""

    code, name = 20, "syntax"


class JSONSyntaxError(JSONError):
    code, name = 20, "syntax"


class TrailingBytesError(JSONError):
    code, name = 21, "trailing"


class UTF8Error(JSONError):
    code, name = 22, "utf8"


class SurrogateError(JSONError):
    code, name = 23, "surrogate"


class DuplicateMemberError(JSONError):
    code, name = 24, "duplicate"


class NumberOverflowError(JSONError):
    code, name = 25, "overflow"


class NumberUnderflowError(JSONError):
    code, name = 26, "underflow"


class BigIntError(JSONError):
    code, name = 27, "bigint"


class DepthError(JSONError):
    code, name = 28, "depth"


class TooBigError(JSONError):
    code, name = 29, "too_big"


class BOMError(JSONError):
    code, name = 30, "bom"


class NotObjectError(JSONError):
    """Tool arguments that are valid JSON but not an object."""

    code, name = 31, "not_object"


class PolicyError(IdemError, ValueError):
    code, name = 40, "policy"


class NotFoundError(IdemError, LookupError):
    code, name = 41, "notfound"


class StoreError(IdemError):
    """The attempt log failed: no downstream call may be made."""

    code, name = 42, "store"


class BusyError(StoreError):
    code, name = 43, "busy"


class CorruptError(StoreError):
    code, name = 44, "corrupt"


class StaleError(IdemError):
    """A stale fencing token: the action changed meanwhile."""

    code, name = 45, "stale"


_BY_CODE: Dict[int, Type[IdemError]] = {
    cls.code: cls
    for cls in (
        NoMemoryError, MisuseError, InvalidError, RangeError, IdemIOError,
        JSONSyntaxError, TrailingBytesError, UTF8Error, SurrogateError,
        DuplicateMemberError, NumberOverflowError, NumberUnderflowError,
        BigIntError, DepthError, TooBigError, BOMError, NotObjectError,
        PolicyError, NotFoundError, StoreError, BusyError, CorruptError,
        StaleError,
    )
}


def error_for(code: int, message: str,
              offset: Optional[int] = None) -> IdemError:
    """The exception for C status ``code`` (IdemError for unknown codes)."""
    cls = _BY_CODE.get(code, IdemError)
    return cls(message, code, offset)


# What a tool function raises to say what happened downstream (the Python
# face of IDEM_OUTCOME_REJECTED and IDEM_OUTCOME_NOT_APPLIED).  Any other
# exception from a tool means the outcome is unknown.


class ToolOutcome(Exception):
    """Raised by a guarded tool: a definite outcome other than applied."""

    outcome: int = 0


class Rejected(ToolOutcome):
    """A definite failure: nothing was applied, and retrying will not help."""

    outcome = 2


class NotApplied(ToolOutcome):
    """Certainly not applied (refused before sending, a retryable error)."""

    outcome = 3

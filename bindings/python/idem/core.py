"""Canonical JSON, keys and policies: thin, typed wrappers of libidem."""
import ctypes
import json
import os
import threading
from collections.abc import Mapping
from typing import Any, Dict, NamedTuple, Optional, Union

from . import _lib as L
from .errors import MisuseError, InvalidError, RangeError, error_for

_local = threading.local()

# The canonicalizer's limits (enum idem_limit) and their defaults
# (IDEM_DEFAULT_MAX_DEPTH, IDEM_DEFAULT_MAX_BYTES), as include/idem.h has
# them; tests/test_header.py checks them against it.
LIMIT_DEPTH = 1
LIMIT_BYTES = 2
DEFAULT_MAX_DEPTH = 128
DEFAULT_MAX_BYTES = 1024 * 1024

# A JSON text as the binding takes it, or a Python value to encode.
JSONText = Union[str, bytes, bytearray, memoryview]

# The shortest JSON text of a Python value, as json.dumps gives it (the
# library canonicalizes it again; this only has to be valid JSON).
_dumps = json.JSONEncoder(ensure_ascii=False, allow_nan=False,
                          separators=(",", ":")).encode


def _decode(b: Optional[bytes]) -> Optional[str]:
    return b.decode("utf-8", "surrogateescape") if b is not None else None


def _workspace() -> "_Workspace":
    """This thread's idem_canon (a handle must not be shared by threads)."""
    c = getattr(_local, "canon", None)
    if c is None:
        h = ctypes.c_void_p()
        rc = L.canon_open(ctypes.byref(h))
        if rc:
            raise error_for(rc, "cannot open a canonicalizer: "
                            + L.strerror(rc).decode())
        c = _local.canon = _Workspace(h)
    return c


class _Workspace:
    """A thread's canonicalizer, closed with the thread (or at exit).  It
    keeps its own reference to idem_canon_close: at interpreter exit the
    modules' globals may be cleared before the last thread-local goes."""

    __slots__ = ("h", "_close")

    def __init__(self, h: ctypes.c_void_p) -> None:
        self.h: Optional[ctypes.c_void_p] = h
        self._close = L.canon_close

    def __del__(self) -> None:
        if self.h and self._close is not None:
            self._close(self.h)
            self.h = None


def _text(value: Any, what: str) -> bytes:
    """A JSON text as bytes: str and bytes are taken as JSON text, a dict
    (or list, number, ...) is encoded first."""
    t = type(value)
    if t is str:
        return bytes(value.encode("utf-8", "surrogatepass"))
    if t is bytes:
        return bytes(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    if isinstance(value, (dict, list, tuple, int, float, bool)) or value is None:
        try:
            return _dumps(value).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as e:
            raise InvalidError("%s cannot be encoded as JSON: %s"
                               % (what, e)) from None
    raise MisuseError("%s must be a JSON text (str or bytes) or a dict, not %s"
                      % (what, t.__name__))


def _args_text(args: Any) -> bytes:
    """Tool arguments: a JSON text (str, bytes) as the model sent it, or a
    mapping; anything else is the caller's mistake."""
    if isinstance(args, (str, bytes, bytearray, memoryview)):
        return _text(args, "args")
    if isinstance(args, Mapping):
        return _text(args if type(args) is dict else dict(args), "args")
    raise MisuseError("args must be a JSON text (str or bytes) or a dict, "
                      "not %s" % type(args).__name__)


def _name(value: Any, what: str) -> bytes:
    if type(value) is not str:
        raise MisuseError("%s must be a str, not %s"
                          % (what, type(value).__name__))
    if not value:
        raise InvalidError("%s is empty" % what)
    if "\0" in value:
        raise InvalidError("%s holds a NUL character" % what)
    return value.encode("utf-8", "surrogatepass")


def _canon_error(h: Any, rc: int) -> Exception:
    return error_for(rc, L.canon_errmsg(h).decode("utf-8", "replace"),
                     L.canon_erroffset(h))


def canon(text: Any, max_depth: Optional[int] = None,
          max_bytes: Optional[int] = None) -> str:
    """The RFC 8785 canonical form of one JSON text (str, bytes, or a Python
    value), as str.  Raises a JSONError subclass saying what and at which
    byte offset (``e.offset``)."""
    data = _text(text, "the text")
    w = _workspace()
    h = w.h
    limits = max_depth is not None or max_bytes is not None
    try:
        for which, v in ((LIMIT_DEPTH, max_depth), (LIMIT_BYTES, max_bytes)):
            if v is not None:
                if type(v) is not int:
                    raise MisuseError("limits are integers")
                if v < 1 or v > 2**62:
                    raise RangeError("limit %d out of range" % v)
                rc = L.canon_limit(h, which, v)
                if rc:
                    raise error_for(rc, "limit %d: %s"
                                    % (v, L.strerror(rc).decode()))
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        rc = L.canon_json(h, data, len(data), ctypes.byref(out),
                          ctypes.byref(n))
        if rc:
            raise _canon_error(h, rc)
        return ctypes.string_at(out.value or 0, n.value).decode("utf-8")
    finally:
        if limits:
            L.canon_limit(h, LIMIT_DEPTH, DEFAULT_MAX_DEPTH)
            L.canon_limit(h, LIMIT_BYTES, DEFAULT_MAX_BYTES)


class Key(NamedTuple):
    """A minted key (SPEC §3): the idempotency key, the 64-hex
    fingerprint, the canonical payload {"args":...,"tool":...} and the
    canonical arguments (key_arg removed)."""

    key: str
    fingerprint: str
    payload: str
    args: str


def key(session: str, call_id: str, tool: str, args: Any,
        key_arg: Optional[str] = None, key_max_len: int = 0) -> Key:
    """Mint the key of one call (SPEC §3).  ``args`` is a JSON object text
    or a dict.  Raises a JSONError subclass for bad arguments
    (NotObjectError when they are not an object)."""
    c = L.Call(_name(session, "session"), _name(call_id, "call_id"),
               _name(tool, "tool"), None, 0)
    a = _args_text(args)
    c.args = a
    c.args_len = len(a)
    spec: Any = None
    if key_arg is not None or key_max_len:
        if type(key_max_len) is not int or key_max_len < 0:
            raise MisuseError("key_max_len must be a non-negative int")
        spec = ctypes.byref(L.KeySpec(
            _name(key_arg, "key_arg") if key_arg is not None else None,
            key_max_len))
    k = L.Key()
    h = _workspace().h
    rc = L.key_mint(h, ctypes.byref(c), spec, ctypes.byref(k))
    if rc:
        raise _canon_error(h, rc)
    return Key(ctypes.string_at(k.key, k.key_len).decode("utf-8"),
               k.fingerprint.decode("ascii"),
               ctypes.string_at(k.payload, k.payload_len).decode("utf-8"),
               ctypes.string_at(k.args, k.args_len).decode("utf-8"))


# enum idem_class (tests/test_header.py checks it against include/idem.h)
CLASSES: Dict[int, str] = {1: "guarded", 2: "idempotent", 3: "read_only",
                           4: "refused"}


class Policy:
    """A validated policy (SPEC §8, docs/POLICY.md).

    ``Policy(path)`` reads a file; ``Policy(text=...)`` parses a text
    (``origin`` names it in messages).  Raises PolicyError naming the field.
    The policy is freed when the last object using it (a Guard holds it) is
    gone."""

    def __init__(self, path: Any = None, text: Any = None,
                 origin: str = "policy") -> None:
        self._p: Optional[int] = None
        self._free = L.policy_free  # kept for __del__ at exit (_Workspace)
        h = ctypes.c_void_p()
        if (path is None) == (text is None):
            raise MisuseError("give a policy file path or a text, not both")
        if path is not None:
            if not isinstance(path, (str, bytes)) and not hasattr(
                    path, "__fspath__"):
                raise MisuseError("the policy path must be a str or a path")
            p = os.fsencode(path)
            rc = L.policy_load(p, ctypes.byref(h))
        else:
            t = _text(text, "the policy")
            rc = L.policy_parse(t, len(t), _name(origin, "origin"),
                                ctypes.byref(h))
        self._p = h.value
        if rc:
            msg = L.policy_errmsg(h).decode("utf-8", "replace") if h.value \
                else L.strerror(rc).decode()
            self.__del__()
            raise error_for(rc, msg)

    def __del__(self) -> None:
        if self._p and self._free is not None:
            self._free(self._p)
            self._p = None

    def tool_class(self, tool: str) -> str:
        """"guarded", "idempotent", "read_only" or "refused"."""
        return CLASSES.get(L.policy_class(self._p, _name(tool, "tool")), "?")

    def explain(self, tool: str) -> str:
        """In words: what "the same action" means for tool, and what
        happens on a timeout."""
        out = ctypes.c_void_p()
        rc = L.policy_explain(self._p, _name(tool, "tool"), ctypes.byref(out))
        if rc:
            raise error_for(rc, L.strerror(rc).decode())
        try:
            return ctypes.string_at(out.value or 0).decode("utf-8")
        finally:
            L.free(out)


def strerror(code: int) -> str:
    """A sentence describing a C status code."""
    return L.strerror(code).decode()  # type: ignore[no-any-return]


def version() -> str:
    """The version of the libidem actually loaded."""
    return L.version().decode()  # type: ignore[no-any-return]


_ANSWERS = ("succeeded", "failed", "outcome_unknown", "already_applied",
            "conflict", "in_progress", "refused", "invalid_arguments")
_CHECKS = ("applied", "rejected", "not_applied", "unknown")


def process_metrics() -> Dict[str, Any]:
    """This process's counters: what every guard of the process has done
    since it started (idem_metrics_read) - what the attempt log cannot
    know, since a replay writes nothing.  Export them from the process
    that makes the calls (docs/CONSOLE.md names each one)::

        {"answers": {"succeeded": N, ...}, "replays": N, "fenced": N,
         "coalesced": N, "attempts": N, "late": N,
         "checks": {"applied": N, ...}, "resolved": N,
         "latency": {"buckets": [(le_seconds, cumulative count), ...],
                     "count": N, "sum_seconds": S}}
    """
    m = L.Metrics()
    m.size = ctypes.sizeof(m)
    rc = L.metrics_read(ctypes.byref(m))
    if rc:
        raise error_for(rc, "idem_metrics_read: the library is older "
                        "than this binding")
    buckets = []
    for i in range(L.LATENCY_BUCKETS):
        bound = L.latency_bound_us(i)
        if bound < 0:
            break
        buckets.append((bound / 1e6, m.latency_le[i]))
    return {
        "answers": {n: m.answers[i + 1] for i, n in enumerate(_ANSWERS)},
        "replays": m.replays, "fenced": m.fenced, "coalesced": m.coalesced,
        "attempts": m.attempts, "late": m.late,
        "checks": {n: m.checks[i + 1] for i, n in enumerate(_CHECKS)},
        "resolved": m.resolved,
        "latency": {"buckets": buckets, "count": m.latency_count,
                    "sum_seconds": m.latency_sum_us / 1e6},
    }

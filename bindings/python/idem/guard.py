"""The guard (SPEC §6, §7): the two-phase API, and guarded Python tools.

Two ways to drive it:

* ``Guard.begin()`` returns a Step that says what to do next (EXECUTE,
  CHECK, WAIT, ANSWER); the harness calls the tool itself (async code,
  another process, an HTTP client) and reports back with ``finish`` /
  ``resolve``.
* ``Guard.tool(name, status=fn)`` wraps a Python function as a guarded
  tool.  A call goes through ``idem_guard_call``: the C library runs the
  function on a worker thread of its own, so the guard, not the tool, owns
  the deadline; past it the call answers and the result that comes later is
  still recorded (resolution "late").
"""
import asyncio
import atexit
import contextvars
import inspect
import ctypes
import enum
import json
import os
import socket
import struct
import sys
import threading
import time
import weakref
from typing import (Any, Callable, Dict, List, Mapping, Optional,
                    Tuple, Union)

from . import _lib as L
from . import _aio
from .natural import natural_tool, _is_args_key_form
from .core import Policy, _dumps, _name, _text, _args_text, _decode, CLASSES
from .errors import (InvalidError, MisuseError, NotFoundError, Rejected,
                     ToolOutcome, error_for)


class Outcome(enum.IntEnum):
    """What a downstream call or a status check says happened."""
    APPLIED = 1
    REJECTED = 2
    NOT_APPLIED = 3
    UNKNOWN = 4


class Next(enum.IntEnum):
    """What the caller of a step does next."""
    ANSWER = 1
    EXECUTE = 2
    CHECK = 3
    WAIT = 4


# enum idem_answer, enum idem_state, enum idem_resolution (checked against
# include/idem.h by tests/test_header.py)
ANSWERS: Dict[int, str] = {
    1: "succeeded", 2: "failed", 3: "outcome_unknown", 4: "already_applied",
    5: "conflict", 6: "in_progress", 7: "refused", 8: "invalid_arguments"}
STATES: Dict[int, str] = {
    1: "pending", 2: "succeeded", 3: "failed", 4: "not_applied",
    5: "in_doubt", 6: "deduplicated"}
RESOLUTIONS: Dict[int, Optional[str]] = {
    0: None, 1: "executed", 2: "reconciled", 3: "late", 4: "replayed",
    5: "operator"}

# the outcomes and status codes the binding hands to C or reads from it
_APPLIED = int(Outcome.APPLIED)
_NOT_APPLIED = int(Outcome.NOT_APPLIED)
_UNKNOWN = int(Outcome.UNKNOWN)
_INVALID = InvalidError.code
_NOTFOUND = NotFoundError.code

_byref = ctypes.byref
_string_at = ctypes.string_at
_c_void_p = ctypes.c_void_p
_c_size_t = ctypes.c_size_t
_Call = L.Call
_CALL_SIZE = ctypes.sizeof(L.Call)
_guard_call = L.guard_call_fast
_free = L.free_fast
_loads = json.loads
_tls = threading.local()
_c_char_p = ctypes.c_char_p
# an idem_call, as bytes: its fields, then the padding up to its size
_pack_call = struct.Struct("NPPPPNPi%dx" % (
    _CALL_SIZE - struct.calcsize("NPPPPNPi"))).pack
_OFF: int = L.BYTES_OFFSET or 0  # unused when None: _call_json_portable
_copy_context = contextvars.copy_context


# A tool function: fn(args, key) -> result (a JSON value); or a status
# function with the same contract (None: not applied).  Async ones return
# an awaitable.
ToolFn = Callable[[Dict[str, Any], str], Any]
# Tool arguments: the model's JSON text (str or bytes) or a mapping.
Args = Union[str, bytes, bytearray, memoryview, Mapping[str, Any]]
# What a run comes to, as the C library takes it: (outcome, result JSON,
# error text).
Verdict = Tuple[int, Optional[bytes], Optional[bytes]]

_sessions: Dict[Any, bytes] = {}


def _slow_session(session: Any) -> bytes:
    s = _name(session, "session")
    if len(_sessions) >= 1024:
        _sessions.clear()
    _sessions[session] = s
    return s


def _turn(turn: Optional[str]) -> Optional[bytes]:
    """The turn id as C takes it: None, or a non-empty text."""
    return None if turn is None else _name(turn, "turn")


def _slow_args(args: Any) -> bytes:
    if type(args) is str:
        return args.encode("utf-8", "surrogatepass")
    if type(args) is dict:
        try:
            return _dumps(args).encode("utf-8", "surrogatepass")
        except (TypeError, ValueError) as e:
            raise error_for(_INVALID, "args cannot be encoded as JSON: %s"
                            % e) from None
    return _args_text(args)


class Envelope(Dict[str, Any]):
    """The answer for the model (SPEC §7) as a dict; ``text`` is the JSON
    text exactly as the library made it (what to hand to the model), and
    ``str(envelope)`` is that text too, for frameworks that turn a tool's
    return value into the model's message with str()."""

    __slots__ = ("text",)

    def __init__(self, text: str) -> None:
        super().__init__(_loads(text))
        self.text = text

    def __str__(self) -> str:
        return self.text

    @property
    def status(self) -> str:
        return str(self["status"])


def _result_text(value: Any) -> Optional[bytes]:
    """A tool's return value as a JSON text (bytes).  A value json cannot
    encode is an error (MisuseError), never its str(): a record that says
    "succeeded" with "<object at 0x...>" would hide what happened."""
    if value is None:
        return None
    try:
        return _dumps(value).encode("utf-8", "surrogatepass")
    except (TypeError, ValueError) as e:
        raise MisuseError("the tool returned %s, which is not JSON (%s); "
                          "return a dict, list, str, number, bool or None"
                          % (type(value).__name__, e)) from None


def _verdict(run: Callable[[], Any], is_check: bool,
             not_applied_on: Tuple[type, ...] = ()) -> Verdict:
    """Run a tool (or status function) and say what happened, the way the C
    library takes it: (outcome, result text or None, error text or None).

    Only a verdict finishes an attempt (SPEC 6a): a result, NotApplied,
    Rejected - or, for a tool run, an exception of a class the tool's
    ``not_applied_on`` names (it proves nothing was sent).  Any other
    exception is UNKNOWN: the function ended, but what it sent may still
    land."""
    try:
        value = run()
        if is_check and value is None:
            return _NOT_APPLIED, None, None  # the status check found nothing
        if isinstance(value, ToolOutcome):
            raise value
        return _APPLIED, _result_text(value), None
    except ToolOutcome as e:
        err = str(e).encode("utf-8", "replace") or None
        # a status check that "rejects" found nothing applied
        return (_NOT_APPLIED if e.outcome == Rejected.outcome and is_check
                else e.outcome), None, err
    except BaseException as e:  # anything else: nobody knows
        err = ("%s: %s" % (type(e).__name__, e)).encode("utf-8", "replace")
        if not_applied_on and not is_check and _not_sent(e, not_applied_on):
            return _NOT_APPLIED, None, err
        return _UNKNOWN, None, err


def _not_sent(e: BaseException, types: Tuple[type, ...]) -> bool:
    """Is e one of ``types``, the exceptions that prove nothing was sent?
    urllib raises the socket's error of connect() and send() wrapped in a
    URLError: its ``reason`` is matched too (an HTTPError is an answer,
    never matched by its reason)."""
    if isinstance(e, types):
        return True
    ue = sys.modules.get("urllib.error")  # not imported: e is no URLError
    return (ue is not None and isinstance(e, ue.URLError) and
            not isinstance(e, ue.HTTPError) and
            isinstance(getattr(e, "reason", None), types))


def _check_not_applied_on(value: Any) -> Tuple[type, ...]:
    """The ``not_applied_on`` argument, checked: a tuple of exception
    classes, none of which can be raised after the request went out."""
    if value is None:
        return ()
    if not isinstance(value, tuple):
        raise MisuseError(
            "not_applied_on must be a tuple of exception classes, such as "
            "(ConnectionRefusedError,); got %r" % (value,))
    import urllib.error
    for c in value:
        if not (isinstance(c, type) and issubclass(c, Exception)):
            raise MisuseError("not_applied_on holds exception classes; %r "
                              "is not one" % (c,))
        if issubclass(c, ToolOutcome):
            raise MisuseError(
                "not_applied_on: %s is a verdict already: raise it from the "
                "tool, do not list it" % c.__name__)
        why = ""
        near = list(dict.fromkeys(w.__name__ for w in _PROVE_NOTHING
                                  if issubclass(w, c) or issubclass(c, w)))
        if near:
            why = "it is or includes " + ", ".join(near)
        elif issubclass(c, urllib.error.HTTPError):
            why = "an HTTP answer: its status says what happened"
        elif issubclass(c, urllib.error.URLError):
            why = "it wraps any socket error, a reset after sending too"
        if why:
            raise MisuseError(
                "not_applied_on: %s does not prove that nothing was sent "
                "(%s): the request may have gone out and still land (SPEC "
                "6a). Name the classes that do, such as "
                "ConnectionRefusedError (a URLError whose reason is one "
                "counts), or raise idem.NotApplied from the tool where you "
                "know that nothing was sent" % (c.__name__, why))
    return value


# Exceptions raised after a request may have been sent: no class that is
# or includes one of them proves that nothing was sent.
_PROVE_NOTHING: Tuple[type, ...] = (
    TimeoutError, socket.timeout, ConnectionResetError,
    ConnectionAbortedError, BrokenPipeError)


# The idempotency key of the call a tool is running for (idem.current_key()).
_current_key: "contextvars.ContextVar[Optional[str]]" = \
    contextvars.ContextVar("idem_current_key", default=None)


def http_missing() -> Optional[str]:
    """None when this process can run the policy's HTTP tools (Guard.run),
    else why not: libidem built without HTTP support, or libcurl missing
    (with the package to install)."""
    m = L.http_missing()
    return m.decode("utf-8", "replace") if m else None


def current_key() -> Optional[str]:
    """The idempotency key of the guarded call this tool runs for, or None
    outside one.  Set for sync and async tools, and their status checks."""
    return _current_key.get()


def _in_context(fn: ToolFn, a: Any, key: str,
                context: Optional[contextvars.Context] = None) -> Any:
    """fn(a, key) in a copy of the caller's contextvars (context: the
    Context the call was made in; None: the current one), with
    current_key() set.  A copy: a Context runs in one thread at a time."""
    ctx = (context or contextvars.copy_context()).copy()
    return ctx.run(_with_key, fn, a, key)


def _with_key(fn: ToolFn, a: Any, key: str) -> Any:
    _current_key.set(key)
    return fn(a, key)


def _settled(value: Any) -> Any:
    """What an async tool's awaitable comes to: awaited to the end on this
    thread (a guard worker, which runs no event loop), so the tool really
    runs and its own result is recorded - never the coroutine object."""
    if not inspect.isawaitable(value):
        return value

    async def wait() -> Any:
        return await value
    return asyncio.run(wait())


def _opt_text(result: Any, result_json: Any) -> Optional[bytes]:
    if result_json is not None:
        return _text(result_json, "result_json")
    return _result_text(result)


def _err(g: Any, rc: int) -> Exception:
    return error_for(rc, L.guard_errmsg(g).decode("utf-8", "replace")
                     or L.strerror(rc).decode())


def _outcome(o: Any) -> int:
    try:
        return int(Outcome(o))
    except ValueError:
        raise MisuseError("not an outcome: %r" % (o,)) from None


class _Handle:
    """A C handle released by close(), by a with block, or when the object
    goes (not at interpreter exit, when the library may be gone)."""

    __slots__ = ()

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass


class Guard(_Handle):
    """A guard on an attempt log.

    ``log`` is "sqlite:PATH", "postgres://..." or a plain path; None means
    $IDEM_LOG, else $XDG_STATE_HOME/idem/attempts.db.  ``policy`` is a
    Policy, the path of a policy file, or None (every tool guarded with the
    defaults).  A guard is safe to share between threads; a Step belongs to
    one thread.  Raises StoreError (CorruptError, BusyError, ...) when the
    log cannot be opened."""

    def __init__(self, log: Any = None, policy: Any = None) -> None:
        self._g: Optional[int] = None
        self._gp: Optional[ctypes.c_void_p] = None
        if policy is not None and not isinstance(policy, Policy):
            policy = Policy(policy)
        self.policy = policy
        if log is not None:
            if not isinstance(log, (str, bytes)) and not hasattr(
                    log, "__fspath__"):
                raise MisuseError("log must be a str or a path")
            log = os.fsencode(log)
        h = _c_void_p()
        rc = L.guard_open(log, policy._p if policy else None, _byref(h))
        if rc:
            msg = (L.guard_errmsg(h).decode("utf-8", "replace")
                   if h.value else L.strerror(rc).decode())
            if h.value:
                L.guard_close(h)
            raise error_for(rc, msg)
        self._g = h.value
        self._gp = _c_void_p(h.value)  # passed as is, no conversion per call
        self._tools: Dict[Tuple[str, Any, Any], GuardedTool] = {}
        # acall's completion queues, one per event loop (_aio)
        self._queues: Dict[int, Any] = {}

    def _h(self) -> int:
        if self._g is None:
            raise MisuseError("the guard is closed")
        return self._g

    def close(self) -> None:
        """Close the guard.  Steps still alive and tool runs still in flight
        keep the C guard until they end."""
        if self._g is not None:
            self._gp = None
            _aio.close_queues(self)
            L.guard_close(self._g)
            self._g = None

    # ---- the two-phase API -------------------------------------------------

    def begin(self, session: str, call_id: str, tool: str, args: Args,
              turn: Optional[str] = None, *, own_check: bool = False
              ) -> "Step":
        """Decide a call; returns a Step.  Bad arguments and refused tools
        are answers (the step says ANSWER), not exceptions; StoreError means
        the log failed and nothing may be called downstream.  ``turn``
        names the model turn that issued the call (see GuardedTool).
        ``own_check``: you run a status check of your own (a lookup of
        ``check_key``), whatever the policy names: the step says CHECK
        before it settles an action in doubt, with ``check_tool`` None
        when the policy names no status tool."""
        g = self._h()
        a = _args_text(args)
        c = _Call(_name(session, "session"), _name(call_id, "call_id"),
                  _name(tool, "tool"), a, len(a), _turn(turn),
                  1 if own_check else 0)
        s = _c_void_p()
        rc = L.guard_begin(g, _byref(c), _byref(s))
        if rc:
            e = _err(g, rc)
            if s.value:
                L.step_free(s)
            raise e
        return Step(self, s.value or 0)

    def run(self, session: str, call_id: str, tool: str, args: Args,
            turn: Optional[str] = None) -> Envelope:
        """Guard one call of an HTTP tool of the policy (its "http" rule,
        docs/POLICY.md) end to end: the library makes the request within
        the tool's timeout_ms, retries with the same key, reconciles an
        unknown outcome with an HTTP status tool, and answers.  The
        envelope is marked delivered.  PolicyError when the tool has no
        "http" rule; IdemError when HTTP tools cannot run in this process
        (idem.http_missing() says why)."""
        g = self._h()
        a = _args_text(args)
        c = _Call(_name(session, "session"), _name(call_id, "call_id"),
                  _name(tool, "tool"), a, len(a), _turn(turn))
        out = _c_void_p()
        n = ctypes.c_size_t()
        rc = L.guard_run(g, _byref(c), None, _byref(out), _byref(n))
        if rc:
            if out.value:
                L.free(out)
            raise _err(g, rc)
        try:
            text = ctypes.string_at(out.value or 0, n.value).decode()
        finally:
            L.free(out)
        return Envelope(text)

    def recover(self, session: str, call_id: str) -> "Step":
        """A step reconciling one recorded action (what `idem recover` does):
        CHECK when it is in doubt, else ANSWER with what the record holds.
        Raises NotFoundError when there is no such record."""
        g = self._h()
        s = _c_void_p()
        rc = L.guard_recover(g, _name(session, "session"),
                             _name(call_id, "call_id"), _byref(s))
        if rc:
            e = _err(g, rc) if rc != _NOTFOUND else error_for(
                rc, "no record of %s %s" % (session, call_id))
            if s.value:
                L.step_free(s)
            raise e
        return Step(self, s.value or 0)

    def settle(self, session: str, call_id: str, token: int, outcome: int,
               result: Any = None, result_json: Optional[str] = None
               ) -> None:
        """Settle an action with a status check made outside a step: a
        compare-and-set on ``token`` (StaleError when it changed)."""
        g = self._h()
        r = _opt_text(result, result_json)
        rc = L.guard_settle(g, _name(session, "session"),
                            _name(call_id, "call_id"), int(token),
                            _outcome(outcome), r, len(r) if r else 0)
        if rc:
            raise _err(g, rc)

    def late(self, session: str, call_id: str, token: int, outcome: int,
             result: Any = None, error: Optional[str] = None,
             result_json: Optional[str] = None, ended: bool = True) -> None:
        """Record a result that arrived after the deadline, from wherever it
        arrives; dropped when the action was settled meanwhile.  ``ended``
        says the attempt is over (the tool returned or raised): nothing of
        it runs any more.  With UNKNOWN that is no verdict: what it sent
        may still land until the tool's settle_ms has passed since (SPEC
        6a; settle_ms 0: the end is a finish)."""
        g = self._h()
        r = _opt_text(result, result_json)
        rc = L.guard_late(g, _name(session, "session"),
                          _name(call_id, "call_id"), int(token),
                          _outcome(outcome), r, len(r) if r else 0,
                          error.encode("utf-8", "replace") if error else None,
                          1 if ended else 0)
        if rc:
            raise _err(g, rc)

    def resolve(self, session: str, call_id: str, *, applied: bool,
                result: Any = None, reason: Optional[str] = None,
                by: Optional[str] = None,
                result_json: Optional[str] = None) -> None:
        """An operator's verdict on an action in doubt (SPEC 9, what
        ``idem resolve`` does), after checking with the provider by hand.
        ``applied=True`` (with its ``result``) makes every later call of
        the action replay it, and a re-issue answer already_applied;
        ``applied=False`` needs a ``reason`` and lets the next call run it
        again with its key - say it only when no attempt can land any more.
        Recorded with who (``by``; default: this guard's owner id) and
        when.  StaleError when the action is not in doubt (someone settled
        it meanwhile: the message says what it is now), NotFoundError when
        there is none."""
        g = self._h()
        if not isinstance(applied, bool):
            raise MisuseError("applied must be True or False")
        if not applied and not (isinstance(reason, str) and reason):
            raise MisuseError("a verdict of not applied needs a reason "
                              "(what the provider said)")
        if not applied and (result is not None or result_json is not None):
            raise MisuseError("a result goes with applied=True")
        r = _opt_text(result, result_json)
        rc = L.guard_resolve(
            g, _name(session, "session"), _name(call_id, "call_id"),
            int(Outcome.APPLIED if applied else Outcome.NOT_APPLIED),
            r, len(r) if r else 0,
            _name(reason, "reason") if reason else None,
            _name(by, "by") if by is not None else None)
        if rc:
            if rc == _NOTFOUND:
                raise error_for(rc, "no record of %s %s" % (session, call_id))
            raise _err(g, rc)

    def record(self, session: str, call_id: str) -> Dict[str, Any]:
        """The record of one action as a dict (SPEC §5); NotFoundError when
        there is none.  ``result`` is decoded from JSON."""
        g = self._h()
        p = ctypes.POINTER(L.Record)()
        rc = L.guard_record(g, _name(session, "session"),
                            _name(call_id, "call_id"), _byref(p))
        if rc:
            if rc == _NOTFOUND:
                raise error_for(rc, "no record of %s %s" % (session, call_id))
            raise _err(g, rc)
        try:
            r = p.contents
            d = {f: getattr(r, f) for f, _ in L.Record._fields_}
        finally:
            L.record_free(p)
        for f, _ in L.Record._fields_:
            if isinstance(d[f], bytes):
                d[f] = _decode(d[f])
        d["cls"] = CLASSES.get(d["cls"], d["cls"])
        d["state"] = STATES.get(d["state"], d["state"])
        d["resolution"] = RESOLUTIONS.get(d["resolution"], d["resolution"])
        if d["result"] is not None:
            d["result"] = json.loads(d["result"])
        return d

    # ---- guarded Python tools ---------------------------------------------

    def tool(self, name: Optional[str] = None,
             status: Optional[ToolFn] = None, *,
             session: Optional[str] = None, natural: Optional[bool] = None,
             not_applied_on: Optional[Tuple[type, ...]] = None
             ) -> Callable[[Callable[..., Any]], Any]:
        """A decorator: ``@guard.tool("refund_payment", status=check)``.

        Over a natural function - ``def refund_payment(order_id: str,
        amount_cents: int) -> dict`` - it gives a function with the same
        name, signature, annotations and docstring, which guards each call
        and returns the Envelope; the session, call id and turn come from
        the framework's injected parameters or ``idem.call_context`` (see
        idem.natural); ``session`` is a default for calls that name none.

        Over ``fn(args, key)`` - two positional parameters named args and
        key, or two without annotations (``lambda a, k: ...``) - it gives a
        GuardedTool, called as ``tool(session, call_id, args)``.
        ``natural=True`` or ``False`` says which, whatever the signature.

        ``name`` is the tool's name in the policy (default: the function's
        name); ``status(args, key)`` is the status check, in either form:
        given here, it is the tool's status check even when the policy
        names none.

        ``not_applied_on``: a tuple of exception classes that prove the
        request was never sent (``(ConnectionRefusedError,)``): the
        function raising one is a NOT_APPLIED verdict, retried with the
        same key.  Any other exception ends the attempt without a verdict
        (SPEC 6a).  MisuseError (a TypeError) for anything but a tuple of
        exception classes, or for a class that includes TimeoutError or a
        reset, which prove nothing."""
        nao = _check_not_applied_on(not_applied_on)

        def wrap(fn: Callable[..., Any]) -> Any:
            nat = natural
            if nat is None:
                nat = not _is_args_key_form(fn)
            if nat:
                return natural_tool(self, name, fn, status, session, nao)
            if session is not None:
                raise MisuseError("session= is for natural tools; a "
                                  "GuardedTool takes the session per call")
            return GuardedTool(self, name or str(getattr(fn, "__name__", "")),
                               fn, status, nao)
        return wrap

    def call(self, session: str, call_id: str, tool: str, args: Args,
             run: ToolFn, status: Optional[ToolFn] = None,
             turn: Optional[str] = None, *,
             not_applied_on: Optional[Tuple[type, ...]] = None
             ) -> Envelope:
        """Guard one call of ``run(args, key)`` end to end; returns the
        Envelope.  The same as ``guard.tool(tool, status,
        not_applied_on=...)(run)(...)``."""
        nao = _check_not_applied_on(not_applied_on)
        k = (tool, run, status, nao)
        t = self._tools.get(k)
        if t is None:
            if len(self._tools) >= 256:  # callers that make a lambda a call
                self._tools.clear()
            t = self._tools[k] = GuardedTool(self, tool, run, status, nao)
        return t(session, call_id, args, turn)


# The step's accessors only read the step (no lock, no log, no callback):
# called through PyDLL they keep the GIL, where a CDLL call would give it up
# and take it back - a wait, under load, for every field read.  The step's
# other functions may wait on the log and go through CDLL (the GIL given up).
_pydll = ctypes.PyDLL(L.path)


def _reader(name: str, restype: Any, *argtypes: Any) -> Any:
    f = _pydll[name]
    f.restype = restype
    f.argtypes = argtypes
    return f


_SZ = ctypes.POINTER(_c_size_t)
_step_next = _reader("idem_step_next", ctypes.c_int, _c_void_p)
_step_answer = _reader("idem_step_answer", ctypes.c_int, _c_void_p)
_step_key = _reader("idem_step_key", _c_char_p, _c_void_p)
_step_args = _reader("idem_step_args", _c_void_p, _c_void_p, _SZ)
_step_check_tool = _reader("idem_step_check_tool", _c_char_p, _c_void_p)
_step_check_args = _reader("idem_step_check_args", _c_void_p, _c_void_p,
                           _SZ)
_step_check_command = _reader("idem_step_check_command", _c_char_p,
                              _c_void_p)
_step_check_key = _reader("idem_step_check_key", _c_char_p, _c_void_p)
_step_check_target = _reader("idem_step_check_target", _c_void_p,
                             _c_void_p, _SZ)
_step_attempt = _reader("idem_step_attempt", ctypes.c_int, _c_void_p)
_step_deadline_ms = _reader("idem_step_deadline_ms", ctypes.c_longlong,
                            _c_void_p)
_step_delay_ms = _reader("idem_step_delay_ms", ctypes.c_longlong, _c_void_p)
_step_envelope = _reader("idem_step_envelope", _c_void_p, _c_void_p, _SZ)
_step_token = _reader("idem_step_token", ctypes.c_longlong, _c_void_p)
_time_sleep = time.sleep


def _step_text(step: "Step", fn: Any) -> Optional[str]:
    """A (pointer, length) accessor's text, or None."""
    n = _c_size_t()
    p = fn(step._h(), _byref(n))
    return _string_at(p, n.value).decode("utf-8") if p else None


def _raw_text(s: int, fn: Any) -> str:
    """A (pointer, length) accessor's text, of a step as a bare pointer
    (the asyncio path's), "" when it has none."""
    n = _c_size_t()
    p = fn(s, _byref(n))
    return _string_at(p, n.value).decode("utf-8") if p else ""


def _accessor(fn: Any, convert: Optional[Callable[[Any], Any]],
              doc: str) -> Any:
    """A read-only property of a Step over the accessor fn: convert is
    applied to its value, or None for a (pointer, length) text."""
    if convert is None:
        return property(lambda self: _step_text(self, fn), doc=doc)
    conv = convert
    return property(lambda self: conv(fn(self._h())), doc=doc)


class Step(_Handle):
    """One call walked through the guard.  Read ``next`` and act:

    EXECUTE  call the tool with ``key`` and ``args`` within ``deadline_ms``
             (after sleeping ``delay_ms``), then ``finish(outcome, ...)``;
    CHECK    run the status check (``check_tool`` / ``check_args``, or your
             own lookup of ``check_key``), then ``resolve(outcome, ...)``;
    WAIT     sleep ``delay_ms``, then ``poll()``;
    ANSWER   ``delivered()``, then give ``envelope`` to the model.

    A late result (after you reported UNKNOWN) still goes to ``finish``,
    even after ANSWER.  Free the step with ``close()`` or a with block."""

    __slots__ = ("guard", "_s", "__weakref__")

    def __init__(self, guard: Guard, s: int) -> None:
        self.guard = guard  # keeps the policy alive while the step lives
        self._s: Optional[int] = s

    def _h(self) -> int:
        if self._s is None:
            raise MisuseError("the step is closed")
        return self._s

    def close(self) -> None:
        if self._s is not None:
            L.step_free(self._s)
            self._s = None

    def _check(self, rc: int) -> None:
        if rc:
            raise _err(self.guard._g or 0, rc)

    @property
    def next(self) -> Next:
        return Next(_step_next(self._h()))

    def finish(self, outcome: int, result: Any = None,
               error: Optional[str] = None,
               result_json: Optional[str] = None) -> None:
        """Report the downstream call: APPLIED with its result (a Python
        value, or ``result_json`` as text), REJECTED, NOT_APPLIED or
        UNKNOWN with an error text."""
        r = _opt_text(result, result_json)
        self._check(L.step_finish(
            self._h(), _outcome(outcome), r, len(r) if r else 0,
            error.encode("utf-8", "replace") if error else None))

    def resolve(self, outcome: int, result: Any = None,
                result_json: Optional[str] = None) -> None:
        """Report the status check: APPLIED (with its result), NOT_APPLIED,
        or UNKNOWN when the check itself failed."""
        r = _opt_text(result, result_json)
        self._check(L.step_resolve(self._h(), _outcome(outcome), r,
                                   len(r) if r else 0))

    def poll(self) -> None:
        self._check(L.step_poll(self._h()))

    def delivered(self) -> None:
        """The model is being given the envelope (call it first).  Not for
        a reader that is gone: an answer nobody reads tells the model
        nothing (SPEC 10, "told")."""
        self._check(L.step_delivered(self._h()))

    def undelivered(self) -> None:
        """The envelope did not reach the model after all (its write
        failed): undo what ``delivered`` recorded, so the outcome fences
        the model's re-issue again."""
        self._check(L.step_undelivered(self._h()))

    def attempt_ended(self) -> None:
        """The attempt about to be finished is known to have ended (the tool
        returned or raised, the process exited): nothing of it runs any
        more.  Ended is not finished (SPEC 6a): with UNKNOWN it stays in
        doubt, and may land until the tool's settle_ms has passed since
        now; only with settle_ms 0 (effects end with the function) is the
        end a finish."""
        self._check(L.step_attempt_ended(self._h()))

    key = _accessor(_step_key, _decode, "the idempotency key")
    args = _accessor(_step_args, None, "the arguments to send: canonical "
                     "JSON text, the key written into key_arg")
    check_tool = _accessor(_step_check_tool, _decode,
                           "the policy's status tool (CHECK), or None")
    check_args = _accessor(_step_check_args, None,
                           "the status tool's arguments (JSON text)")
    check_command = _accessor(_step_check_command, _decode,
                              "the policy's status command, or None")
    check_key = _accessor(_step_check_key, _decode,
                          "the key of the action under check")
    check_target = _accessor(_step_check_target, None,
                             "the canonical arguments of the action under "
                             "check")
    attempt = _accessor(_step_attempt, int, "the coming attempt (1, 2, ...)")
    deadline_ms = _accessor(_step_deadline_ms, int,
                            "the deadline of the coming EXECUTE or CHECK")
    delay_ms = _accessor(_step_delay_ms, int, "wait this long first")
    token = _accessor(_step_token, int, "the fencing token the step holds")

    @property
    def answer(self) -> Optional[str]:
        """The envelope's status ("succeeded", ...), None before ANSWER."""
        return ANSWERS.get(_step_answer(self._h()))

    @property
    def envelope(self) -> Optional[Envelope]:
        """The Envelope, once the step says ANSWER (else None)."""
        t = _step_text(self, _step_envelope)
        return Envelope(t) if t is not None else None

    @property
    def envelope_text(self) -> Optional[str]:
        """The envelope's JSON text as the library made it, once the step
        says ANSWER (else None)."""
        return _step_text(self, _step_envelope)


# ---- the synchronous API: Python functions run by idem_guard_call ----------
#
# The C library calls the tool from a worker thread it starts itself.  ctypes
# callbacks take the GIL on entry (PyGILState_Ensure) and give it back on
# return, and idem_guard_call is called with the GIL released (a CDLL
# function), so the caller waiting on the deadline never holds it.  The two
# trampolines below live as long as the module; a call passes the id of its
# GuardedTool as ctx, looked up in a weak registry, so a callback that comes
# after its tool is gone finds nothing and answers UNKNOWN instead of
# jumping into freed memory.

_registry: "weakref.WeakValueDictionary[int, Any]" = \
    weakref.WeakValueDictionary()
_next_id = iter(range(1, 1 << 62))
_inflight = 0
_inflight_lock = threading.Lock()
_last_end = 0.0  # when the last tool run ended (time.monotonic())
# not empty once a call answered while a tool run went on
_runs: List[int] = []
exit_wait_s = float(os.environ.get("IDEM_EXIT_WAIT_S", "10"))


# a NULL check: the tool has no status function
_NO_CHECK = L.TOOL_FN()  # type: ignore[call-overload]


def _give(pp: Any, data: Optional[bytes]) -> None:
    """Hand bytes to C as a NUL-terminated string from idem_malloc() (the
    library frees it)."""
    if data is None:
        return
    p = L.malloc(len(data) + 1)
    if not p:
        return
    ctypes.memmove(p, data, len(data))
    ctypes.memset(p + len(data), 0, 1)
    pp[0] = p


def _inflight_add(n: int) -> None:
    """A tool run starts (1) or ends (-1): what the exit waits for."""
    global _inflight, _last_end
    with _inflight_lock:
        _inflight += n
        if n < 0:
            _last_end = time.monotonic()


def _outlived() -> None:
    """A call answered while its tool run goes on: at exit, wait for it."""
    if not _runs:
        _runs.append(1)


def _run(ctx: int, key: bytes, args: int, args_len: int, result_pp: Any,
         error_pp: Any, is_check: bool) -> int:
    _inflight_add(1)
    try:
        t = _registry.get(ctx)
        fn = t and (t.status if is_check else t.fn)
        if fn is None:
            _give(error_pp, b"the Python tool is gone")
            return _UNKNOWN
        a = json.loads(_string_at(args, args_len))
        k = key.decode("utf-8", "surrogateescape")
        context = getattr(t, "context", None)
        run: ToolFn = fn
        outcome, result, error = _verdict(
            lambda: _settled(_in_context(run, a, k, context)), is_check,
            t.not_applied_on)
        _give(result_pp, result)
        _give(error_pp, error)
        return outcome
    except BaseException:
        return _UNKNOWN
    finally:
        _inflight_add(-1)


@L.TOOL_FN  # type: ignore[misc]
def _run_cb(ctx: int, key: bytes, args: int, args_len: int,
            result_pp: Any, error_pp: Any) -> int:
    return _run(ctx, key, args, args_len, result_pp, error_pp, False)


@L.TOOL_FN  # type: ignore[misc]
def _check_cb(ctx: int, key: bytes, args: int, args_len: int,
              result_pp: Any, error_pp: Any) -> int:
    return _run(ctx, key, args, args_len, result_pp, error_pp, True)


@atexit.register
def _wait_inflight() -> None:
    """At exit, give tool runs the guard stopped waiting for a bounded time
    to end, so that their late results are recorded."""
    grace = 0.25  # for the worker's own write of the late result
    if not _inflight and not _runs:
        return
    until = time.monotonic() + exit_wait_s
    while _inflight and time.monotonic() < until:
        time.sleep(0.01)
    time.sleep(max(0.0, grace - (time.monotonic() - _last_end)))


class GuardedTool:
    """A Python function guarded as a tool.

    ``fn(args, key)`` gets the arguments as a dict (canonical, with the key
    written into the policy's key_arg) and the idempotency key.  It returns
    the result (anything JSON can encode): the call was APPLIED.  It raises
    ``idem.Rejected`` for a definite failure that applied nothing,
    ``idem.NotApplied`` when it certainly did not apply (retried with the
    same key).  Those are verdicts; any other exception means the outcome
    is UNKNOWN and the attempt ended without a verdict: what it sent may
    still land (SPEC 6a), so neither a retry nor the model's re-issue runs
    it again on a status check that does not show it yet - unless the
    policy says the provider dedupes, or the tool's settle_ms has passed
    since it ended (settle_ms 0: its effects end with the function).
    ``not_applied_on``, a tuple of exception classes that prove nothing was
    sent (``(ConnectionRefusedError,)``), makes those a NOT_APPLIED verdict.

    ``status(args, key)``, the status check, returns the applied result, or
    None (or raises NotApplied) when the action did not take effect; an
    exception means the check failed (UNKNOWN).  Given here, it is the
    tool's status check even when the policy names none.

    Calling the tool, ``tool(session, call_id, args)`` with the args as a
    JSON text or a dict, returns the Envelope; ``tool.call_json(...)``
    returns the envelope's JSON text, without parsing it."""

    def __init__(self, guard: Guard, name: str, fn: ToolFn,
                 status: Optional[ToolFn] = None,
                 not_applied_on: Optional[Tuple[type, ...]] = None) -> None:
        if not callable(fn) or (status is not None and not callable(status)):
            raise MisuseError("a guarded tool and its status are callables")
        self.guard = guard
        self.name = name
        self._name = _name(name, "tool")
        self.fn = fn
        self.status = status
        self.not_applied_on = _check_not_applied_on(not_applied_on)
        # a status function given in code is a status check, whatever the
        # policy names (idem_call.own_check; idem_guard_call also reads it
        # from the check it is given)
        self._own_check = 1 if status is not None else 0
        self._id = next(_next_id)
        _registry[self._id] = self
        self._ctool = L.Tool(_run_cb, _check_cb if status else _NO_CHECK,
                             self._id)
        self._ctool_ref = _byref(self._ctool)
        self._name_addr = id(self._name) + _OFF
        self.__name__ = getattr(fn, "__name__", name)
        self.__doc__ = getattr(fn, "__doc__", None)

    def call_json(self, session: str, call_id: str, args: Args,
                  turn: Optional[str] = None) -> str:
        """Guard one call; the envelope's JSON text, unparsed.  ``turn``
        names the model turn that issued the call (the model response's
        id, say): identical calls of one turn are one decision, and run
        once even when the first has already finished (SPEC 6.4)."""
        # The replay's path, kept short: a few type tests, the idem_call
        # packed into a bytes object (its pointers are the buffers of s, i,
        # self._name and a, which stay referenced until the call returns),
        # the call, one copy of the envelope, its free.  Odd input takes the
        # slow way (_slow_*) for its checks and messages.  Sessions repeat
        # from call to call: their checked, encoded form is kept.
        try:
            s = _sessions[session]
        except (KeyError, TypeError):
            s = _slow_session(session)
        try:
            if type(call_id) is not str or not call_id or "\0" in call_id:
                raise UnicodeError
            i = call_id.encode()
            a = args.encode() if type(args) is str else _slow_args(args)
        except UnicodeError:
            i = _name(call_id, "call_id")
            a = _slow_args(args)
        try:
            out, ro = _tls.out
        except AttributeError:
            out = _c_char_p()
            out, ro = _tls.out = out, _byref(out)
        t = None if turn is None else _turn(turn)
        ctx = _copy_context()
        # the caller's contextvars reach the tool on the worker thread
        wc = _WithContext(self, ctx) if len(ctx) else None
        rc = _guard_call(self.guard._gp, _pack_call(
            _CALL_SIZE, id(s) + _OFF, id(i) + _OFF, self._name_addr, id(a) + _OFF,
            len(a), 0 if t is None else id(t) + _OFF, self._own_check),
            self._ctool_ref if wc is None else _byref(wc._ctool), ro, None)
        if rc:
            if out:
                _free(out)
            if self.guard._g is None:
                raise MisuseError("the guard is closed")
            raise _err(self.guard._g, rc)
        text: bytes = out.value or b""  # the envelope: NUL-terminated JSON
        _free(out)
        if _inflight:  # a tool run goes on past its answer (or another's)
            _runs.append(1)
        return text.decode()

    def __call__(self, session: str, call_id: str, args: Args,
                 turn: Optional[str] = None) -> Envelope:
        return Envelope(self.call_json(session, call_id, args, turn))

    async def acall(self, session: str, call_id: str, args: Args,
                    turn: Optional[str] = None) -> Envelope:
        """Guard one call from asyncio; the Envelope.  The event loop is
        never blocked: the log's writes go through the C library's
        completion queue (its own threads; the loop watches the queue's
        pipe), an ``async def`` tool runs as a task of this loop (so it
        may use the loop's client sessions), a plain one on a thread.  The
        guard owns the deadline: past it the answer is outcome_unknown
        (after the status check), while the tool's task goes on, and its
        result is recorded when it comes (SPEC 6a: a task still running is
        an attempt that can still land).  Cancelling the caller does not
        cancel the attempt: it goes on to its end and its outcome is
        recorded, but it is not delivered (the model was not told), so a
        re-issue is answered already_applied or fenced, never run twice.
        See the binding's README."""
        return Envelope(await _aio.acall(self, session, call_id, args, turn))


class _WithContext:
    """A call of a GuardedTool that carries the caller's contextvars to the
    guard's worker thread: registered under an id of its own, as the ctx of
    a Tool struct made for the call."""

    __slots__ = ("fn", "status", "not_applied_on", "context", "_ctool",
                 "__weakref__")

    def __init__(self, tool: "GuardedTool",
                 context: contextvars.Context) -> None:
        self.fn, self.status, self.context = tool.fn, tool.status, context
        self.not_applied_on = tool.not_applied_on
        cid = next(_next_id)
        _registry[cid] = self
        self._ctool = L.Tool(_run_cb, _check_cb if tool.status
                             else _NO_CHECK, cid)


def _call_json_portable(self: GuardedTool, session: str, call_id: str,
                        args: Args, turn: Optional[str] = None) -> str:
    """GuardedTool.call_json where CPython's bytes layout is not known: a
    ctypes idem_call per call."""
    s = _name(session, "session")
    i = _name(call_id, "call_id")
    a = _slow_args(args)
    out = _c_char_p()
    ctx = _copy_context()
    wc = _WithContext(self, ctx) if len(ctx) else None
    rc = _guard_call(self.guard._gp,
                     _byref(_Call(s, i, self._name, a, len(a),
                                  _turn(turn), self._own_check)),
                     self._ctool_ref if wc is None else _byref(wc._ctool),
                     _byref(out), None)
    if rc:
        if out:
            _free(out)
        raise _err(self.guard._g or 0, rc)
    text = out.value or b""
    _free(out)
    return text.decode()


if L.BYTES_OFFSET is None:
    setattr(GuardedTool, "call_json", _call_json_portable)

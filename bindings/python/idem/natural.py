"""Natural tools: a guarded function that keeps its own signature.

    @guard.tool("refund_payment", status=refund_status)
    def refund_payment(order_id: str, amount_cents: int) -> dict:
        \"\"\"Refund part of an order.\"\"\"
        return psp.refund(order_id, amount_cents,
                          idempotency_key=idem.current_key())

``refund_payment`` is then a function with the same name, signature,
annotations and docstring as the one written (functools.wraps and
``__signature__``; ``__wrapped__`` is the bare function), so a framework's
decorator stacked on top of it (the OpenAI Agents SDK's ``@function_tool``,
FastMCP's ``@mcp.tool()``, LangChain's ``@tool``) derives the schema it
would derive from the bare function, and calls it the way it calls the
bare one.  Calling it guards the call and returns the Envelope (a dict:
``status``, ``result`` - what the function returned - and the rest of
SPEC §7); an ``async def`` gives an ``async def`` (awaited, through
GuardedTool.acall).

What is not in the arguments - the session, the model's tool-call id, the
turn - comes, for each, from the first of:

1. the framework, for this very call: a parameter it fills in and the
   model never sees, recognised by its annotation (by name, without
   importing the framework):

   - ``Annotated[str, InjectedToolCallId]`` (LangChain / LangGraph): the
     tool call's id;
   - ``ToolContext`` / ``RunContextWrapper`` (OpenAI Agents SDK, the first
     parameter): its ``tool_call_id``;
   - ``ToolRuntime`` (LangGraph): its ``tool_call_id``;
   - ``Context`` of ``mcp`` or ``fastmcp`` (MCP Python SDK, FastMCP): the
     request's ``_meta`` ``io.idem/session``, ``io.idem/call_id``,
     ``io.idem/turn`` (what idem's MCP gateway reads too);
2. ``with idem.call_context(session=..., call_id=..., turn=...)`` around
   the call (a contextvar: it reaches threads started through
   ``contextvars.copy_context().run`` - as LangChain's executor does - and
   asyncio tasks created inside the block);
3. what the framework says of the run: the session from the
   ``thread_id`` of a LangGraph ``RunnableConfig`` (a ``config`` parameter,
   or ``ToolRuntime.config``); the turn from the state's messages (an
   ``Annotated[..., InjectedState]`` parameter, or ``ToolRuntime.state``):
   the id of the AI message that carries this tool call; for MCP, the call
   id from the JSON-RPC request id, scoped to its connection
   (``jsonrpc:NONCE:ID``, as the gateway does);
4. the decorator's ``session=``; for MCP only, then a session drawn at
   random once per process (with a warning, as the gateway does).

Those parameters are passed to the function as the framework gave them and
kept out of the arguments the key is minted from.  A call with no call id,
or (outside MCP) no session, raises MisuseError saying what to set;
nothing is run or recorded.  Without a turn, identical calls within the
tool's coalesce_ms count as one turn.
"""
import collections
import contextlib
import functools
import inspect
import json
import re
import secrets
import threading
import types
import typing
import warnings
import weakref
from contextvars import ContextVar
from typing import (Any, Callable, Dict, Iterator, List, NamedTuple,
                    Optional, Tuple)

from .errors import InvalidError, MisuseError


class CallContext(NamedTuple):
    """What ``idem.call_context`` says of the calls made inside it (None:
    not said)."""

    session: Optional[str]
    call_id: Optional[str]
    turn: Optional[str]


_call_context: ContextVar[CallContext] = ContextVar(
    "idem_call_context", default=CallContext(None, None, None))


def _id_or_none(value: Any, what: str) -> Optional[str]:
    if value is None:
        return None
    if type(value) is not str:
        raise MisuseError("call_context: %s must be a str, not %s"
                          % (what, type(value).__name__))
    if not value:
        raise InvalidError("call_context: %s is empty" % what)
    return value


@contextlib.contextmanager
def call_context(session: Optional[str] = None,
                 call_id: Optional[str] = None,
                 turn: Optional[str] = None) -> Iterator[CallContext]:
    """Name the session, call id and turn of the natural tools called in
    the block.  Blocks nest: what an inner block leaves out (None) comes
    from the outer one, so a harness may name the session around a run,
    the turn around a model response's tool calls and the call id around
    one call.  A contextvar: asyncio tasks created inside the block, and
    threads run through ``contextvars.copy_context().run``, see it."""
    outer = _call_context.get()
    now = CallContext(
        _id_or_none(session, "session") or outer.session,
        _id_or_none(call_id, "call_id") or outer.call_id,
        _id_or_none(turn, "turn") or outer.turn)
    token = _call_context.set(now)
    try:
        yield now
    finally:
        _call_context.reset(token)


def current_call() -> CallContext:
    """What the enclosing ``idem.call_context`` blocks say."""
    return _call_context.get()


# ---- what frameworks fill in ------------------------------------------------
#
# Each recognised parameter has a kind.  The frameworks are never imported:
# their markers are known by their class names (and, for the generic name
# "Context", its package).

CALL_ID = "tool_call_id"  # LangChain InjectedToolCallId
STATE = "state"           # LangGraph InjectedState
INJECTED = "injected"     # another LangChain InjectedToolArg (the store)
CONFIG = "config"         # LangChain RunnableConfig
RUNTIME = "runtime"       # LangGraph ToolRuntime
AGENTS = "agents"         # OpenAI Agents SDK ToolContext, RunContextWrapper
MCP = "mcp"               # MCP Python SDK / FastMCP Context


def _mro_names(t: type) -> List[str]:
    try:
        return [c.__name__ for c in t.__mro__]
    except (AttributeError, TypeError):
        return [getattr(t, "__name__", "")]


def _kind_of_class(t: Any) -> Optional[str]:
    if not isinstance(t, type):
        return None
    names = _mro_names(t)
    if "ToolContext" in names or "RunContextWrapper" in names:
        return AGENTS
    if "ToolRuntime" in names:
        return RUNTIME
    if "RunnableConfig" in names:
        return CONFIG
    if "Context" in names:
        for c in t.__mro__:
            if c.__name__ == "Context" and (c.__module__ or "").split(".")[
                    0] in ("mcp", "fastmcp"):
                return MCP
    return None


def _kind_of_marker(m: Any) -> Optional[str]:
    """The kind of one Annotated metadata item (a class or an instance)."""
    names = _mro_names(m if isinstance(m, type) else type(m))
    if "InjectedToolCallId" in names:
        return CALL_ID
    if "InjectedState" in names:
        return STATE
    if "InjectedToolArg" in names or "InjectedStore" in names:
        return INJECTED
    return None


_WORD = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")


def _kind_of_text(text: str) -> Optional[str]:
    """An annotation left as text (a name that could not be resolved):
    judged by the names in it."""
    words = set(_WORD.findall(text))
    for name, kind in (("InjectedToolCallId", CALL_ID),
                       ("InjectedState", STATE), ("InjectedStore", INJECTED),
                       ("InjectedToolArg", INJECTED),
                       ("ToolContext", AGENTS), ("RunContextWrapper", AGENTS),
                       ("ToolRuntime", RUNTIME),
                       ("RunnableConfig", CONFIG)):
        if name in words:
            return kind
    return None


def kind_of(annotation: Any) -> Optional[str]:
    """What a parameter with this annotation is to a framework: one of the
    kinds above, or None for an argument the model gives."""
    if annotation is inspect.Parameter.empty:
        return None
    if isinstance(annotation, str):
        return _kind_of_text(annotation)
    if isinstance(annotation, typing.ForwardRef):
        return _kind_of_text(annotation.__forward_arg__)
    metadata = getattr(annotation, "__metadata__", None)
    if metadata is not None:  # Annotated[T, ...]
        for m in metadata:
            k = _kind_of_marker(m)
            if k:
                return k
        return kind_of(typing.get_args(annotation)[0])
    origin = typing.get_origin(annotation)
    if origin is typing.Union or getattr(origin, "__name__", "") == \
            "UnionType":  # Optional[X], X | None
        for a in typing.get_args(annotation):
            k = kind_of(a)
            if k:
                return k
        return None
    return _kind_of_class(origin if origin is not None else annotation)


def _hints(fn: Callable[..., Any]) -> Dict[str, Any]:
    """The parameters' annotations resolved (typing.get_type_hints with
    Annotated kept), or as written when they cannot be resolved."""
    try:
        return typing.get_type_hints(fn, include_extras=True)
    except Exception:
        return {}


# ---- reading what they fill in --------------------------------------------


def _field(obj: Any, name: str) -> Any:
    if isinstance(obj, dict):
        return obj.get(name)
    return getattr(obj, name, None)


def _text_id(value: Any) -> Optional[str]:
    """An id as text: a non-empty str, or an int as its decimal text."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str) and value:
        return value
    return None


def _thread_id(config: Any) -> Optional[str]:
    configurable = _field(config, "configurable")
    return _text_id(_field(configurable, "thread_id")) if configurable \
        else None


def _turn_of(state: Any, call_id: str) -> Optional[str]:
    """The id of the AI message that carries the tool call call_id, from
    a LangGraph state (or its messages)."""
    messages = state if isinstance(state, list) else _field(state,
                                                            "messages")
    if not isinstance(messages, (list, tuple)):
        return None
    for m in reversed(messages):
        for tc in _field(m, "tool_calls") or ():
            if _field(tc, "id") == call_id:
                return _text_id(_field(m, "id"))
    return None


_META = ("io.idem/session", "io.idem/call_id", "io.idem/turn")


def _mcp_meta(ctx: Any) -> Tuple[Dict[str, str], Any]:
    """The io.idem/* members of an MCP request's _meta, and the request
    context (None outside a request)."""
    try:
        rc = ctx.request_context
    except Exception:  # "Context is not available outside of a request"
        return {}, None
    meta = getattr(rc, "meta", None)
    found: Dict[str, str] = {}
    if meta is None:
        return found, rc
    if isinstance(meta, dict):
        extra: Dict[str, Any] = meta
    else:
        extra = dict(getattr(meta, "model_extra", None) or {})
        for name in _META:
            if name not in extra and hasattr(meta, name):
                extra[name] = getattr(meta, name)
    for name in _META:
        if name in extra:
            v = _text_id(extra[name])
            if v is None:
                raise InvalidError(
                    "_meta \"%s\" is %s; give a non-empty string (or an "
                    "integer), or leave it out; the tool was not called"
                    % (name, "empty" if extra[name] == "" else
                       "not a string"))
            found[name] = v
    return found, rc


_nonces: "weakref.WeakKeyDictionary[Any, str]" = weakref.WeakKeyDictionary()
_nonces_by_id: Dict[int, str] = {}
_nonce_mu = threading.Lock()


def _connection_nonce(session: Any) -> str:
    """16 random hex digits for one MCP connection (its session object):
    JSON-RPC ids are numbered per connection."""
    with _nonce_mu:
        try:
            n = _nonces.get(session)
            if n is None:
                n = _nonces[session] = secrets.token_hex(8)
        except TypeError:  # not weakly referenceable
            n = _nonces_by_id.setdefault(id(session), secrets.token_hex(8))
        return n


_mcp_session: List[str] = []


def _process_session() -> str:
    """MCP without a session anywhere: one drawn for this process, as
    `idem mcp` draws one per run (and says so)."""
    with _nonce_mu:
        if not _mcp_session:
            _mcp_session.append("mcp-" + secrets.token_hex(8))
            warnings.warn(
                "idem: an MCP tool was called with no session (no _meta "
                "\"io.idem/session\", no idem.call_context, no session= on "
                "the decorator): using %s for this process; a call re-issued "
                "after a restart will not be recognised" % _mcp_session[0],
                RuntimeWarning, stacklevel=4)
        return _mcp_session[0]


class _Ids:
    """The session, call id and turn of one call, found as the module's
    docstring says."""

    __slots__ = ("explicit", "derived", "state", "mcp")

    def __init__(self) -> None:
        self.explicit: Dict[str, str] = {}
        self.derived: Dict[str, str] = {}
        self.state: Any = None
        self.mcp = False

    def read(self, kind: str, value: Any) -> None:
        e, d = self.explicit, self.derived
        if kind == CALL_ID:
            v = _text_id(value)
            if v:
                e["call_id"] = v
        elif kind == AGENTS:
            v = _text_id(getattr(value, "tool_call_id", None))
            if v:
                e["call_id"] = v
        elif kind == RUNTIME:
            v = _text_id(getattr(value, "tool_call_id", None))
            if v:
                e["call_id"] = v
            s = _thread_id(getattr(value, "config", None))
            if s:
                d.setdefault("session", s)
            if self.state is None:
                self.state = getattr(value, "state", None)
        elif kind == CONFIG:
            s = _thread_id(value)
            if s:
                d.setdefault("session", s)
        elif kind == STATE:
            self.state = value
        elif kind == MCP:
            self.mcp = True
            meta, rc = _mcp_meta(value)
            for name, v in meta.items():
                e[name[len("io.idem/"):]] = v
            rid = getattr(rc, "request_id", None) if rc is not None else None
            if rid is not None and not isinstance(rid, bool):
                d.setdefault("call_id", "jsonrpc:%s:%s" % (
                    _connection_nonce(getattr(rc, "session", None)),
                    json.dumps(rid)))

    def resolve(self, tool: str, default_session: Optional[str]
                ) -> Tuple[str, str, Optional[str]]:
        cc = _call_context.get()
        e, d = self.explicit, self.derived
        call_id = e.get("call_id") or cc.call_id or d.get("call_id")
        if not call_id:
            raise MisuseError(
                "%s was called with no call id, so nothing was run or "
                "recorded: call it inside `with idem.call_context("
                "session=..., call_id=..., turn=...)` with the model's "
                "tool-call id, or give it a parameter the framework fills "
                "in with that id (LangGraph: `tool_call_id: Annotated[str, "
                "InjectedToolCallId]`; the OpenAI Agents SDK: a first "
                "parameter `ctx: ToolContext`; MCP: `ctx: Context`)" % tool)
        if self.state is not None and "turn" not in d:
            t = _turn_of(self.state, call_id)
            if t:
                d["turn"] = t
        session = e.get("session") or cc.session or d.get("session") or \
            default_session
        if not session:
            if not self.mcp:
                raise MisuseError(
                    "%s was called with no session, so nothing was run or "
                    "recorded: name the agent's run with `with "
                    "idem.call_context(session=run_id)` around it (or its "
                    "LangGraph thread_id, given a `config: RunnableConfig` "
                    "or `runtime: ToolRuntime` parameter), or give the "
                    "decorator a default: @guard.tool(..., session=...)"
                    % tool)
            session = _process_session()
        turn = e.get("turn") or cc.turn or d.get("turn")
        return session, call_id, turn


# ---- the arguments the key is minted from ---------------------------------


def _jsonable(value: Any) -> Any:
    """json's default= for the values frameworks hand a tool: pydantic
    models, dataclasses, enums; anything else is not an argument."""
    dump = getattr(value, "model_dump", None)
    if callable(dump):  # pydantic 2
        return dump(mode="json")
    if hasattr(value, "__dataclass_fields__") and not isinstance(value, type):
        import dataclasses
        return dataclasses.asdict(value)
    import enum
    if isinstance(value, enum.Enum):
        return value.value
    raise TypeError("%s is not JSON" % type(value).__name__)


_encode = json.JSONEncoder(ensure_ascii=False, allow_nan=False,
                           separators=(",", ":"), default=_jsonable).encode


# What the guarded function passes to the tool's run: its own arguments,
# as bound (a contextvar, so that it reaches the thread or task the tool
# runs on with the rest of the caller's context).
_bound: ContextVar[Optional[Tuple[Any, inspect.BoundArguments]]] = \
    ContextVar("idem_natural_call", default=None)


def _is_args_key_form(fn: Callable[..., Any]) -> bool:
    """``fn(args, key)``, the binding's first form: exactly two positional
    parameters without defaults, named args and key or not annotated
    (lambda a, k: ..., a bound method refund(self, args, key))."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return True
    ps = list(sig.parameters.values())
    if len(ps) != 2 or any(
            p.kind not in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) or
            p.default is not p.empty for p in ps):
        return False
    if [p.name for p in ps] == ["args", "key"]:
        return True
    return all(p.annotation is p.empty for p in ps)


def natural_tool(guard: Any, name: Optional[str], fn: Callable[..., Any],
                 status: Optional[Callable[..., Any]] = None,
                 session: Optional[str] = None,
                 not_applied_on: Optional[Tuple[type, ...]] = None
                 ) -> Callable[..., Any]:
    """The guarded function of ``fn`` (see the module's docstring)."""
    from .guard import Envelope, GuardedTool
    if not callable(fn):
        raise MisuseError("a guarded tool is a callable")
    if session is not None:
        _id_or_none(session, "session")
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise MisuseError("cannot read the signature of %r: %s" % (fn, e))
    tool: str = name or str(getattr(fn, "__name__", ""))
    if not tool:
        raise MisuseError("name the tool: @guard.tool(\"name\")")
    hints = _hints(fn)
    kinds: Dict[str, str] = {}
    for p in sig.parameters.values():
        k = kind_of(hints.get(p.name, p.annotation))
        if k:
            kinds[p.name] = k
    params = sig.parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    is_async = inspect.iscoroutinefunction(fn)
    me: List[Any] = []  # the GuardedTool, once made

    def arguments(a: Dict[str, Any], key: str
                  ) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
        b = _bound.get()
        if b is None or b[0] is not me[0]:
            # called as wrapper.guarded(session, call_id, args): the
            # arguments by name, as the guard sends them (less the key the
            # policy's key_arg holds, when the function has no such
            # parameter)
            return (), {n: v for n, v in a.items()
                        if n in params or v != key or takes_any}
        ba = b[1]
        # the policy's key_arg: the library wrote the key there; whatever
        # the model put there never reaches the tool
        override = [n for n, v in a.items()
                    if v == key and n in params and n not in kinds and
                    ba.arguments.get(n) != key]
        if override:
            ba = inspect.BoundArguments(
                sig, collections.OrderedDict(ba.arguments))
            for n in override:
                ba.arguments[n] = key
        return ba.args, ba.kwargs

    if is_async:
        async def run_async(a: Dict[str, Any], key: str) -> Any:
            args, kwargs = arguments(a, key)
            return await fn(*args, **kwargs)
        run: Callable[..., Any] = run_async
    else:
        def run_sync(a: Dict[str, Any], key: str) -> Any:
            args, kwargs = arguments(a, key)
            return fn(*args, **kwargs)
        run = run_sync
    guarded = GuardedTool(guard, tool, run, status, not_applied_on)
    me.append(guarded)

    def prepare(args: Tuple[Any, ...], kwargs: Dict[str, Any]
                ) -> Tuple[str, str, Optional[str], str,
                           inspect.BoundArguments]:
        ba = sig.bind(*args, **kwargs)  # a TypeError as the bare one's
        ba.apply_defaults()
        ids = _Ids()
        model: Dict[str, Any] = {}
        for n, v in ba.arguments.items():
            k = kinds.get(n)
            if k:
                ids.read(k, v)
            elif params[n].kind is params[n].VAR_KEYWORD:
                model.update(v)
            else:
                model[n] = v
        s, c, t = ids.resolve(tool, session)
        try:
            text = _encode(model)
        except (TypeError, ValueError) as e:
            raise InvalidError("%s: the arguments cannot be encoded as "
                               "JSON: %s" % (tool, e)) from None
        return s, c, t, text, ba

    if is_async:
        async def call_async(args: Tuple[Any, ...],
                             kwargs: Dict[str, Any]) -> Any:
            s, c, t, text, ba = prepare(args, kwargs)
            token = _bound.set((guarded, ba))
            try:
                return await guarded.acall(s, c, text, t)
            finally:
                _bound.reset(token)

        async def template_async(*args: Any, **kwargs: Any) -> Any:
            return await call_async(args, kwargs)
        template: Callable[..., Any] = template_async
    else:
        def call_sync(args: Tuple[Any, ...],
                      kwargs: Dict[str, Any]) -> Any:
            s, c, t, text, ba = prepare(args, kwargs)
            token = _bound.set((guarded, ba))
            try:
                return Envelope(guarded.call_json(s, c, text, t))
            finally:
                _bound.reset(token)

        def template_sync(*args: Any, **kwargs: Any) -> Any:
            return call_sync(args, kwargs)
        template = template_sync
    wrapper = _rebind(template, fn)
    functools.update_wrapper(wrapper, fn)
    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    wrapper.guarded = guarded  # type: ignore[attr-defined]
    return wrapper


def _rebind(template: Callable[..., Any],
            fn: Callable[..., Any]) -> Callable[..., Any]:
    """template as a function of fn's module: the same code and closure,
    fn's globals, so that a framework that resolves the wrapper's
    annotations in ``wrapper.__globals__`` (annotations written as text,
    ``from __future__ import annotations``) finds the names fn's module
    has.  The template refers to nothing but its closure."""
    g = getattr(inspect.unwrap(fn), "__globals__", None)
    if not isinstance(g, dict) or not isinstance(template, types.FunctionType):
        return template
    return types.FunctionType(template.__code__, g, template.__name__,
                              template.__defaults__, template.__closure__)

"""Stand-ins for what LangChain / LangGraph, the OpenAI Agents SDK and the
MCP Python SDK (FastMCP) put in a tool's signature and hand to it, with
their names, modules and fields - and for how each reads a tool function
to build its schema.  The frameworks are not installed here (no PyPI);
the binding recognises their markers by name, never importing them, so
these classes stand where theirs would.

Each ``*_schema`` function reads a function the way that framework's
decorator does (inspect.signature, typing.get_type_hints, the docstring,
inspect.iscoroutinefunction, which parameters it fills in itself), so a
test can check that a guarded function reads exactly as the bare one.
"""
import dataclasses
import inspect
import typing
from typing import Any, Dict, List, Optional, TypedDict


# ---- langchain_core.tools / langgraph.prebuilt ------------------------------

class InjectedToolArg:
    """Annotation for a tool argument the model does not generate."""


class InjectedToolCallId(InjectedToolArg):
    """Annotation for injecting the tool call's id."""


class InjectedState(InjectedToolArg):
    """Annotation for injecting the graph state (or one of its fields)."""

    def __init__(self, field: Optional[str] = None):
        self.field = field


class InjectedStore(InjectedToolArg):
    """Annotation for injecting the store."""


class RunnableConfig(TypedDict, total=False):
    tags: List[str]
    configurable: Dict[str, Any]


@dataclasses.dataclass
class ToolRuntime:
    state: Any
    context: Any
    config: RunnableConfig
    stream_writer: Any
    tool_call_id: Optional[str]
    store: Any


@dataclasses.dataclass
class AIMessage:
    content: str
    tool_calls: List[Dict[str, Any]]
    id: Optional[str] = None


InjectedToolArg.__module__ = "langchain_core.tools.base"
InjectedToolCallId.__module__ = "langchain_core.tools.base"
InjectedState.__module__ = "langgraph.prebuilt.tool_node"
InjectedStore.__module__ = "langgraph.prebuilt.tool_node"
RunnableConfig.__module__ = "langchain_core.runnables.config"
ToolRuntime.__module__ = "langgraph.prebuilt.tool_node"
AIMessage.__module__ = "langchain_core.messages.ai"


def _injected(hint: Any) -> bool:
    """langchain_core's _is_injected_arg_type: Annotated metadata that is
    an InjectedToolArg (a subclass, or an instance)."""
    if typing.get_origin(hint) is typing.Annotated:
        for m in typing.get_args(hint)[1:]:
            if isinstance(m, InjectedToolArg) or (
                    isinstance(m, type) and issubclass(m, InjectedToolArg)):
                return True
    return hint is ToolRuntime


def langchain_schema(func: Any) -> Dict[str, Any]:
    """What ``@tool`` (StructuredTool.from_function) and ToolNode read:
    the name, the docstring, the parameters with their annotations
    (Annotated kept), those the model fills in, those injected, and
    whether to await."""
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func, include_extras=True)
    model, injected = [], []
    for name, p in sig.parameters.items():
        hint = hints.get(name, p.annotation)
        if _injected(hint) or hint is RunnableConfig:
            injected.append((name, repr(hint)))
        else:
            model.append((name, repr(hint), repr(p.default), p.kind))
    return {"name": func.__name__, "description": func.__doc__,
            "model": model, "injected": injected,
            "coroutine": inspect.iscoroutinefunction(func)}


# ---- agents (the OpenAI Agents SDK) ---------------------------------------

@dataclasses.dataclass
class RunContextWrapper:
    context: Any
    usage: Any = None


@dataclasses.dataclass
class ToolContext(RunContextWrapper):
    tool_name: str = ""
    tool_call_id: str = ""
    tool_arguments: str = ""


RunContextWrapper.__module__ = "agents.run_context"
ToolContext.__module__ = "agents.tool_context"


def agents_schema(func: Any) -> Dict[str, Any]:
    """What ``@function_tool`` (function_schema) reads: func.__name__,
    inspect.getdoc, inspect.signature, typing.get_type_hints (without
    extras), a first parameter of type ToolContext / RunContextWrapper
    taken as the context, and inspect.iscoroutinefunction to choose
    between awaiting it and asyncio.to_thread."""
    sig = inspect.signature(func)
    hints = typing.get_type_hints(func)
    params = list(sig.parameters.items())
    takes_context = False
    fields = []
    for i, (name, p) in enumerate(params):
        ann = hints.get(name, p.annotation)
        origin = typing.get_origin(ann) or ann
        if i == 0 and origin in (RunContextWrapper, ToolContext):
            takes_context = True
            continue
        fields.append((name, repr(ann), repr(p.default), p.kind))
    return {"name": func.__name__, "description": inspect.getdoc(func),
            "fields": fields, "takes_context": takes_context,
            "coroutine": inspect.iscoroutinefunction(func)}


# ---- mcp.server.fastmcp (the MCP Python SDK) ------------------------------

class Meta:
    """RequestParams.Meta: progressToken, and any other member (pydantic
    extra="allow"), as model_extra."""

    def __init__(self, **extra: Any):
        self.progressToken = extra.pop("progressToken", None)
        self.model_extra = extra


class ServerSession:
    """One client connection."""


@dataclasses.dataclass
class RequestContext:
    request_id: Any
    meta: Optional[Meta]
    session: Any
    lifespan_context: Any = None


class Context:
    """The MCP Python SDK's Context: the request's context, the request id
    as text."""

    def __init__(self, request_context: Optional[RequestContext] = None):
        self._request_context = request_context

    @property
    def request_context(self) -> RequestContext:
        if self._request_context is None:
            raise ValueError("Context is not available outside of a request")
        return self._request_context

    @property
    def request_id(self) -> str:
        return str(self.request_context.request_id)


Meta.__module__ = "mcp.types"
ServerSession.__module__ = "mcp.server.session"
RequestContext.__module__ = "mcp.shared.context"
Context.__module__ = "mcp.server.fastmcp.server"


def mcp_schema(fn: Any) -> Dict[str, Any]:
    """What ``@mcp.tool()`` (Tool.from_function) reads: fn.__name__,
    fn.__doc__, the parameter annotated Context (found by subclass),
    inspect.signature with string annotations evaluated in
    ``fn.__globals__`` (func_metadata), and whether fn is async."""
    sig = inspect.signature(fn)
    globalns = getattr(fn, "__globals__", {})
    context_kwarg = None
    args = []
    for name, p in sig.parameters.items():
        ann = p.annotation
        if isinstance(ann, str):
            ann = eval(ann, globalns)  # pydantic's evaluation of a ForwardRef
        if isinstance(ann, type) and issubclass(ann, Context):
            context_kwarg = name
            continue
        args.append((name, repr(ann), repr(p.default), p.kind))
    return {"name": fn.__name__, "description": fn.__doc__,
            "args": args, "context_kwarg": context_kwarg,
            "coroutine": inspect.iscoroutinefunction(fn)}

"""Tool calls as the model APIs deliver them, normalized.

OpenAI Chat Completions:   {"id": "call_…", "type": "function",
                            "function": {"name": …, "arguments": "<JSON>"}}
OpenAI Responses:          {"type": "function_call", "call_id": "call_…",
                            "name": …, "arguments": "<JSON>"}
Anthropic Messages:        {"type": "tool_use", "id": "toolu_…",
                            "name": …, "input": {…}}

The arguments are kept as the model sent them: a JSON text stays text (the
library canonicalizes it, and rejects a duplicate member or a huge integer
that json.loads would quietly accept), a dict stays a dict.
"""
from collections import namedtuple
from typing import Any

from .errors import InvalidError, MisuseError


class ToolCall(namedtuple("ToolCall", "id name arguments")):
    """One tool call: the model's call id, the tool's name, and the
    arguments (a JSON text or a dict)."""

    __slots__ = ()

    @classmethod
    def parse(cls, obj: Any) -> "ToolCall":
        """A ToolCall from an OpenAI- or Anthropic-style tool call (a dict,
        or an SDK object with the same attributes)."""
        if not isinstance(obj, dict):
            if hasattr(obj, "model_dump"):  # the SDKs' pydantic objects
                obj = obj.model_dump()
            else:
                raise MisuseError("a tool call is a dict, not %s"
                                  % type(obj).__name__)
        kind = obj.get("type")
        if kind == "tool_use" or ("input" in obj and "function" not in obj):
            cid, name, args = obj.get("id"), obj.get("name"), obj.get("input")
            where = "Anthropic tool_use"
        elif "function" in obj:
            f = obj["function"]
            if not isinstance(f, dict):
                raise InvalidError("OpenAI tool call: \"function\" is not an "
                                   "object")
            cid, name, args = obj.get("id"), f.get("name"), f.get("arguments")
            where = "OpenAI tool call"
        elif kind == "function_call":
            cid, name = obj.get("call_id") or obj.get("id"), obj.get("name")
            args = obj.get("arguments")
            where = "OpenAI function_call"
        else:
            raise InvalidError("not a tool call: no \"function\", "
                               "\"input\" or \"type\" member")
        if not isinstance(cid, str) or not cid:
            raise InvalidError("%s: missing or empty id" % where)
        if not isinstance(name, str) or not name:
            raise InvalidError("%s %s: missing or empty name" % (where, cid))
        if args is None:
            args = {}
        if not isinstance(args, (str, dict)):
            raise InvalidError("%s %s: arguments must be a JSON text or an "
                               "object, not %s"
                               % (where, cid, type(args).__name__))
        return cls(cid, name, args)

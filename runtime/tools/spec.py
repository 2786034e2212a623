"""Tool definitions, tool choice and tool calls: OpenAI's wire shapes validated into named types. Torch-free.

Every check raises `ToolError` (a ValueError) carrying the request field it names (`param`), so the server
answers 400 with that field and the frontend raises a ValueError naming it.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Any

NAME_RE = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for function names
MAX_TOOLS = 128
EMPTY_PARAMETERS = {"type": "object", "properties": {}}


class ToolError(ValueError):
    """A bad tool definition, tool choice, tool call or tool message; `param` names the request field."""

    def __init__(self, message: str, param: str):
        super().__init__(message)
        self.param = param


@dataclass(frozen=True)
class Tool:
    """One function tool: name, description, its arguments' JSON schema (`parameters`)."""

    name: str
    description: str = ""
    parameters: Any = field(default_factory=lambda: dict(EMPTY_PARAMETERS), hash=False)

    def to_openai(self) -> dict:
        """OpenAI's `{"type": "function", "function": {...}}` shape (what chat templates take as `tools`)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description,
                                                 "parameters": self.parameters}}


@dataclass(frozen=True)
class ToolCall:
    """A parsed call: `arguments` is the JSON text of the arguments object, exactly as generated."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: new_call_id())

    def parsed_arguments(self) -> Any:
        """The arguments as a Python value."""
        return json.loads(self.arguments)

    def to_openai(self) -> dict:
        """`message.tool_calls[i]` in OpenAI's response shape."""
        return {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}


@dataclass(frozen=True)
class ToolChoice:
    """What the request allows: mode none | auto | required, or one named function (mode "named")."""

    mode: str
    name: str | None = None


def new_call_id() -> str:
    """A fresh OpenAI-style call id."""
    return "call_" + uuid.uuid4().hex[:24]


def parse_tools(raw: Any, where: str = "tools") -> list[Tool]:
    """OpenAI `tools` (also bare `{"name", "parameters"}` function objects, as frontend users write them)."""
    if not isinstance(raw, list) or not raw:
        raise ToolError(f"{where} must be a non-empty list of tools", where)
    if len(raw) > MAX_TOOLS:
        raise ToolError(f"{where} has {len(raw)} tools (at most {MAX_TOOLS})", where)
    tools, seen = [], set()
    for i, t in enumerate(raw):
        at = f"{where}[{i}]"
        if not isinstance(t, dict):
            raise ToolError(f"{at} must be an object", at)
        if "type" in t or "function" in t:
            if t.get("type", "function") != "function":
                raise ToolError(f"{at}.type must be \"function\" (only function tools are supported), got "
                                f"{t.get('type')!r}", f"{at}.type")
            if set(t) - {"type", "function"}:
                raise ToolError(f"unknown field(s) in {at}: {sorted(set(t) - {'type', 'function'})}", at)
            fn, at = t.get("function"), f"{at}.function"
        else:
            fn = t
        if not isinstance(fn, dict):
            raise ToolError(f"{at} must be an object {{name, description, parameters}}", at)
        unknown = sorted(set(fn) - {"name", "description", "parameters", "strict"})
        if unknown:
            raise ToolError(f"unknown field(s) in {at}: {unknown}", at)
        name = fn.get("name")
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise ToolError(f"{at}.name must match [A-Za-z0-9_-]{{1,64}}, got {name!r}", f"{at}.name")
        if name in seen:
            raise ToolError(f"duplicate tool name {name!r} in {where}", f"{at}.name")
        seen.add(name)
        desc = fn.get("description") or ""
        if not isinstance(desc, str):
            raise ToolError(f"{at}.description must be a string", f"{at}.description")
        params = fn.get("parameters")
        if params is None:
            params = dict(EMPTY_PARAMETERS)
        if not isinstance(params, (dict, bool)):
            raise ToolError(f"{at}.parameters must be a JSON schema object", f"{at}.parameters")
        if fn.get("strict") is not None and not isinstance(fn.get("strict"), bool):
            raise ToolError(f"{at}.strict must be a bool", f"{at}.strict")
        tools.append(Tool(name, desc, params))
    return tools


def parse_tool_choice(raw: Any, tools: list[Tool] | None) -> ToolChoice:
    """OpenAI `tool_choice` against the tool list (default: auto with tools, none without)."""
    if raw is None:
        return ToolChoice("auto" if tools else "none")
    if isinstance(raw, str):
        if raw not in ("none", "auto", "required"):
            raise ToolError(f"tool_choice must be none, auto, required or {{\"type\": \"function\", "
                            f"\"function\": {{\"name\": ...}}}}, got {raw!r}", "tool_choice")
        if raw != "none" and not tools:
            raise ToolError(f"tool_choice {raw!r} needs tools", "tool_choice")
        return ToolChoice(raw)
    if isinstance(raw, dict):
        fn = raw.get("function")
        if raw.get("type", "function") != "function" or not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise ToolError("tool_choice must be {\"type\": \"function\", \"function\": {\"name\": ...}}", "tool_choice")
        if not tools:
            raise ToolError("tool_choice names a function but no tools were given", "tool_choice")
        if fn["name"] not in {t.name for t in tools}:
            raise ToolError(f"tool_choice names {fn['name']!r}, which is not among the tools "
                            f"({', '.join(t.name for t in tools)})", "tool_choice")
        return ToolChoice("named", fn["name"])
    raise ToolError("tool_choice must be a string or an object", "tool_choice")


def parse_assistant_calls(raw: Any, where: str) -> list[ToolCall]:
    """An assistant message's `tool_calls` (OpenAI shape; `arguments` a JSON string or an object)."""
    if not isinstance(raw, list):
        raise ToolError(f"{where} must be a list", where)
    calls = []
    for j, c in enumerate(raw):
        at = f"{where}[{j}]"
        fn = c.get("function") if isinstance(c, dict) else None
        if not isinstance(fn, dict) or c.get("type", "function") != "function":
            raise ToolError(f"{at} must be {{\"id\", \"type\": \"function\", \"function\": {{name, arguments}}}}", at)
        name, args, cid = fn.get("name"), fn.get("arguments", "{}"), c.get("id")
        if not isinstance(name, str) or not name:
            raise ToolError(f"{at}.function.name must be a non-empty string", at)
        if not isinstance(cid, str) or not cid:
            raise ToolError(f"{at}.id must be a non-empty string", at)
        if not isinstance(args, str):
            args = json.dumps(args)
        try:
            json.loads(args)
        except ValueError:
            raise ToolError(f"{at}.function.arguments must be a JSON text, got {args[:60]!r}", at) from None
        calls.append(ToolCall(name, args, cid))
    return calls

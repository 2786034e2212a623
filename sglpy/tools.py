"""Frontend tool calling: `gen(name, tools=[...])` constrains the output to valid calls and stores them parsed.

The call layout is the generic one (runtime/tools/generic.py: `<tool_call>` tags around
`{"name": ..., "arguments": {...}}`), which the engine constrains with a structural tag, so every call that
comes back has arguments valid under its tool's schema. `tool_prompt(tools)` is the text that tells a
model about the tools and the layout (put it in the system message). The variable holds a `ToolResult`.
Imports of sglpy.runtime.tools happen on first use (torch-free, but kept off `import sglpy`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Optional


@dataclass(frozen=True)
class FunctionCall:
    """One parsed call: the function's name and its arguments (a dict valid under the tool's schema)."""

    name: str
    arguments: Any
    id: str = ""


@dataclass(frozen=True)
class ToolResult:
    """A tool gen's value: the text around the calls, the calls, and the raw generated text."""

    content: str
    calls: list[FunctionCall] = field(default_factory=list)
    text: str = ""
    incomplete: bool = False  # the output ended inside a call (max_tokens)

    @property
    def call(self) -> Optional[FunctionCall]:
        """The first call, or None when the model answered without calling."""
        return self.calls[0] if self.calls else None


@dataclass(frozen=True)
class ToolRequest:
    """What a tool gen asked for (kept on the gen node to parse its output)."""

    tools: tuple
    choice: str
    parallel: bool


def _format():
    from sglpy.runtime.tools import get_format

    return get_format("generic")


def tool_prompt(tools: list) -> str:
    """Instructions listing `tools` (OpenAI tool objects or bare {name, description, parameters}) and the layout."""
    from sglpy.runtime.tools import parse_tools

    return _format().instructions(parse_tools(list(tools)))


def tool_constraint(tools: list, tool_choice: Any = "required", parallel_tool_calls: bool = False
                    ) -> tuple[str, ToolRequest]:
    """(structural_tag JSON, ToolRequest) for a gen; ValueError naming a bad tool or choice.

    tool_choice: "auto" (text or calls), "required" (at least one call), or a tool's name (that tool).
    """
    from sglpy.runtime.tools import ToolError, parse_tool_choice, parse_tools
    from sglpy.runtime.tools import tool_constraint as build

    try:
        parsed = parse_tools(list(tools) if isinstance(tools, (list, tuple)) else tools)
        if tool_choice == "none":
            raise ToolError("gen(tools=...) with tool_choice \"none\": leave tools out instead", "tool_choice")
        raw = tool_choice
        if isinstance(tool_choice, str) and tool_choice not in ("auto", "required"):
            raw = {"type": "function", "function": {"name": tool_choice}}
        choice = parse_tool_choice(raw, parsed)
    except ToolError as e:
        raise ValueError(str(e)) from None
    if not isinstance(parallel_tool_calls, bool):
        raise ValueError("parallel_tool_calls must be a bool")
    return (build(_format(), parsed, choice, parallel_tool_calls),
            ToolRequest(tuple(json.dumps(t.to_openai()) for t in parsed), choice.mode, parallel_tool_calls))


def parse_result(text: str) -> ToolResult:
    """The ToolResult of a tool gen's generated text."""
    from sglpy.runtime.tools import parse_tool_calls

    parsed = parse_tool_calls(text, _format())
    calls = [FunctionCall(c.name, json.loads(c.arguments), c.id) for c in parsed.calls]
    return ToolResult(parsed.content.strip(), calls, text, parsed.incomplete)

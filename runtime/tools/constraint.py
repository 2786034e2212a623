"""The structural tag that constrains a request's tool calls, from its format, tools, choice and parallel flag.

- auto: free text; the format's trigger opens a call that must be one of the tools with valid arguments;
  without parallel_tool_calls the output ends after the first call.
- required: constrained from the first token to calls, one, or several joined by the format's joiner when
  parallel_tool_calls; the output may end after any of them.
- a named function: exactly one call of that function, then the output ends (as vLLM and SGLang).
- none: no constraint (the tools are not shown to the model either; see render.py).
"""

from __future__ import annotations

import json

from .base import ToolFormat
from .spec import Tool, ToolChoice


def tool_constraint(fmt: ToolFormat, tools: list[Tool], choice: ToolChoice, parallel: bool) -> str | None:
    """The structural_tag JSON text for this request, or None (tool_choice none)."""
    if choice.mode == "none" or not tools:
        return None
    named = choice.mode == "named"
    chosen = [t for t in tools if t.name == choice.name] if named else tools
    spec = {"type": "structural_tag", "structures": fmt.structures(chosen), "triggers": [fmt.trigger],
            "free_text": choice.mode == "auto", "max_tags": 1 if named or not parallel else None,
            "separator": fmt.joiner}
    return json.dumps(spec)


def structure_tool(tools: list[Tool], choice: ToolChoice, index: int) -> int:
    """Index in `tools` of the tool behind structure `index` of tool_constraint's tag (for error messages)."""
    if choice.mode == "named":
        return next(i for i, t in enumerate(tools) if t.name == choice.name)
    return index

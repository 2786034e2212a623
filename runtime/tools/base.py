"""ToolFormat: how one family of models writes tool calls (opening/closing text, argument key) and what follows from it.

A call is always the JSON object `{"name": NAME, ARGS_KEY: ARGUMENTS}`, wrapped in a *region*: `open` + calls
+ `close`, where one region holds one call unless the format lists several (`list_sep`). From these pieces a
format derives the structural tag that constrains generation (`structures`), the text of a call for a
conversation's history (`render_call`), the instructions shown to a model whose template cannot render
tools (`instructions`), and the parser's token sequences (runtime/tools/stream.py).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from .spec import Tool


@dataclass(frozen=True)
class ToolFormat:
    """The layout of tool calls for one model family (`name` is the --tool-call-parser value)."""

    name: str
    trigger: str  # text that starts a region in free text (a prefix of open + head)
    open: str  # canonical text opening a region
    close: str  # canonical text closing a region
    args_key: str = "arguments"
    list_sep: str | None = None  # separator between calls inside one region (None: one call per region)
    joiner: str = "\n"  # between regions when several calls are required in a row
    description: str = ""

    def __post_init__(self):
        if not (self.open + self.head("x")).startswith(self.trigger):
            raise ValueError(f"tool format {self.name}: the trigger must start the region's text")

    def head(self, name: str) -> str:
        """Canonical text of a call up to its arguments."""
        return "{" + f'"name": {json.dumps(name)}, {json.dumps(self.args_key)}: '

    def render_call(self, name: str, arguments: str) -> str:
        """A call as the model would write it (one region), for assistant messages in the history."""
        return self.open + self.head(name) + arguments + "}" + self.close

    def structures(self, tools: list[Tool]) -> list[dict]:
        """One structural-tag structure per tool: begin (up to the arguments), the parameters schema, end."""
        return [{"begin": self.open + self.head(t.name), "schema": t.parameters, "end": "}" + self.close}
                for t in tools]

    def instructions(self, tools: list[Tool]) -> str:
        """System-prompt text listing the tools and this format's call layout (templates without tool support)."""
        listing = "\n".join(json.dumps({"name": t.name, "description": t.description, "parameters": t.parameters})
                            for t in tools)
        example = self.render_call("<tool name>", "<arguments as a JSON object>")
        return ("You can call these tools (JSON schema of each tool's arguments):\n<tools>\n" + listing +
                "\n</tools>\nTo call a tool, reply with exactly:\n" + example + "\nYou will get the result in a "
                "<tool_response> message; then answer the user.")

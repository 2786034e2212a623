"""The tool-call formats by name (`--tool-call-parser`), and detection of a chat template's format."""

from __future__ import annotations

import re
from dataclasses import dataclass

from .base import ToolFormat
from .generic import GENERIC
from .hermes import HERMES
from .llama3 import LLAMA3
from .mistral import MISTRAL

FORMATS = {f.name: f for f in (GENERIC, HERMES, LLAMA3, MISTRAL)}
ALIASES = {"qwen25": "hermes", "qwen": "hermes", "qwen3": "hermes", "llama4": "llama3"}  # SGLang's parser names
PARSER_NAMES = tuple(FORMATS) + tuple(ALIASES)


@dataclass(frozen=True)
class ToolSetup:
    """The format a model's calls use, and whether its chat template renders `tools` itself (native)."""

    format: ToolFormat
    native: bool


def get_format(name: str) -> ToolFormat:
    """The format called `name` (a --tool-call-parser value); ValueError lists the known names."""
    key = ALIASES.get(name, name)
    if key not in FORMATS:
        raise ValueError(f"unknown tool-call parser {name!r} (expected one of {', '.join(PARSER_NAMES)})")
    return FORMATS[key]


def template_renders_tools(template: str | None) -> bool:
    """Whether a jinja chat template uses the `tools` variable (transformers passes it as apply_chat_template(tools=))."""
    return bool(template) and re.search(r"\btools\b", template) is not None


def detect(template: str | None, forced: str | None = None) -> ToolSetup:
    """The setup for a chat template: the forced parser if given, else the format its text shows, else generic."""
    native = template_renders_tools(template)
    if forced:
        return ToolSetup(get_format(forced), native)
    if not native:
        return ToolSetup(GENERIC, False)
    if "<tool_call>" in template:
        return ToolSetup(HERMES, True)
    if "[TOOL_CALLS]" in template:
        return ToolSetup(MISTRAL, True)
    if "<|python_tag|>" in template or "ipython" in template or '"parameters"' in template:
        return ToolSetup(LLAMA3, True)
    # renders tools but in an unknown layout: describe the generic one ourselves instead
    return ToolSetup(GENERIC, False)

"""The Mistral tool-call format: `[TOOL_CALLS] [{"name": ..., "arguments": {...}}, ...]`."""

from .base import ToolFormat

MISTRAL = ToolFormat(
    name="mistral", trigger="[TOOL_CALLS]", open="[TOOL_CALLS] [", close="]", list_sep=", ", joiner="",
    description="Mistral / Mixtral instruct templates with [TOOL_CALLS] (SGLang: mistral)")

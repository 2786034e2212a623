"""The Hermes / Qwen 2.5 tool-call format: `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`."""

from .base import ToolFormat

HERMES = ToolFormat(
    name="hermes", trigger="<tool_call>", open="<tool_call>\n", close="\n</tool_call>", joiner="\n",
    description="Hermes 2/3, Qwen 2/2.5/3 and other ChatML templates with <tool_call> tags (SGLang: hermes, qwen25)")

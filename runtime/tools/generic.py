"""The generic format for templates without tool support (the default SmolLM2): Hermes-style `<tool_call>` tags.

The tools and this layout are described in a system message (ToolFormat.instructions); assistant calls in the
history are rendered as their text, tool results as user messages wrapped in `<tool_response>`.
"""

from .base import ToolFormat

GENERIC = ToolFormat(
    name="generic", trigger="<tool_call>", open="<tool_call>\n", close="\n</tool_call>", joiner="\n",
    description="sglpy's documented default: tools listed in a system message, calls in <tool_call> tags")

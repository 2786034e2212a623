"""Tool calling: tool specs, call formats (one module each), their constraints, parsing and rendering. Torch-free."""

from .base import ToolFormat
from .constraint import tool_constraint
from .registry import PARSER_NAMES, ToolSetup, detect, get_format
from .render import render_conversation
from .spec import Tool, ToolCall, ToolChoice, ToolError, parse_assistant_calls, parse_tool_choice, parse_tools
from .stream import CallArgs, CallBegin, Content, ParsedOutput, ToolCallStream, parse_tool_calls

__all__ = ["CallArgs", "CallBegin", "Content", "PARSER_NAMES", "ParsedOutput", "Tool", "ToolCall", "ToolCallStream",
           "ToolChoice", "ToolError", "ToolFormat", "ToolSetup", "detect", "get_format", "parse_assistant_calls",
           "parse_tool_calls", "parse_tool_choice", "parse_tools", "render_conversation", "tool_constraint"]

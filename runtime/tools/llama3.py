"""The Llama 3.x JSON tool-call format: `{"name": ..., "parameters": {...}}`, several calls joined by `; `."""

from .base import ToolFormat

LLAMA3 = ToolFormat(
    name="llama3", trigger='{"name"', open="", close="", args_key="parameters", list_sep="; ", joiner="; ",
    description="Llama 3.1/3.2/3.3 templates (JSON calls without tags; SGLang: llama3)")

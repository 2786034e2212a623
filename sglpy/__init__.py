"""sglpy: SGLang-compatible structured-generation frontend on its own runtime.

`import sglpy as sgl` is light: backends that need torch or HTTP are imported on first use.
"""

__version__ = "0.1.0"

from .api import (  # noqa: F401
    assistant,
    assistant_begin,
    assistant_end,
    flush_cache,
    function,
    gen,
    gen_int,
    gen_string,
    get_server_info,
    image,
    select,
    separate_reasoning,
    set_default_backend,
    system,
    system_begin,
    system_end,
    user,
    user_begin,
    user_end,
    video,
)
from .choices import (  # noqa: F401
    greedy_token_selection,
    token_length_normalized,
    unconditional_likelihood_normalized,
)
from .global_config import global_config  # noqa: F401
from .interpreter import ProgramError  # noqa: F401
from .program_state import ProgramState, ProgramStateGroup  # noqa: F401
from .tools import FunctionCall, ToolResult, tool_prompt  # noqa: F401

_LAZY = {
    "Engine": ("sglpy.backend_engine", "Engine"),
    "RuntimeEndpoint": ("sglpy.backend_http", "RuntimeEndpoint"),
    "Runtime": ("sglpy.backend_http", "Runtime"),
    "FakeBackend": ("sglpy.backend_fake", "FakeBackend"),
    "OpenAI": ("sglpy.backend_openai", "OpenAI"),
    "Anthropic": ("sglpy.backend_anthropic", "Anthropic"),
    "LiteLLM": ("sglpy.backend_litellm", "LiteLLM"),
}


def __getattr__(name):
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'sglpy' has no attribute {name!r}")


__all__ = [
    "Engine", "Runtime", "RuntimeEndpoint", "FakeBackend", "OpenAI", "Anthropic", "LiteLLM", "ProgramError", "ProgramState", "ProgramStateGroup",
    "assistant", "assistant_begin", "assistant_end", "flush_cache", "function", "gen", "gen_int", "gen_string",
    "get_server_info", "global_config", "greedy_token_selection", "image", "select", "set_default_backend",
    "system", "system_begin", "system_end", "token_length_normalized", "unconditional_likelihood_normalized",
    "user", "user_begin", "user_end", "video", "FunctionCall", "ToolResult", "tool_prompt",
]

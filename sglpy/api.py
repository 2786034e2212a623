"""User-facing constructors: function, gen, select, roles, backends helpers (SGLang names)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, List, Optional, Union

from .choices import ChoicesSamplingMethod, token_length_normalized
from .function import SglFunction
from .global_config import global_config
from .nodes import (GenParams, SamplingParams, SglExprList, SglGen, SglImage, SglRoleBegin, SglRoleEnd,
                    SglSelect, SglSeparateReasoning, validate_regex)


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None):
    """Decorator (bare or with arguments) turning `def prog(s, ...)` into an SglFunction."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)

    def decorator(f):
        return SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)

    return decorator


def __getattr__(name: str):
    # SGLang's sglang.lang.api offers Runtime and Engine too; they stay lazy (torch / HTTP on first use).
    if name == "Runtime":
        from .backend_http import Runtime

        return Runtime
    if name == "Engine":
        from .backend_engine import Engine

        return Engine
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def set_default_backend(backend) -> None:
    """Backend used by run/run_batch when none is passed."""
    global_config.default_backend = backend


def flush_cache(backend=None) -> bool:
    """Flush the backend's prefix cache; False without a backend."""
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        return False
    return getattr(backend, "endpoint", backend).flush_cache()


def get_server_info(backend=None) -> Optional[dict]:
    """The backend's server info dict; None without a backend."""
    backend = backend if backend is not None else global_config.default_backend
    if backend is None:
        return None
    return getattr(backend, "endpoint", backend).get_server_info()


def gen(
    name: Optional[str] = None,
    max_tokens: Optional[int] = None,
    min_tokens: Optional[int] = None,
    n: Optional[int] = None,
    stop: Optional[Union[str, List[str]]] = None,
    stop_token_ids: Optional[List[int]] = None,
    stop_regex: Optional[Union[str, List[str]]] = None,
    temperature: Optional[float] = None,
    top_p: Optional[float] = None,
    top_k: Optional[int] = None,
    min_p: Optional[float] = None,
    frequency_penalty: Optional[float] = None,
    presence_penalty: Optional[float] = None,
    ignore_eos: Optional[bool] = None,
    return_logprob: Optional[bool] = None,
    logprob_start_len: Optional[int] = None,
    top_logprobs_num: Optional[int] = None,
    return_text_in_logprobs: Optional[bool] = None,
    dtype: Optional[Any] = None,
    choices: Optional[List[str]] = None,
    choices_method: Optional[ChoicesSamplingMethod] = None,
    regex: Optional[str] = None,
    json_schema: Optional[Union[str, dict]] = None,
    *,
    repetition_penalty: Optional[float] = None,
    seed: Optional[int] = None,
    skip_special_tokens: Optional[bool] = None,
    spaces_between_special_tokens: Optional[bool] = None,
    no_stop_trim: Optional[bool] = None,
    ebnf: Optional[str] = None,
    logit_bias: Optional[dict] = None,
    structural_tag: Optional[Union[str, dict]] = None,
    tools: Optional[List[dict]] = None,
    tool_choice: Union[str, None] = None,
    parallel_tool_calls: Optional[bool] = None,
):
    """Generate into variable `name`; unset (None) parameters inherit the program-level defaults.

    The positional keywords are SGLang's `sgl.gen`; the keyword-only ones are the remaining SamplingParams
    fields (runtime/sampling_params.py), so every sampling parameter can be set per gen. `max_tokens` /
    `min_tokens` are SamplingParams' max_new_tokens / min_new_tokens; the logprob fields and `dtype` are
    request options (GenParams). `choices` makes a select (temperature defaults to 0).
    `tools` (OpenAI tool objects or bare {name, description, parameters}) constrains the output to valid calls
    (`tool_choice` "required" (default), "auto" or a tool's name; `parallel_tool_calls` default False) and the
    variable holds a `sgl.ToolResult` (`.call.name`, `.call.arguments`); see sglpy/tools.py.
    """
    keywords = dict(locals())
    del keywords["name"], keywords["choices"], keywords["choices_method"]
    del keywords["tools"], keywords["tool_choice"], keywords["parallel_tool_calls"]
    tool_request = None
    if tools is not None:
        from .tools import tool_constraint

        if structural_tag is not None or regex is not None or json_schema is not None or ebnf is not None:
            raise ValueError("gen(tools=...) constrains the output itself: give no regex/json_schema/ebnf/"
                             "structural_tag with it")
        if n not in (None, 1):
            raise ValueError("gen(tools=...) takes one sample (n=1)")
        keywords["structural_tag"], tool_request = tool_constraint(tools, tool_choice or "required",
                                                                   bool(parallel_tool_calls))
    elif tool_choice is not None or parallel_tool_calls is not None:
        raise ValueError("tool_choice / parallel_tool_calls need tools")
    if choices:
        return SglSelect(name, list(choices), 0.0 if temperature is None else temperature,
                         choices_method or token_length_normalized)
    validate_regex(regex)
    if json_schema is not None and not isinstance(json_schema, (str, dict)):
        raise TypeError(f"json_schema must be a str or dict, got {type(json_schema).__name__}")
    if isinstance(json_schema, str):
        import json

        try:
            json.loads(json_schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    overrides = {k: v for k, v in keywords.items() if v is not None}
    # Validate the values this call set now, so a bad value fails in the caller, not in a worker.
    probe = dict(overrides)
    if "min_tokens" in probe and "max_tokens" not in probe:
        probe["max_tokens"] = max(probe["min_tokens"], SamplingParams().max_new_tokens)
    GenParams().resolve(probe)
    return SglGen(name, overrides, tool_request)


# gen keywords that the typed variants fix or do not take (SGLang's gen_int/gen_string take the rest)
_TYPED_GEN_EXCLUDED = ("min_tokens", "dtype", "choices", "choices_method", "regex", "json_schema", "ebnf",
                       "structural_tag", "tools", "tool_choice", "parallel_tool_calls")


def _typed_gen(dtype: type, doc: str) -> Callable:
    def typed(name: Optional[str] = None, **kwargs):
        bad = sorted(set(kwargs) & set(_TYPED_GEN_EXCLUDED))
        if bad:
            raise TypeError(f"gen_{dtype.__name__} does not take {bad}")
        return gen(name, dtype=dtype, **kwargs)

    typed.__name__ = typed.__qualname__ = f"gen_{'int' if dtype is int else 'string'}"
    typed.__doc__ = doc
    # IDE help shows gen's keywords without the excluded ones (the list is gen's signature, not repeated here)
    params = [p for p in inspect.signature(gen).parameters.values() if p.name not in _TYPED_GEN_EXCLUDED]
    typed.__signature__ = inspect.Signature(params)
    return typed


gen_int = _typed_gen(int, "gen constrained to an integer (takes gen's keywords but min_tokens and the constraints).")
gen_string = _typed_gen(str, "gen constrained to a double-quoted string (takes gen's keywords but min_tokens and "
                             "the constraints).")


def select(name: Optional[str] = None, choices: Optional[List[str]] = None, temperature: float = 0.0,
           choices_method: ChoicesSamplingMethod = token_length_normalized):
    """Pick one of `choices` by scoring each as a continuation (prompt logprobs)."""
    if not choices:
        raise ValueError("select needs a non-empty list of choices")
    if not all(isinstance(c, str) for c in choices):
        raise TypeError(f"select choices must be strings, got {choices!r}")
    if not isinstance(choices_method, ChoicesSamplingMethod):
        raise TypeError(f"choices_method must be one of sgl.token_length_normalized, sgl.greedy_token_selection, "
                        f"sgl.unconditional_likelihood_normalized; got {choices_method!r}")
    return SglSelect(name, list(choices), temperature, choices_method)


def image(source: Any):
    """An image in the prompt (a path, bytes, a base64 / data-URL string or a PIL image), read for a vision model
    (docs/vision.md); the file is read and checked when the program runs it."""
    if not isinstance(source, (str, bytes, bytearray, memoryview)) and not (hasattr(source, "save")
                                                                           and hasattr(source, "size")):
        raise TypeError(f"sgl.image takes a path, bytes, a base64 or data-URL string or a PIL image; got "
                        f"{type(source).__name__}")
    return SglImage(source)


def video(path: Any, num_frames: int = 0):
    """Videos are not supported: sglpy's runtime serves text-only models."""
    raise NotImplementedError("sgl.video: sglpy's runtime serves text-only models (no video understanding)")


def separate_reasoning(expr=None, model_type: Optional[str] = None):
    """`expr` (a named gen/select, or a list of them), then its thinking split off: the variable keeps the answer,
    `<name>_reasoning_content` the thinking, the program text the answer. model_type: a reasoning parser name
    (qwen3, deepseek-r1); None takes the backend's (sgl.Engine(reasoning_parser=...)). Skipped when streaming."""
    if isinstance(expr, (list, tuple)):
        expr = SglExprList(list(expr))
    node = SglSeparateReasoning(model_type, expr)
    return SglExprList([node] if expr is None else [expr, node])


def _role_common(role: str, expr=None):
    if expr is None:
        return SglExprList([SglRoleBegin(role), SglRoleEnd(role)])
    return SglExprList([SglRoleBegin(role), expr, SglRoleEnd(role)])


def system(expr=None):
    """A system block around `expr`."""
    return _role_common("system", expr)


def user(expr=None):
    """A user block around `expr`."""
    return _role_common("user", expr)


def assistant(expr=None):
    """An assistant block around `expr`."""
    return _role_common("assistant", expr)


def system_begin():
    return SglRoleBegin("system")


def system_end():
    return SglRoleEnd("system")


def user_begin():
    return SglRoleBegin("user")


def user_end():
    return SglRoleEnd("user")


def assistant_begin():
    return SglRoleBegin("assistant")


def assistant_end():
    return SglRoleEnd("assistant")

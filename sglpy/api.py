"""User-facing constructors: function, gen, select, roles, backends helpers (SGLang names)."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Union

from .choices import ChoicesSamplingMethod, token_length_normalized
from .function import SglFunction
from .global_config import global_config
from .ir import (
    SamplingParams,
    SglExprList,
    SglGen,
    SglRoleBegin,
    SglRoleEnd,
    SglSelect,
    dtype_to_regex,
    resolve_sampling,
    validate_regex,
)


def function(func: Optional[Callable] = None, num_api_spec_tokens: Optional[int] = None):
    """Decorator (bare or with arguments) turning `def prog(s, ...)` into an SglFunction."""
    if func is not None:
        return SglFunction(func, num_api_spec_tokens=num_api_spec_tokens)

    def decorator(f):
        return SglFunction(f, num_api_spec_tokens=num_api_spec_tokens)

    return decorator


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
):
    """Generate into variable `name`; unset (None) parameters inherit the program-level defaults."""
    if choices:
        return SglSelect(name, list(choices), 0.0 if temperature is None else temperature,
                         choices_method or token_length_normalized)
    validate_regex(regex)
    if dtype is not None:
        dtype_to_regex(dtype)
    if json_schema is not None and not isinstance(json_schema, (str, dict)):
        raise TypeError(f"json_schema must be a str or dict, got {type(json_schema).__name__}")
    if isinstance(json_schema, str):
        import json

        try:
            json.loads(json_schema)
        except ValueError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    overrides = dict(max_tokens=max_tokens, min_tokens=min_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids,
                     stop_regex=stop_regex, temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
                     frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
                     return_logprob=return_logprob, logprob_start_len=logprob_start_len,
                     top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs,
                     dtype=dtype, regex=regex, json_schema=json_schema)
    overrides = {k: v for k, v in overrides.items() if v is not None}
    # Validate the values this call set now, so a bad value fails in the caller, not in a worker.
    probe = dict(overrides)
    if "min_tokens" in probe and "max_tokens" not in probe:
        probe["max_tokens"] = max(probe["min_tokens"], SamplingParams().max_new_tokens)
    resolve_sampling(SamplingParams(), probe)
    return SglGen(name, overrides)


def _typed_gen(dtype, name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
               frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
               top_logprobs_num, return_text_in_logprobs):
    return gen(name, max_tokens=max_tokens, n=n, stop=stop, stop_token_ids=stop_token_ids, stop_regex=stop_regex,
               temperature=temperature, top_p=top_p, top_k=top_k, min_p=min_p,
               frequency_penalty=frequency_penalty, presence_penalty=presence_penalty, ignore_eos=ignore_eos,
               return_logprob=return_logprob, logprob_start_len=logprob_start_len,
               top_logprobs_num=top_logprobs_num, return_text_in_logprobs=return_text_in_logprobs, dtype=dtype)


def gen_int(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None, stop=None,
            stop_token_ids=None, stop_regex=None, temperature=None, top_p=None, top_k=None, min_p=None,
            frequency_penalty=None, presence_penalty=None, ignore_eos=None, return_logprob=None,
            logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=None):
    """gen constrained to an integer."""
    return _typed_gen(int, name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
                      frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
                      top_logprobs_num, return_text_in_logprobs)


def gen_string(name: Optional[str] = None, max_tokens: Optional[int] = None, n: Optional[int] = None, stop=None,
               stop_token_ids=None, stop_regex=None, temperature=None, top_p=None, top_k=None, min_p=None,
               frequency_penalty=None, presence_penalty=None, ignore_eos=None, return_logprob=None,
               logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=None):
    """gen constrained to a double-quoted string."""
    return _typed_gen(str, name, max_tokens, n, stop, stop_token_ids, stop_regex, temperature, top_p, top_k, min_p,
                      frequency_penalty, presence_penalty, ignore_eos, return_logprob, logprob_start_len,
                      top_logprobs_num, return_text_in_logprobs)


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
    """Images are not supported: sglpy's runtime serves text-only models."""
    raise NotImplementedError("sgl.image: sglpy's runtime serves text-only models (no image understanding)")


def video(path: Any, num_frames: int = 0):
    """Videos are not supported: sglpy's runtime serves text-only models."""
    raise NotImplementedError("sgl.video: sglpy's runtime serves text-only models (no video understanding)")


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

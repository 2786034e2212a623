"""Program IR: sampling parameters and the expression nodes that `s += ...` submits."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Union

# dtype -> regex (and extra stop strings). The int/float forms allow trailing spaces/newlines so a
# model may end the number naturally; the stops then cut the whitespace off the stored value.
REGEX_INT = r"[-+]?[0-9]+[ \n]*"
REGEX_FLOAT = r"[-+]?[0-9]*\.?[0-9]+[ \n]*"
REGEX_BOOL = r"(True|False)"
# Quoted run of word characters and spaces (no escapes), as SGLang's frontend defines dtype=str.
REGEX_STR = r"\"[\w\d\s]*\""

_DTYPE_RULES = {
    "int": (REGEX_INT, (" ", "\n")),
    "float": (REGEX_FLOAT, (" ", "\n")),
    "str": (REGEX_STR, ()),
    "bool": (REGEX_BOOL, ()),
}


def dtype_to_regex(dtype: Any) -> tuple[str, tuple[str, ...]]:
    """Map a gen dtype (int/float/str/bool or their names) to (regex, extra stop strings)."""
    key = dtype.__name__ if isinstance(dtype, type) else dtype
    if key not in _DTYPE_RULES:
        raise ValueError(f"invalid dtype {dtype!r}: expected one of int, float, str, bool")
    return _DTYPE_RULES[key]


def _as_tuple(value: Union[None, str, int, list, tuple]) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int)):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class SamplingParams:
    """Fully resolved sampling parameters for one gen (SGLang frontend defaults)."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    n: int = 1
    stop: tuple = ()
    stop_token_ids: tuple = ()
    stop_regex: tuple = ()
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    ignore_eos: bool = False
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    dtype: Any = None
    regex: Optional[str] = None
    json_schema: Optional[Union[str, dict]] = None

    def __post_init__(self):
        for name in ("stop", "stop_token_ids", "stop_regex"):
            object.__setattr__(self, name, _as_tuple(getattr(self, name)))
        if self.max_new_tokens < 0:
            raise ValueError(f"max_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0 or self.min_new_tokens > self.max_new_tokens:
            raise ValueError(
                f"min_tokens must be in [0, max_tokens={self.max_new_tokens}], got {self.min_new_tokens}"
            )
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        if self.regex is not None and self.json_schema is not None:
            raise ValueError("gen accepts at most one of regex and json_schema")
        if self.dtype is not None:
            dtype_to_regex(self.dtype)

    def with_constraints(self) -> "SamplingParams":
        """Turn dtype into a regex plus stops (dtype wins over an explicit regex, like SGLang)."""
        if self.dtype is None:
            return self
        regex, stops = dtype_to_regex(self.dtype)
        return dataclasses.replace(self, dtype=None, regex=regex, json_schema=None,
                                   stop=self.stop + tuple(s for s in stops if s not in self.stop))

    def to_srt_sampling_params(self) -> dict:
        """The `sampling_params` dict of an SGLang-native /generate request (dtype already lowered)."""
        p = self.with_constraints()
        out = {
            "skip_special_tokens": True,
            "spaces_between_special_tokens": True,
            "max_new_tokens": p.max_new_tokens,
            "min_new_tokens": p.min_new_tokens,
            "n": p.n,
            "stop": list(p.stop),
            "stop_token_ids": list(p.stop_token_ids),
            "temperature": p.temperature,
            "top_p": p.top_p,
            "top_k": p.top_k,
            "min_p": p.min_p,
            "frequency_penalty": p.frequency_penalty,
            "presence_penalty": p.presence_penalty,
            "ignore_eos": p.ignore_eos,
            "regex": p.regex,
            "json_schema": p.json_schema,
        }
        if p.stop_regex:
            out["stop_regex"] = list(p.stop_regex)
        return out

    def to_srt_request_fields(self) -> dict:
        """Top-level logprob fields of a /generate request, only those that were set."""
        names = ("return_logprob", "logprob_start_len", "top_logprobs_num", "return_text_in_logprobs")
        return {n: getattr(self, n) for n in names if getattr(self, n) is not None}


# gen() keyword -> SamplingParams field
GEN_FIELD_MAP = {
    "max_tokens": "max_new_tokens",
    "min_tokens": "min_new_tokens",
    "n": "n",
    "stop": "stop",
    "stop_token_ids": "stop_token_ids",
    "stop_regex": "stop_regex",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "frequency_penalty": "frequency_penalty",
    "presence_penalty": "presence_penalty",
    "ignore_eos": "ignore_eos",
    "return_logprob": "return_logprob",
    "logprob_start_len": "logprob_start_len",
    "top_logprobs_num": "top_logprobs_num",
    "return_text_in_logprobs": "return_text_in_logprobs",
    "dtype": "dtype",
    "regex": "regex",
    "json_schema": "json_schema",
}


def resolve_sampling(defaults: SamplingParams, overrides: dict, extra_stops: tuple = ()) -> SamplingParams:
    """Program-level defaults, overridden by every field the gen call set; then the template's stops."""
    fields = {GEN_FIELD_MAP[k]: v for k, v in overrides.items() if v is not None}
    params = dataclasses.replace(defaults, **fields)
    if extra_stops:
        params = dataclasses.replace(params, stop=params.stop + tuple(s for s in extra_stops if s not in params.stop))
    return params


# ---------------------------------------------------------------- expression nodes


class SglExpr:
    """Base of all IR nodes; `a + b` builds an SglExprList."""

    def __add__(self, other):
        return SglExprList([self, wrap(other)])

    def __radd__(self, other):
        return SglExprList([wrap(other), self])

    def flatten(self) -> list["SglExpr"]:
        """The primitive nodes this expression expands to, in order."""
        return [self]


def wrap(value: Any) -> SglExpr:
    """Strings become constant text; IR passes through; anything else is rejected."""
    if isinstance(value, SglExpr):
        return value
    if isinstance(value, str):
        return SglConstantText(value)
    if value is None:
        raise ValueError("cannot append None to a program state")
    raise TypeError(f"cannot append {type(value).__name__} to a program state: use str or an sgl expression")


class SglExprList(SglExpr):
    def __init__(self, exprs: list):
        self.exprs = [wrap(e) for e in exprs]

    def flatten(self):
        out = []
        for e in self.exprs:
            out.extend(e.flatten())
        return out

    def __repr__(self):
        return f"SglExprList({self.exprs!r})"


@dataclass(eq=False)
class SglConstantText(SglExpr):
    value: str


@dataclass(eq=False)
class SglGen(SglExpr):
    name: Optional[str]
    overrides: dict = field(default_factory=dict)  # gen keywords the call set (None = inherit)


@dataclass(eq=False)
class SglSelect(SglExpr):
    name: Optional[str]
    choices: list
    temperature: float = 0.0
    choices_method: Optional[Callable] = None


@dataclass(eq=False)
class SglRoleBegin(SglExpr):
    role: str


@dataclass(eq=False)
class SglRoleEnd(SglExpr):
    role: str


@dataclass(eq=False)
class SglVarScopeBegin(SglExpr):
    name: str


@dataclass(eq=False)
class SglVarScopeEnd(SglExpr):
    name: str


@dataclass(eq=False)
class SglCommitLazy(SglExpr):
    """Send the current text to the backend as a prefill-only request (prefix-cache hint)."""


@dataclass(eq=False)
class SglImage(SglExpr):
    source: Any


@dataclass(eq=False)
class SglFork(SglExpr):
    """Only appears in traced graphs: the state forked into `size` branches here."""

    size: int


class SglArgument(SglExpr):
    """Placeholder for a program argument during tracing; it cannot be formatted into a string."""

    def __init__(self, name: str):
        self.name = name

    def __repr__(self):
        return f"SglArgument({self.name!r})"

    def __str__(self):
        raise TypeError(
            f"program argument {self.name!r} was used inside an f-string or str() while tracing; "
            "append it as its own expression instead (s += arg)"
        )

    __format__ = lambda self, spec: self.__str__()  # noqa: E731


def validate_regex(regex: Optional[str]) -> None:
    """Compile a regex with Python's re so a bad pattern fails in the caller, not in the runtime."""
    if regex is None:
        return
    try:
        re.compile(regex)
    except re.error as e:
        raise ValueError(f"invalid regex {regex!r}: {e}") from None

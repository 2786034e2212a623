"""Program IR: a gen's resolved parameters (GenParams) and the expression nodes that `s += ...` submits.

SGLang's `sglang.lang.ir` names (these, SglFunction and the dtype regexes) are importable from sglpy.ir."""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, Optional

# torch-free: the one SamplingParams definition (importing it loads no torch, no model code)
from sglpy.runtime.sampling_params import GEN_ALIASES, LogprobOptions, SamplingParams

# dtype -> extra stop strings: the int/float regexes allow trailing spaces/newlines so a model may end the
# number naturally; these stops then cut the whitespace off the stored value. The regexes themselves are
# grammar/compiler.py's DTYPE_REGEX (one definition).
_DTYPE_STOPS = {"int": (" ", "\n"), "float": (" ", "\n"), "str": (), "bool": ()}


def dtype_to_regex(dtype: Any) -> tuple[str, tuple[str, ...]]:
    """Map a gen dtype (int/float/str/bool or their names) to (regex, extra stop strings)."""
    key = dtype.__name__ if isinstance(dtype, type) else dtype
    if not isinstance(key, str) or key not in _DTYPE_STOPS:
        raise ValueError(f"invalid dtype {dtype!r}: expected one of int, float, str, bool")
    from sglpy.grammar import DTYPE_REGEX  # on first use: the grammar package loads numpy

    return DTYPE_REGEX[key], _DTYPE_STOPS[key]


@dataclass(frozen=True)
class GenParams:
    """One gen's resolved parameters: the runtime's SamplingParams plus the frontend's request options.

    The options are the logprob fields (None = not set: not sent, the runtime's default applies) and
    `dtype` (lowered to a regex plus stops before a backend sees the request).
    """

    sampling: SamplingParams = field(default_factory=SamplingParams)
    return_logprob: Optional[bool] = None
    logprob_start_len: Optional[int] = None
    top_logprobs_num: Optional[int] = None
    return_text_in_logprobs: Optional[bool] = None
    dtype: Any = None
    lora_path: Optional[str] = None  # the runtime's LoRA adapter (its name; run(lora_path=...)); None = the base model

    OPTIONS: ClassVar[tuple[str, ...]] = LogprobOptions.field_names() + ("dtype", "lora_path")

    def __post_init__(self):
        LogprobOptions(**self.logprob_fields())  # same checks as the runtime's
        if self.dtype is not None:
            dtype_to_regex(self.dtype)

    def logprob_fields(self) -> dict:
        """The logprob options that were set (sent as top-level /generate fields, as SGLang's frontend does)."""
        return {n: getattr(self, n) for n in LogprobOptions.field_names() if getattr(self, n) is not None}

    def request_fields(self) -> dict:
        """The top-level /generate fields besides the prompt and sampling params: logprob options and lora_path."""
        return {**self.logprob_fields(), **({"lora_path": self.lora_path} if self.lora_path is not None else {})}

    def resolve(self, overrides: dict, extra_stops: tuple = ()) -> "GenParams":
        """These defaults overridden by every gen keyword that is set (None = inherit), the template's stops
        appended, and dtype lowered to a regex plus its stops: one SamplingParams built (validated) once."""
        fields, options = {}, {}
        for key, value in overrides.items():
            if value is None:
                continue
            name = GEN_ALIASES.get(key, key)
            if name in self.OPTIONS:
                options[name] = value
            elif name in SamplingParams.field_names():
                fields[name] = value
            else:
                raise TypeError(f"unknown gen keyword {key!r}")
        dtype = options.pop("dtype", self.dtype)
        stops = tuple(extra_stops)
        if dtype is not None:
            regex, dtype_stops = dtype_to_regex(dtype)  # dtype wins over an explicit regex, like SGLang
            fields.update(regex=regex, json_schema=None, ebnf=None, choices=None, structural_tag=None)
            stops += dtype_stops
        if stops:
            stop = fields.get("stop", self.sampling.stop)
            stop = (stop,) if isinstance(stop, str) else tuple(stop or ())
            fields["stop"] = stop + tuple(dict.fromkeys(s for s in stops if s not in stop))
        sp = dataclasses.replace(self.sampling, **fields) if fields else self.sampling
        return dataclasses.replace(self, sampling=sp, dtype=None, **options)

    def lowered(self) -> "GenParams":
        """dtype turned into a regex plus stops (resolve() already does this; for params built directly)."""
        return self if self.dtype is None else GenParams(self.sampling, **self.request_fields()).resolve(
            {"dtype": self.dtype})


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
    tool_request: Any = None  # sglpy.tools.ToolRequest: the value is the parsed calls (a ToolResult)


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
class SglSeparateReasoning(SglExpr):
    """After the named gen/select(s) in `expr` ran: each variable keeps the answer, `<name>_reasoning_content` gets
    the thinking, and the program text keeps only the answer (SGLang's sgl.separate_reasoning)."""

    model_type: Optional[str]
    expr: Any = None

    def __post_init__(self):
        if self.model_type is not None:
            from sglpy.runtime.reasoning import reasoning_format

            reasoning_format(self.model_type)  # ValueError names the known parsers
        for name in self.targets:
            if name is None:
                raise ValueError("separate_reasoning needs named gen/select expressions (gen('name', ...))")

    @property
    def targets(self) -> list:
        """The names of the gens/selects whose output is split."""
        return [n.name for n in (self.expr.flatten() if isinstance(self.expr, SglExpr) else [])
                if isinstance(n, (SglGen, SglSelect))]

    @property
    def name(self) -> Optional[str]:
        """The first target's reasoning variable (SGLang's process_name_for_reasoning)."""
        return reasoning_name(self.targets[0]) if self.targets else None


def reasoning_name(name: str) -> str:
    """The variable holding a gen's thinking after separate_reasoning."""
    return f"{name}_reasoning_content"


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

"""SamplingParams: the one definition of the per-request sampling fields (SGLang names and defaults). Torch-free.

The frontend (`sgl.gen`, programs, backends), the HTTP parsers and the engine all use this class; every
other list of sampling names (gen's keyword aliases, the frontend's wire keys, the OpenAI mapping) is
derived from its fields or checked against them by a test. Request-level options that are not sampling
parameters in SGLang either (the logprob fields) are `LogprobOptions`, below.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from typing import Any

CONSTRAINT_FIELDS = ("regex", "json_schema", "ebnf", "choices", "structural_tag")
# sgl.gen keyword -> field, where SGLang's frontend uses another name (every other keyword is the field name).
GEN_ALIASES = {"max_tokens": "max_new_tokens", "min_tokens": "min_new_tokens"}
# /generate sampling_params key -> field, for SGLang's alternative spellings.
WIRE_ALIASES = {"sampling_seed": "seed"}
MAX_STOPS = 32  # SGLang's MAX_STOP_COUNT / MAX_STOP_REGEX_COUNT
MAX_STOP_REGEX_BYTES = 256  # SGLang's MAX_STOP_REGEX_LEN


def _compile_stop_regex(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as e:
        raise ValueError(f"invalid stop_regex {pattern!r}: {e}") from None


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, SGLang names and defaults. temperature 0 = greedy."""

    max_new_tokens: int | None = 128  # None = as many as the context has room for
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None  # SGLang's sampling_seed; None = the engine's generator
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    stop_regex: tuple[str, ...] = ()  # Python `re` patterns searched in the output text
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    regex: str | None = None
    json_schema: str | None = None  # normalised to a JSON string
    ebnf: str | None = None
    choices: tuple[str, ...] | None = None
    structural_tag: str | None = None  # SGLang's structural tag (JSON text; an object is accepted too)
    logit_bias: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        def fix(name, value):
            object.__setattr__(self, name, value)

        for name in ("stop", "stop_regex"):
            v = getattr(self, name)
            fix(name, (v,) if isinstance(v, str) else () if v is None else tuple(v))
            if any(not isinstance(s, str) or s == "" for s in getattr(self, name)):
                raise ValueError(f"{name} must be non-empty strings, got {getattr(self, name)!r}")
            if len(getattr(self, name)) > MAX_STOPS:
                raise ValueError(f"at most {MAX_STOPS} {name} entries are allowed, got {len(getattr(self, name))}")
        for pattern in self.stop_regex:
            if len(pattern.encode("utf-8", "replace")) > MAX_STOP_REGEX_BYTES:
                raise ValueError(f"stop_regex {pattern[:40]!r}... is over the {MAX_STOP_REGEX_BYTES}-byte limit")
            _compile_stop_regex(pattern)
        if self.stop_token_ids is None:
            fix("stop_token_ids", ())
        elif isinstance(self.stop_token_ids, int):
            fix("stop_token_ids", (self.stop_token_ids,))
        else:
            fix("stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        for name in ("min_new_tokens", "top_k", "n") + (("max_new_tokens",) if self.max_new_tokens is not None else ()):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an int, got {v!r}")
        if self.max_new_tokens is not None and self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if self.min_new_tokens < 0 or (self.max_new_tokens is not None and self.min_new_tokens > self.max_new_tokens):
            raise ValueError(f"min_new_tokens must be in [0, max_new_tokens], got {self.min_new_tokens}")
        for name in ("temperature", "top_p", "min_p", "frequency_penalty", "presence_penalty", "repetition_penalty"):
            v = getattr(self, name)
            if not isinstance(v, (int, float)) or isinstance(v, bool) or v != v:
                raise ValueError(f"{name} must be a number, got {v!r}")
            fix(name, float(v))
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"top_k must be -1 (all) or >= 1, got {self.top_k}")
        if not 0.0 <= self.min_p <= 1.0:
            raise ValueError(f"min_p must be in [0, 1], got {self.min_p}")
        for name in ("frequency_penalty", "presence_penalty"):
            if not -2.0 <= getattr(self, name) <= 2.0:
                raise ValueError(f"{name} must be in [-2, 2], got {getattr(self, name)}")
        if not 0.0 < self.repetition_penalty <= 2.0:
            raise ValueError(f"repetition_penalty must be in (0, 2], got {self.repetition_penalty}")
        if self.n < 1:
            raise ValueError(f"n must be >= 1, got {self.n}")
        if self.seed is not None and (not isinstance(self.seed, int) or isinstance(self.seed, bool)):
            raise ValueError(f"seed must be an int, got {self.seed!r}")
        for name in ("ignore_eos", "skip_special_tokens", "spaces_between_special_tokens", "no_stop_trim"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            try:
                fix("json_schema", json.dumps(self.json_schema))
            except TypeError as e:
                raise ValueError(f"json_schema is not JSON-serialisable: {e}") from None
        if self.structural_tag is not None and not isinstance(self.structural_tag, str):
            try:
                fix("structural_tag", json.dumps(self.structural_tag))
            except TypeError as e:
                raise ValueError(f"structural_tag is not JSON-serialisable: {e}") from None
        if self.choices is not None:
            if isinstance(self.choices, str) or not all(isinstance(c, str) and c for c in self.choices):
                raise ValueError("choices must be a list of non-empty strings")
            fix("choices", tuple(self.choices))
            if not self.choices:
                raise ValueError("choices must not be empty")
        for name in ("regex", "ebnf"):
            v = getattr(self, name)
            if v is not None and not isinstance(v, str):
                raise ValueError(f"{name} must be a string, got {type(v).__name__}")
        given = [n for n in CONSTRAINT_FIELDS if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"at most one constraint per request, got {given}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a dict {token_id: bias}")
            try:
                fix("logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()})
            except (TypeError, ValueError):
                raise ValueError("logit_bias must map token ids to numbers") from None

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or tiny) means argmax decoding."""
        return self.temperature < 1e-6

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """The one constraint of this request as (kind, value), or None."""
        for name in CONSTRAINT_FIELDS:
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    def compiled_stop_regex(self) -> list[re.Pattern]:
        """The stop_regex patterns, compiled (Python's `re` caches them)."""
        return [_compile_stop_regex(p) for p in self.stop_regex]

    def to_dict(self) -> dict:
        """Every field as a JSON-friendly dict (tuples become lists), the /generate sampling_params shape."""
        return {f.name: list(v) if isinstance(v := getattr(self, f.name), tuple) else v
                for f in dataclasses.fields(self)}

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The field list, in definition order."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_dict(cls, d: dict | SamplingParams | None) -> SamplingParams:
        """Build from a SGLang-style dict, naming any unknown parameter (a SamplingParams passes through)."""
        if d is None:
            return cls()
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        d = dict(d)
        for alias, name in WIRE_ALIASES.items():
            if alias in d:
                if name in d:
                    raise ValueError(f"give {name} or {alias}, not both")
                d[name] = d.pop(alias)
        unknown = sorted(set(d) - set(cls.field_names()))
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}")
        return cls(**d)


@dataclass(frozen=True)
class LogprobOptions:
    """Request-level logprob options (SGLang's GenerateReqInput fields, not sampling parameters)."""

    return_logprob: bool = False
    logprob_start_len: int = -1  # -1 = output logprobs only; else the first prompt position scored
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False

    def __post_init__(self):
        for name in ("return_logprob", "return_text_in_logprobs"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be a bool, got {getattr(self, name)!r}")
        for name in ("logprob_start_len", "top_logprobs_num"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an int, got {v!r}")
        if self.logprob_start_len < -1:
            raise ValueError(f"logprob_start_len must be -1 or a prompt position, got {self.logprob_start_len}")
        if self.top_logprobs_num < 0:
            raise ValueError(f"top_logprobs_num must be a non-negative int, got {self.top_logprobs_num}")

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The option names, in definition order."""
        return tuple(f.name for f in dataclasses.fields(cls))

"""Frozen, validated configs: EngineConfig (how the engine runs) and SamplingParams (one request)."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any

SCHEDULE_POLICIES = ("lpm", "dfs-weight", "fcfs")
DTYPES = ("float32", "bfloat16", "float16")
QUANTIZATION_MODES = ("none", "int8", "int4")  # weight-only; see runtime/quantization.py
KV_CACHE_DTYPES = ("auto", "bfloat16", "bf16", "float16", "fp16")  # auto = the model dtype


@dataclass(frozen=True)
class EngineConfig:
    """How the engine runs. Every field maps onto a `sglpy serve` flag of the same name."""

    model: str | None = None  # HF folder or .gguf; None = embedded default model
    dtype: str = "float32"  # float32 on CPU: measured far faster than bf16 on this class of CPU
    device: str = "auto"  # auto = cuda when available, else cpu
    max_total_tokens: int = 65536  # KV pool size in tokens (slots)
    max_running_requests: int = 128
    max_prefill_tokens: int = 4096  # token budget of one prefill step
    chunked_prefill_size: int = 1024  # a longer uncached prompt is prefilled in chunks of this size
    max_context_len: int | None = None  # None = the model's max_position_embeddings
    schedule_policy: str = "lpm"
    disable_radix_cache: bool = False
    disable_jump_forward: bool = False
    num_threads: int | None = None  # torch CPU threads; None = torch default
    seed: int = 0
    debug_invariants: bool = False  # check KV accounting after every step (tests)
    quantization: str = "none"  # weight-only quantization at load (CPU): none, int8, int4
    kv_cache_dtype: str = "auto"  # KV pool storage; 16-bit storage is converted to float32 while reading

    def __post_init__(self):
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {DTYPES}, got {self.dtype!r}")
        if self.device not in ("auto", "cpu", "cuda") and not self.device.startswith("cuda:"):
            raise ValueError(f"device must be auto, cpu or cuda[:N], got {self.device!r}")
        if self.schedule_policy not in SCHEDULE_POLICIES:
            raise ValueError(f"schedule_policy must be one of {SCHEDULE_POLICIES}, got {self.schedule_policy!r}")
        for name in ("max_total_tokens", "max_running_requests", "max_prefill_tokens", "chunked_prefill_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) <= 0:
                raise ValueError(f"{name} must be a positive int, got {getattr(self, name)!r}")
        if self.max_context_len is not None and self.max_context_len <= 1:
            raise ValueError(f"max_context_len must be > 1, got {self.max_context_len}")
        if self.quantization not in QUANTIZATION_MODES:
            raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, got {self.quantization!r}")
        if self.kv_cache_dtype not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {self.kv_cache_dtype!r}")
        if self.num_threads is not None and self.num_threads <= 0:
            raise ValueError(f"num_threads must be positive, got {self.num_threads}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> "EngineConfig":
        """Build from keyword arguments, naming any unknown field."""
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(kwargs) - known)
        if unknown:
            raise ValueError(f"unknown engine option(s) {unknown}; known: {sorted(known)}")
        return cls(**kwargs)


@dataclass(frozen=True)
class SamplingParams:
    """Per-request sampling parameters, SGLang names and defaults. temperature 0 = greedy."""

    max_new_tokens: int = 128
    min_new_tokens: int = 0
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1  # -1 = whole vocabulary
    min_p: float = 0.0
    frequency_penalty: float = 0.0
    presence_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: int = 1
    regex: str | None = None
    json_schema: str | None = None  # normalised to a JSON string
    ebnf: str | None = None
    choices: tuple[str, ...] | None = None
    logit_bias: dict | None = field(default=None, hash=False)

    def __post_init__(self):
        def fix(name, value):
            object.__setattr__(self, name, value)

        if isinstance(self.stop, str):
            fix("stop", (self.stop,))
        elif self.stop is None:
            fix("stop", ())
        else:
            fix("stop", tuple(self.stop))
        if any(not isinstance(s, str) or s == "" for s in self.stop):
            raise ValueError(f"stop must be non-empty strings, got {self.stop!r}")
        if self.stop_token_ids is None:
            fix("stop_token_ids", ())
        elif isinstance(self.stop_token_ids, int):
            fix("stop_token_ids", (self.stop_token_ids,))
        else:
            fix("stop_token_ids", tuple(self.stop_token_ids))
        if any(not isinstance(t, int) or isinstance(t, bool) or t < 0 for t in self.stop_token_ids):
            raise ValueError(f"stop_token_ids must be non-negative ints, got {self.stop_token_ids!r}")
        for name in ("max_new_tokens", "min_new_tokens", "top_k", "n"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ValueError(f"{name} must be an int, got {v!r}")
        if self.max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {self.max_new_tokens}")
        if not 0 <= self.min_new_tokens <= self.max_new_tokens:
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
        if self.json_schema is not None and not isinstance(self.json_schema, str):
            try:
                fix("json_schema", json.dumps(self.json_schema))
            except TypeError as e:
                raise ValueError(f"json_schema is not JSON-serialisable: {e}") from None
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
        given = [n for n in ("regex", "json_schema", "ebnf", "choices") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ValueError(f"at most one constraint per request, got {given}")
        if self.logit_bias is not None:
            if not isinstance(self.logit_bias, dict):
                raise ValueError("logit_bias must be a dict {token_id: bias}")
            fix("logit_bias", {int(k): float(v) for k, v in self.logit_bias.items()})

    @property
    def greedy(self) -> bool:
        """Temperature 0 (or tiny) means argmax decoding."""
        return self.temperature < 1e-6

    @property
    def constraint(self) -> tuple[str, Any] | None:
        """The one constraint of this request as (kind, value), or None."""
        for name in ("regex", "json_schema", "ebnf", "choices"):
            if getattr(self, name) is not None:
                return name, getattr(self, name)
        return None

    @classmethod
    def from_dict(cls, d: dict | "SamplingParams" | None) -> "SamplingParams":
        """Build from a SGLang-style dict, naming any unknown parameter."""
        if d is None:
            return cls()
        if isinstance(d, cls):
            return d
        if not isinstance(d, dict):
            raise ValueError(f"sampling_params must be a dict, got {type(d).__name__}")
        d = dict(d)
        if "sampling_seed" in d:
            d["seed"] = d.pop("sampling_seed")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown sampling parameter(s) {unknown}")
        return cls(**d)

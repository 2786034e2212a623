"""Process-wide frontend settings (SGLang's `global_config` fields)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional


@dataclass
class GlobalConfig:
    """Mutable settings; `default_backend` is what `set_default_backend` sets."""

    verbosity: int = 0
    default_backend: Optional[Any] = None
    skip_special_tokens_in_output: bool = True
    spaces_between_special_tokens_in_out: bool = True
    enable_precache_with_tracing: bool = True
    enable_parallel_encoding: bool = True
    # run_batch traces the program and caches its constant prefix when it is at least this long.
    precache_min_chars: int = 64


global_config = GlobalConfig()

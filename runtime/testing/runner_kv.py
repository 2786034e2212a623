"""A private KV manager for driving a ModelRunner directly (tests, the quality gate), as the engine builds one."""

from __future__ import annotations

from ..memory.kv_manager import KVManager
from ..memory.kv_pool import KVPool, ReqToTokenPool
from ..memory.radix_cache import RadixCache


def runner_kv(runner, num_slots: int, num_rows: int, kv_cache_dtype: str = "auto") -> KVManager:
    """KV pool (storage per kv_cache_dtype) + rows for `runner`'s model, prefix cache off."""
    pool = KVPool(runner.num_layers, num_slots, runner.num_kv_heads, runner.head_dim,
                  runner.kv_dtype(kv_cache_dtype), runner.device)
    return KVManager(pool, ReqToTokenPool(num_rows, runner.max_context, runner.device), RadixCache(disable=True))

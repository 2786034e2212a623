"""Token-granular KV pool: K/V buffers, a slot free list, and the request-to-slot table.

The underscore methods (alloc, free, reset, rows) are for memory/kv_manager.py alone: it is the one owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import KV_CACHE_DTYPES
from ..device_io import copy_to

_KV_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """Storage dtype of the KV pool (EngineConfig.kv_cache_dtype): the model dtype for 'auto', else 16-bit."""
    if kv_cache_dtype == "auto":
        return model_dtype
    if kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return _KV_DTYPES[kv_cache_dtype]


@dataclass(frozen=True)
class SlotAlloc:
    """Result of an allocation: the slots, or ok=False when the pool is short (nothing allocated)."""

    ok: bool
    slots: list[int]


class KVPool:
    """Owns K/V storage and the free list. Slots are token-granular; slot ids are plain ints."""

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device):
        self.num_slots = num_slots
        # one slot past the pool is never handed out: padded decode rows (CUDA-graph buckets) write their K/V there
        self.padding_slot = num_slots
        # k_buffer, v_buffer: [layers, slots + 1, kv_heads, head_dim]
        self.k_buffer = torch.zeros(num_layers, num_slots + 1, kv_heads, head_dim, dtype=dtype, device=device)
        self.v_buffer = torch.zeros_like(self.k_buffer)
        self._free_slots: list[int] = list(range(num_slots - 1, -1, -1))  # pop() hands out low slots first
        self._is_free = bytearray(b"\x01") * num_slots

    def available(self) -> int:
        """Number of free slots."""
        return len(self._free_slots)

    def _alloc(self, n: int) -> SlotAlloc:
        """Take n free slots; returns ok=False (and takes nothing) when fewer than n are free."""
        if n > len(self._free_slots):
            return SlotAlloc(False, [])
        out = self._free_slots[len(self._free_slots) - n:][::-1]
        del self._free_slots[len(self._free_slots) - n:]
        for s in out:
            self._is_free[s] = 0
        return SlotAlloc(True, out)

    def _free(self, slots: list[int]) -> None:
        """Return slots to the free list; freeing a free slot is a bug and raises."""
        for s in slots:
            if self._is_free[s]:
                raise RuntimeError(f"double free of KV slot {s}")
            self._is_free[s] = 1
        self._free_slots.extend(slots)

    def _reset(self) -> None:
        """Mark every slot free (flush)."""
        self._free_slots = list(range(self.num_slots - 1, -1, -1))
        self._is_free = bytearray(b"\x01") * self.num_slots


class ReqToTokenPool:
    """Rows of KV slot ids, one row per running request: req_to_token[row, pos] = slot."""

    def __init__(self, max_reqs: int, max_context: int, device: torch.device):
        # req_to_token: [max_reqs + 1, max_context] int32 (read by the attention kernels); the extra row is never
        # handed out: padded decode rows read through it (KVManager points it at the pool's padding slot)
        self.req_to_token = torch.zeros(max_reqs + 1, max_context, dtype=torch.int32, device=device)
        self.padding_row = max_reqs
        self._free_rows = list(range(max_reqs - 1, -1, -1))
        self.max_context = max_context

    def _alloc_row(self) -> int | None:
        """A free row index, or None when every row is taken."""
        return self._free_rows.pop() if self._free_rows else None

    def _free_row(self, row: int) -> None:
        """Release a row."""
        self._free_rows.append(row)

    def available(self) -> int:
        """Number of free rows."""
        return len(self._free_rows)

    def _write(self, row: int, start: int, slots: list[int]) -> None:
        """Record slots for positions start..start+len(slots)-1 of a request's row."""
        if slots:  # pinned + non_blocking on CUDA: scheduling must not wait for the forward in flight
            copy_to(self.req_to_token[row, start:start + len(slots)], slots, torch.int32)

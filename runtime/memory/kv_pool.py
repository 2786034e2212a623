"""Token-granular KV pool: K/V buffers, a slot free list, and the request-to-slot table.

The underscore methods (alloc, free, reset, rows) are for memory/kv_manager.py alone: it is the one owner.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..config import KV_CACHE_DTYPES
from ..device_io import copy_to, to_device

_KV_DTYPES = {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16,
              "float32": torch.float32}


def kv_cache_torch_dtype(kv_cache_dtype: str, model_dtype: torch.dtype, compact: bool = False) -> torch.dtype:
    """Storage dtype of the KV pool (EngineConfig.kv_cache_dtype). 'auto': bf16 when `compact` (a quantized model
    on CPU whose native attention kernels read bf16 K/V: half the bytes per token, within the quality gate), else
    the model dtype (float32 mode keeps HF-equal outputs)."""
    if kv_cache_dtype == "auto":
        return torch.bfloat16 if compact and model_dtype == torch.float32 else model_dtype
    if kv_cache_dtype not in _KV_DTYPES:
        raise ValueError(f"kv_cache_dtype must be one of {KV_CACHE_DTYPES}, got {kv_cache_dtype!r}")
    return _KV_DTYPES[kv_cache_dtype]


def cpu_zeros(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """A zero tensor on CPU whose pages are committed only when written (calloc): a pool sized for the machine
    costs resident memory as requests fill it, not at start."""
    n = 1
    for d in shape:
        n *= d
    return torch.from_numpy(np.zeros(n * torch.empty((), dtype=dtype).element_size(), dtype=np.uint8)) \
        .view(dtype).view(shape)


@dataclass(frozen=True)
class SlotAlloc:
    """Result of an allocation: the slots, or ok=False when the pool is short (nothing allocated)."""

    ok: bool
    slots: list[int]


class KVPool:
    """Owns K/V storage and the free slots. Slots are token-granular; slot ids are plain ints.

    On CPU the pool keeps each request's KV one contiguous run where it can (`contiguous=True`): decode
    attention reads a contiguous run in place, while a scattered request's K/V is gathered every layer of every
    step, which took 65% of a batch-64 decode step (docs/runtime.md, "KV memory"). A request's first slots go
    into the middle of the largest free run (its start when the run opens the pool), leaving room to grow, and
    later slots extend its run when the next slots are free; otherwise any free slots are taken (correct, only
    slower to read).
    """

    def __init__(self, num_layers: int, num_slots: int, kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, contiguous: bool | None = None):
        self.num_slots = num_slots
        # one slot past the pool is never handed out: padded decode rows (CUDA-graph buckets) write their K/V there
        self.padding_slot = num_slots
        # k_buffer, v_buffer: [layers, slots + 1, kv_heads, head_dim]
        shape = (num_layers, num_slots + 1, kv_heads, head_dim)
        if torch.device(device).type == "cpu":
            self.k_buffer, self.v_buffer = cpu_zeros(shape, dtype), cpu_zeros(shape, dtype)
        else:
            self.k_buffer = torch.zeros(shape, dtype=dtype, device=device)
            self.v_buffer = torch.zeros_like(self.k_buffer)
        # the Triton decode kernel reads slots through req_to_token at any layout: placement only pays on CPU
        self.contiguous = (torch.device(device).type == "cpu") if contiguous is None else contiguous
        self._all_free()

    def available(self) -> int:
        """Number of free slots."""
        return self._num_free

    def _alloc(self, n: int, after: int | None = None, fresh: bool = False) -> SlotAlloc:
        """Take n free slots; returns ok=False (and takes nothing) when fewer than n are free.

        after: the request's last slot; the n slots right after it are taken when all are free. fresh: the
        request has no run of its own yet; its slots start in the middle of the largest free run."""
        if n > self._num_free:
            return SlotAlloc(False, [])
        if n and self.contiguous:
            if after is not None and self._is_free[after + 1:after + 1 + n] == b"\x01" * n:
                return SlotAlloc(True, self._take_run(after + 1, n))
            if fresh:
                placed = self._place(n)
                if placed is not None:
                    return SlotAlloc(True, placed)
        self._runs = None
        out, fs, is_free = [], self._free_slots, self._is_free
        while len(out) < n:  # the stack may hold stale entries of slots taken as part of a run: skip them
            s = fs.pop()
            if is_free[s]:
                is_free[s] = 0
                out.append(s)
        self._num_free -= n
        return SlotAlloc(True, out)

    def _alloc_each(self, wants: list[tuple[int | None, bool]]) -> list[int]:
        """One slot per (after, fresh) pair, as _alloc(1, after, fresh) would give them one by one; the caller
        checked that len(wants) slots are free (a decode step's growth in one call)."""
        if len(wants) > self._num_free:
            raise RuntimeError(f"{len(wants)} slots asked, {self._num_free} free")
        out, fs, is_free, end = [], self._free_slots, self._is_free, self.num_slots - 1
        for after, fresh in wants:
            s = None
            if self.contiguous:
                if after is not None and after < end and is_free[after + 1]:
                    s = after + 1
                elif fresh:
                    placed = self._place(1)
                    if placed is not None:
                        out.append(placed[0])
                        continue
            if s is None:
                s = fs.pop()
                while not is_free[s]:  # stale entries of slots taken as part of a run
                    s = fs.pop()
            is_free[s] = 0
            self._num_free -= 1
            self._runs = None
            out.append(s)
        return out

    def _take_run(self, start: int, n: int) -> list[int]:
        self._is_free[start:start + n] = bytes(n)
        self._num_free -= n
        self._runs = None
        return list(range(start, start + n))

    def _free_runs(self) -> tuple[np.ndarray, np.ndarray]:
        """The free runs [starts[i], ends[i]) in slot order; kept across placements, rebuilt after other changes."""
        if self._runs is None:
            # run edges, vectorized: a fragmented 65k-slot pool has ~30k runs (6 ms as a Python loop, ~0.3 ms here)
            edges = np.flatnonzero(np.diff(np.frombuffer(b"\x00" + bytes(self._is_free) + b"\x00", dtype=np.uint8)))
            self._runs = (edges[0::2], edges[1::2])
        return self._runs

    def _placement(self, n: int) -> tuple[int, int] | None:
        """(start, run index) of n slots in the largest free run, or None: in its middle, which leaves room to grow
        both to the request whose run may end just before it and to this one; at its start when it opens the pool."""
        starts, ends = self._free_runs()
        if not len(starts):
            return None
        k = int(np.argmax(ends - starts))
        start, length = int(starts[k]), int(ends[k] - starts[k])
        if length < n:
            return None
        return (0 if start == 0 else start + (length - n) // 2), k

    def _place(self, n: int) -> list[int] | None:
        """Take n slots where _placement puts them, keeping the run list current (an admission round places
        many requests: the pool is scanned once, not once per request)."""
        at = self._placement(n)
        if at is None:
            return None
        start, k = at
        starts, ends = self._runs
        s, e = int(starts[k]), int(ends[k])
        new_s = [x for x, y in ((s, start), (start + n, e)) if y > x]
        new_e = [y for x, y in ((s, start), (start + n, e)) if y > x]
        runs = (np.concatenate((starts[:k], np.array(new_s, dtype=starts.dtype), starts[k + 1:])),
                np.concatenate((ends[:k], np.array(new_e, dtype=ends.dtype), ends[k + 1:])))
        slots = self._take_run(start, n)
        self._runs = runs
        return slots

    def _free(self, slots: list[int]) -> None:
        """Return slots to the free list; freeing a free slot is a bug and raises."""
        for s in slots:
            if self._is_free[s]:
                raise RuntimeError(f"double free of KV slot {s}")
            self._is_free[s] = 1
        self._num_free += len(slots)
        self._runs = None
        self._free_slots.extend(slots)
        if len(self._free_slots) > 2 * self.num_slots:  # drop the stale entries runs left behind
            self._free_slots = [s for s in range(self.num_slots - 1, -1, -1) if self._is_free[s]]

    def _reset(self) -> None:
        """Mark every slot free (flush)."""
        self._all_free()

    def _all_free(self) -> None:
        self._free_slots: list[int] = list(range(self.num_slots - 1, -1, -1))  # pop() hands out low slots first
        self._is_free = bytearray(b"\x01") * self.num_slots
        self._num_free = self.num_slots
        self._runs: tuple[np.ndarray, np.ndarray] | None = None  # _free_runs(), until the next change


class ReqToTokenPool:
    """Rows of KV slot ids, one row per running request: req_to_token[row, pos] = slot."""

    def __init__(self, max_reqs: int, max_context: int, device: torch.device):
        # req_to_token: [max_reqs + 1, max_context] int32 (read by the attention kernels); the extra row is never
        # handed out: padded decode rows read through it (KVManager points it at the pool's padding slot)
        self.req_to_token = torch.zeros(max_reqs + 1, max_context, dtype=torch.int32, device=device)
        # on CPU a numpy view of the same memory: a write is one numpy assignment, no tensor built per write
        self._np = self.req_to_token.numpy() if self.req_to_token.device.type == "cpu" else None
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
        if not slots:
            return
        if self._np is not None:
            self._np[row, start:start + len(slots)] = slots
        else:  # pinned + non_blocking on CUDA: scheduling must not wait for the forward in flight
            copy_to(self.req_to_token[row, start:start + len(slots)], slots, torch.int32)

    def _write_each(self, rows: list[int], positions: list[int], slots: list[int]) -> None:
        """req_to_token[rows[i], positions[i]] = slots[i] for every i, in one indexed write (a decode step)."""
        if not slots:
            return
        if self._np is not None:
            self._np[rows, positions] = slots
            return
        # one staged copy of the three lists (each host-to-device copy is a pinned block and a launch)
        idx = to_device(rows + positions + slots, torch.int64, self.req_to_token.device).view(3, len(slots))
        self.req_to_token.index_put_((idx[0], idx[1]), idx[2].to(torch.int32))

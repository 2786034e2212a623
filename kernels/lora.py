"""Segmented LoRA (S-LoRA / Punica's SGMV): the rows of one forward grouped by adapter, each group's delta
y += (x A^T) B^T computed as one shrink then one expand, added in place to the base projection's output.

Adapters of different ranks share one pool: A is [slots, slices * R, in] and B is stored transposed, Bt
[slots, R, out] (R the pool's maximum rank, an adapter of rank r uses the first r of each slice's R rows of A and
the first r rows of Bt; the rest is never read). The expand then adds r rows of Bt, scaled by h, to y (contiguous
runs, where B [out, R] would need one rank-long dot product per output). A fused projection (q/k/v, gate/up) has
several output slices: slice s reads its own R rows of A and writes the columns offsets[s]:offsets[s + 1] of y.
The adapter's scaling (alpha / r or alpha / sqrt(r)) is folded into B. The weights may be stored in a narrower
float dtype than x and y (bf16 adapters under a float32 model: half the bytes a decode step reads).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import torch

from ._checks import FLOAT_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module


@dataclass(frozen=True)
class LoraSegments:
    """One forward's adapter rows grouped by adapter: segment k is rows[indptr[k]:indptr[k + 1]] using pool slot
    slots[k] of rank ranks[k]. Host tuples drive the torch paths without device syncs; tensors feed the kernels."""

    rows: torch.Tensor  # [n] int64: token rows that carry an adapter, grouped by adapter (base rows are absent)
    indptr: torch.Tensor  # [s + 1] int64
    slots: torch.Tensor  # [s] int64
    ranks: torch.Tensor  # [s] int64
    host_indptr: tuple[int, ...]
    host_slots: tuple[int, ...]
    host_ranks: tuple[int, ...]
    num_tokens: int  # rows of the forward (x.shape[0])

    @property
    def all_rows(self) -> bool:
        """One adapter on every row, in order: no gather or scatter needed."""
        return len(self.host_slots) == 1 and self.host_indptr[1] == self.num_tokens


def group_rows(row_slots: list[int], slot_ranks: dict[int, int], device: torch.device) -> LoraSegments | None:
    """Segments of a forward whose token row i uses pool slot row_slots[i] (-1: the base model alone); None when no
    row has an adapter. Rows keep their order inside each segment; segments follow first appearance."""
    by_slot: dict[int, list[int]] = {}
    for i, s in enumerate(row_slots):
        if s >= 0:
            by_slot.setdefault(s, []).append(i)
    if not by_slot:
        return None
    rows, indptr = [], [0]
    for idx in by_slot.values():
        rows.extend(idx)
        indptr.append(len(rows))
    slots = tuple(by_slot)
    ranks = tuple(slot_ranks[s] for s in slots)
    as_long = lambda xs: torch.tensor(xs, dtype=torch.int64).to(device, non_blocking=True)  # noqa: E731
    return LoraSegments(as_long(rows), as_long(indptr), as_long(slots), as_long(ranks), tuple(indptr), slots, ranks,
                        len(row_slots))


def lora_delta_reference(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor,
                         offsets: tuple[int, ...], seg: LoraSegments) -> torch.Tensor:
    """y[rows] += per slice s: (x[rows] A_s^T) B_s^T, adapter by adapter (the test oracle); returns y."""
    n_slices, pool_rank = len(offsets) - 1, bt.shape[1]
    for k, (slot, r) in enumerate(zip(seg.host_slots, seg.host_ranks)):
        lo, hi = seg.host_indptr[k], seg.host_indptr[k + 1]
        whole = seg.all_rows
        idx = None if whole else seg.rows[lo:hi]
        xs = x if whole else x[idx]  # [m, in]
        ak = a[slot].view(n_slices, pool_rank, -1)[:, :r].reshape(n_slices * r, -1).to(x.dtype)  # [slices * r, in]
        bk = bt[slot, :r].to(x.dtype)  # [r, out]
        h = xs @ ak.t()  # shrink: [m, slices * r]
        delta = torch.cat([h[:, s * r:(s + 1) * r] @ bk[:, offsets[s]:offsets[s + 1]]
                           for s in range(n_slices)], dim=1) if n_slices > 1 else h @ bk  # [m, out]
        if whole:
            y += delta
        else:
            y.index_add_(0, idx, delta)
    return y


def lora_delta(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, offsets: tuple[int, ...],
               seg: LoraSegments) -> torch.Tensor:
    """Checked: add the segments' LoRA deltas to y in place. x: [t, in], y: [t, out], a: [slots, slices * R, in],
    bt: [slots, R, out] (a and bt of one float dtype, x and y of one); offsets: the slices' column bounds in y
    (0 .. out). CUDA -> Triton, CPU -> the native kernel (float32 x), else the reference."""
    check_tensor("x", x, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("y", y, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("a", a, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("bt", bt, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_same_dtype(x=x, y=y)
    check_same_dtype(a=a, bt=bt)
    check_same_device(x=x, y=y, a=a, bt=bt, rows=seg.rows)
    t, n_in = x.shape
    check_dim("y", y.shape[0], t, "rows (x's rows)")
    check_dim("a", a.shape[2], n_in, "dim 2 (x's columns)")
    check_dim("bt", bt.shape[2], y.shape[1], "dim 2 (y's columns)")
    check_dim("bt", bt.shape[0], a.shape[0], "dim 0 (a's slots)")
    n_slices = len(offsets) - 1
    if n_slices < 1 or offsets[0] != 0 or offsets[-1] != y.shape[1] or list(offsets) != sorted(offsets):
        raise ValueError(f"offsets must rise from 0 to y's {y.shape[1]} columns, got {offsets}")
    check_dim("a", a.shape[1], n_slices * bt.shape[1], "dim 1 (slices x bt's rank)")
    check_dim("segments", seg.num_tokens, t, "num_tokens (x's rows)")
    if max(seg.host_ranks) > bt.shape[1] or min(seg.host_slots) < 0 or max(seg.host_slots) >= a.shape[0]:
        raise ValueError(f"segments name slots {seg.host_slots} of ranks {seg.host_ranks}; the pool has "
                         f"{a.shape[0]} slots of rank {bt.shape[1]}")
    if x.device.type == "cuda" and a.dtype != x.dtype:
        raise ValueError(f"on CUDA the adapter weights must have x's dtype {x.dtype}, got {a.dtype}")
    return lora_delta_unchecked(x, y, a, bt, offsets, seg)


def lora_delta_unchecked(x, y, a, bt, offsets, seg):
    """lora_delta without the checks (the model's LoRA layers: shapes fixed when the pool was built)."""
    mod = triton_module("lora_triton", x)
    if mod is not None:
        with on_device(x):
            return mod.lora_delta_triton(x, y, a, bt, offsets, seg)
    if x.device.type == "cpu":
        from .lora_cpu import lora_delta_cpu, lora_lib

        lib = lora_lib(x, y, a, bt)
        if lib is not None:
            return lora_delta_cpu(lib, x, y, a, bt, _offsets_tensor(offsets), seg)
    return lora_delta_reference(x, y, a, bt, offsets, seg)


@functools.lru_cache(maxsize=256)
def _offsets_tensor(offsets: tuple[int, ...]) -> torch.Tensor:
    return torch.tensor(offsets, dtype=torch.int64)

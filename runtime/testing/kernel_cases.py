"""Shared builders for kernel tests: ragged batches laid out in a KV pool through req_to_token."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class PagedBatch:
    """A KV pool and req_to_token table holding `kv_lens[i]` tokens for request i at scattered slots."""

    k_cache: torch.Tensor  # [slots, kv_heads, head_dim]
    v_cache: torch.Tensor
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32
    req_pool_indices: torch.Tensor  # [b] int64
    kv_lens: list[int]


def make_paged_batch(
    kv_lens: list[int], kv_heads: int, head_dim: int, dtype: torch.dtype, seed: int = 0, max_context: int | None = None
) -> PagedBatch:
    """Random K/V at a random permutation of slots (non-contiguous), rows in a shuffled request table."""
    g = torch.Generator().manual_seed(seed)
    total = sum(kv_lens)
    slots = total + 7  # spare slots hold garbage that a correct kernel never reads
    k_cache = torch.randn(slots, kv_heads, head_dim, generator=g).to(dtype)
    v_cache = torch.randn(slots, kv_heads, head_dim, generator=g).to(dtype)
    max_context = max_context or max(max(kv_lens, default=1), 1) + 3
    max_reqs = len(kv_lens) + 2
    # Unused table entries point at slot ids past the pool would crash a kernel that reads them.
    req_to_token = torch.full((max_reqs, max_context), 0, dtype=torch.int32)
    perm = torch.randperm(slots, generator=g)
    rows = torch.randperm(max_reqs, generator=g)[: len(kv_lens)]
    start = 0
    for row, n in zip(rows.tolist(), kv_lens):
        req_to_token[row, :n] = perm[start : start + n].to(torch.int32)
        start += n
    return PagedBatch(k_cache, v_cache, req_to_token, rows.to(torch.int64), list(kv_lens))


def naive_attention(
    q_rows: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: list[int], sm_scale: float
) -> torch.Tensor:
    """Float64 loop oracle: q row j sees keys [0, visible[j]); GQA by head // group."""
    # q_rows: [m, heads, d]; k, v: [L, kv_heads, d]
    m, heads, d = q_rows.shape
    group = heads // k.shape[1]
    out = torch.zeros(m, heads, d, dtype=torch.float64)
    for j in range(m):
        for h in range(heads):
            kk = k[: visible[j], h // group].double()
            vv = v[: visible[j], h // group].double()
            p = torch.softmax((kk @ q_rows[j, h].double()) * sm_scale, dim=0)
            out[j, h] = p @ vv
    return out


def patch_interpreter_bf16_dot() -> None:
    """Work around Triton's interpreter multiplying bf16 bit patterns in tl.dot (stored as uint16 in numpy).

    Upcasting bf16 operands to float32 is exact and is what the GPU's bf16 MMA with float32 accumulation
    computes, so the kernels under test stay unchanged. Idempotent; a no-op outside the interpreter.
    """
    import numpy as np
    import triton.language as tl
    from triton.runtime import interpreter

    builder = interpreter.InterpreterBuilder
    if getattr(builder.create_dot, "_sglpy_bf16_patch", False):
        return
    original = builder.create_dot

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        def up(x):
            if x.dtype.scalar == tl.bfloat16:
                data = interpreter._convert_float(x.data, tl.bfloat16, tl.float32, None).view(np.float32)
                return interpreter.TensorHandle(data, tl.float32)
            return x

        return original(self, up(a), up(b), d, input_precision, max_num_imprecise_acc)

    create_dot._sglpy_bf16_patch = True
    builder.create_dot = create_dot

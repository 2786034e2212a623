"""Triton in-place rotary embedding (rotate_half layout); imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rotate_tile(X, tok, stride_t, stride_h, n_heads, cos, sin, HALF, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h[:, None] < n_heads) & (offs_d[None, :] < HALF)
    base = X + tok * stride_t + offs_h[:, None] * stride_h + offs_d[None, :]
    x1 = tl.load(base, mask=mask, other=0.0)
    x2 = tl.load(base + HALF, mask=mask, other=0.0)
    x1f, x2f = x1.to(tl.float32), x2.to(tl.float32)
    tl.store(base, (x1f * cos - x2f * sin).to(x1.dtype), mask=mask)
    tl.store(base + HALF, (x2f * cos + x1f * sin).to(x1.dtype), mask=mask)


@triton.jit
def _rotary_kernel(
    Q, K, Positions, CosSin,
    stride_q_t, stride_q_h, stride_k_t, stride_k_h, stride_cs,
    heads, kv_heads, HALF,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):
    tok = tl.program_id(0).to(tl.int64)
    pos = tl.load(Positions + tok).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask_d = offs_d < HALF
    cos = tl.load(CosSin + pos * stride_cs + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    sin = tl.load(CosSin + pos * stride_cs + HALF + offs_d, mask=mask_d, other=0.0).to(tl.float32)[None, :]
    _rotate_tile(Q, tok, stride_q_t, stride_q_h, heads, cos, sin, HALF, BLOCK_HQ, BLOCK_HALF)
    _rotate_tile(K, tok, stride_k_t, stride_k_h, kv_heads, cos, sin, HALF, BLOCK_HK, BLOCK_HALF)


def apply_rotary_triton(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Launch the in-place rotary kernel over q and k (strided views allowed, last dim contiguous)."""
    # q: [n, heads, head_dim]; k: [n, kv_heads, head_dim]; positions: [n]; cos_sin_cache: [max_pos, head_dim]
    positions = positions.contiguous()  # the kernel reads Positions + i
    n, heads, head_dim = q.shape
    half = head_dim // 2
    _rotary_kernel[(n,)](
        q, k, positions, cos_sin_cache,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), cos_sin_cache.stride(0),
        heads, k.shape[1], half,
        BLOCK_HQ=triton.next_power_of_2(heads), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )

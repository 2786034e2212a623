"""Triton store of new tokens' K/V into the pool; imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _store_kv_kernel(
    KCache, VCache, Loc, K, V,
    stride_kc_t, stride_kc_h, stride_vc_t, stride_vc_h,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    kv_heads, head_dim,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr,
):
    tok = tl.program_id(0)
    offs_h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    mask = (offs_h[:, None] < kv_heads) & (offs_d[None, :] < head_dim)
    # int64 slot offsets: slots * stride overflows int32 on large pools.
    slot = tl.load(Loc + tok).to(tl.int64)
    k = tl.load(K + tok * stride_k_t + offs_h[:, None] * stride_k_h + offs_d[None, :], mask=mask)
    v = tl.load(V + tok * stride_v_t + offs_h[:, None] * stride_v_h + offs_d[None, :], mask=mask)
    tl.store(KCache + slot * stride_kc_t + offs_h[:, None] * stride_kc_h + offs_d[None, :], k, mask=mask)
    tl.store(VCache + slot * stride_vc_t + offs_h[:, None] * stride_vc_h + offs_d[None, :], v, mask=mask)


def store_kv_triton(
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Launch the store kernel; arguments already checked by kv_store.store_kv."""
    # k, v: [n, kv_heads, head_dim] (last dim contiguous); caches: [slots, kv_heads, head_dim]
    # A 16-bit cache under float32 k/v: convert first (torch rounds to nearest even, as the reference does).
    k, v = k.to(k_cache.dtype), v.to(v_cache.dtype)
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    loc = loc.contiguous()  # the kernel reads Loc + i
    n, kv_heads, head_dim = k.shape
    block_d = triton.next_power_of_2(head_dim)
    block_h = min(triton.next_power_of_2(kv_heads), max(1, 4096 // block_d))
    grid = (n, triton.cdiv(kv_heads, block_h))
    _store_kv_kernel[grid](
        k_cache, v_cache, loc, k, v,
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        kv_heads, head_dim,
        BLOCK_H=block_h, BLOCK_D=block_d,
    )

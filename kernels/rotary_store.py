"""Rotary on the q and k of a fused qkv projection, then k and v into the KV pool: the attention layer's glue."""

from __future__ import annotations

import torch

from ._checks import check_dim, check_tensor
from .cpu_native import native_lib, pool_readable
from .decode_glue_cpu import rotate_and_store_cpu
from .kv_store import store_kv_unchecked
from .rotary import RotaryPlan, apply_rotary_planned


def rotate_and_store_reference(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, plan: RotaryPlan,
                               k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """Torch path (and oracle): views of q, k, v; apply_rotary_planned; store_kv. Returns q [t, heads, head_dim]."""
    # qkv: [t, (heads + 2 kv_heads) * head_dim]; k_cache, v_cache: [slots, kv_heads, head_dim]; loc: [t]
    t = qkv.shape[0]
    hq, hkv = heads * head_dim, kv_heads * head_dim
    q, k, v = qkv.split([hq, hkv, hkv], dim=-1)
    q = q.view(t, heads, head_dim)
    k = k.view(t, kv_heads, head_dim)
    v = v.view(t, kv_heads, head_dim)
    apply_rotary_planned(q, k, plan)
    store_kv_unchecked(k_cache, v_cache, loc, k, v)  # shapes fixed at load
    return q


def _native_fits(qkv: torch.Tensor, plan: RotaryPlan, k_cache: torch.Tensor, v_cache: torch.Tensor,
                 loc: torch.Tensor) -> bool:
    return (qkv.device.type == "cpu" and qkv.dtype == torch.float32 and qkv.stride(1) == 1
            and plan.cos_sin_cache.dtype == torch.float32 and plan.cos_sin_cache.is_contiguous()
            and plan.positions.dtype == torch.int64 and plan.positions.is_contiguous()
            and loc.dtype == torch.int64 and loc.is_contiguous() and pool_readable(k_cache, v_cache))


def rotate_and_store(qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int, plan: RotaryPlan,
                     k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor) -> torch.Tensor:
    """Rotate q and k inside qkv (in place), store k and v at slots `loc`; returns q as a view [t, heads, head_dim].

    CPU with the native kernels: one call (csrc/decode_glue.cpp); otherwise the torch path (Triton on CUDA)."""
    check_tensor("qkv", qkv, 2, None)
    check_dim("qkv", qkv.shape[1], (heads + 2 * kv_heads) * head_dim, "dim 1 ((heads + 2 kv_heads) * head_dim)")
    check_dim("loc", loc.shape[0], qkv.shape[0], "length (tokens, = qkv.shape[0])")
    check_dim("positions", plan.positions.shape[0], qkv.shape[0], "length (tokens, = qkv.shape[0])")
    lib = native_lib() if qkv.device.type == "cpu" else None
    if lib is None or qkv.shape[0] == 0 or not _native_fits(qkv, plan, k_cache, v_cache, loc):
        return rotate_and_store_reference(qkv, heads, kv_heads, head_dim, plan, k_cache, v_cache, loc)
    rotate_and_store_cpu(lib, qkv, heads, kv_heads, head_dim, plan.positions, plan.cos_sin_cache, k_cache, v_cache,
                         loc)
    return qkv[:, : heads * head_dim].view(qkv.shape[0], heads, head_dim)

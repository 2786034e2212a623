"""Rotary position embedding (HF Llama rotate_half / NeoX layout) applied to q and k in place."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import torch

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_dim, check_same_device, check_tensor
from ._dispatch import on_device, triton_module


def _inv_freq(head_dim: int, base: float, scaling: Mapping | None) -> torch.Tensor:
    # Same float32 arithmetic as transformers' ROPE_INIT_FUNCTIONS so the CPU path matches HF bit for bit.
    inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim))
    kind = None if scaling is None else scaling.get("rope_type", scaling.get("type", "default"))
    if kind in (None, "default"):
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = scaling["original_max_position_embeddings"]
        low_wavelen, high_wavelen = old_len / low, old_len / high
        wavelen = 2 * math.pi / inv_freq
        scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        smoothed = (1 - smooth) * scaled / factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
        return torch.where(medium, smoothed, scaled)
    raise ValueError(f"unsupported rope scaling type {kind!r} (supported: default, linear, llama3)")


def build_rope_cache(
    head_dim: int,
    max_pos: int,
    base: float = 10000.0,
    scaling: Mapping | None = None,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str | None = None,
) -> torch.Tensor:
    """Return cos_sin_cache [max_pos, head_dim]: cos(pos * inv_freq) in the first half, sin in the second."""
    if head_dim <= 0 or head_dim % 2:
        raise ValueError(f"head_dim must be a positive even number, got {head_dim}")
    if max_pos <= 0:
        raise ValueError(f"max_pos must be positive, got {max_pos}")
    if not base > 0:
        raise ValueError(f"base must be positive, got {base}")
    inv_freq = _inv_freq(head_dim, base, scaling)
    freqs = torch.outer(torch.arange(max_pos, dtype=torch.float32), inv_freq)  # [max_pos, head_dim // 2]
    cache = torch.cat([freqs.cos(), freqs.sin()], dim=-1)
    return cache.to(dtype=dtype, device=device)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    half = x.shape[-1] // 2
    if x.dtype == torch.float32:
        # In place, five ops and one temporary (the CPU hot path runs float32); each product is rounded
        # before the sum, as HF's q * cos + rotate_half(q) * sin does.
        x1, x2 = x[..., :half], x[..., half:]
        x1_sin = x1 * sin
        x1.mul_(cos).addcmul_(x2, sin, value=-1.0)
        x2.mul_(cos).add_(x1_sin)
        return
    xf = x.to(torch.float32)
    x1, x2 = xf[..., :half], xf[..., half:]
    x.copy_(torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1))


def apply_rotary_reference(
    q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor
) -> None:
    """Pure-torch in-place rotary on q and k in float32 (x1*cos - x2*sin, x2*cos + x1*sin)."""
    # q: [n, heads, head_dim]; k: [n, kv_heads, head_dim]; positions: [n]; cos_sin_cache: [max_pos, head_dim]
    half = q.shape[-1] // 2
    cs = cos_sin_cache[positions.long()].to(torch.float32)[:, None, :]  # [n, 1, head_dim]
    cos, sin = cs[..., :half], cs[..., half:]
    _rotate(q, cos, sin)
    _rotate(k, cos, sin)


def check_rotary_args(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Raise ValueError naming the first bad argument of apply_rotary."""
    check_tensor("q", q, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("k", k, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("positions", positions, 1, INDEX_DTYPES)
    check_tensor("cos_sin_cache", cos_sin_cache, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_same_device(q=q, k=k, positions=positions, cos_sin_cache=cos_sin_cache)
    n, _, head_dim = q.shape
    if head_dim % 2:
        raise ValueError(f"head_dim must be even, got {head_dim}")
    check_dim("k", k.shape[0], n, "dim 0 (tokens, = q.shape[0])")
    check_dim("k", k.shape[2], head_dim, "dim 2 (head_dim, = q.shape[2])")
    check_dim("positions", positions.shape[0], n, "length (tokens, = q.shape[0])")
    check_dim("cos_sin_cache", cos_sin_cache.shape[1], head_dim, "dim 1 (head_dim, = q.shape[2])")


def apply_rotary(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> None:
    """Rotate q and k in place by their token positions using cos_sin_cache from build_rope_cache."""
    check_rotary_args(q, k, positions, cos_sin_cache)
    if q.shape[0] == 0:
        return
    impl = triton_module("rotary_triton", q)
    if impl is None:
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= cos_sin_cache.shape[0]:
            raise ValueError(f"positions must lie in [0, {cos_sin_cache.shape[0]}), got min {lo} max {hi}")
        apply_rotary_reference(q, k, positions, cos_sin_cache)
    else:
        with on_device(q):
            impl.apply_rotary_triton(q, k, positions, cos_sin_cache)


@dataclass(frozen=True)
class RotaryPlan:
    """One forward's rotary inputs, checked once and shared by every layer (cos/sin gathered once on CPU)."""

    positions: torch.Tensor  # [n]
    cos_sin_cache: torch.Tensor  # [max_pos, head_dim]
    cos: torch.Tensor | None  # [n, 1, head_dim // 2] float32 (CPU path)
    sin: torch.Tensor | None


def plan_rotary(positions: torch.Tensor, cos_sin_cache: torch.Tensor) -> RotaryPlan:
    """Check positions against the cache once and gather their cos/sin rows (CPU) for all layers."""
    check_tensor("positions", positions, 1, INDEX_DTYPES)
    check_tensor("cos_sin_cache", cos_sin_cache, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_same_device(positions=positions, cos_sin_cache=cos_sin_cache)
    if triton_module("rotary_triton", cos_sin_cache) is not None or positions.numel() == 0:
        return RotaryPlan(positions, cos_sin_cache, None, None)
    lo, hi = int(positions.min()), int(positions.max())
    if lo < 0 or hi >= cos_sin_cache.shape[0]:
        raise ValueError(f"positions must lie in [0, {cos_sin_cache.shape[0]}), got min {lo} max {hi}")
    half = cos_sin_cache.shape[1] // 2
    cs = cos_sin_cache[positions.long()].to(torch.float32)[:, None, :]  # [n, 1, head_dim]
    return RotaryPlan(positions, cos_sin_cache, cs[..., :half], cs[..., half:])


def _adjacent(q: torch.Tensor, k: torch.Tensor) -> bool:
    """True when k's heads directly follow q's in memory with the same strides (q, k views of one qkv row)."""
    return (q.dtype == k.dtype and q.stride() == k.stride() and q.stride(2) == 1 and q.stride(1) == q.shape[2]
            and k.data_ptr() == q.data_ptr() + q.shape[1] * q.stride(1) * q.element_size())


def apply_rotary_planned(q: torch.Tensor, k: torch.Tensor, plan: RotaryPlan) -> None:
    """apply_rotary with positions checked and cos/sin gathered once per forward; q and k rotate in place."""
    check_tensor("q", q, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("k", k, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    n = q.shape[0]
    check_dim("k", k.shape[0], n, "dim 0 (tokens, = q.shape[0])")
    check_dim("positions", plan.positions.shape[0], n, "length (tokens, = q.shape[0])")
    if n == 0:
        return
    if plan.cos is None:  # the Triton path (CUDA) reads positions itself
        apply_rotary(q, k, plan.positions, plan.cos_sin_cache)
        return
    check_dim("k", k.shape[2], q.shape[2], "dim 2 (head_dim, = q.shape[2])")
    check_dim("cos_sin_cache", plan.cos_sin_cache.shape[1], q.shape[2], "dim 1 (head_dim, = q.shape[2])")
    if _adjacent(q, k):
        # q and k are consecutive heads of a fused qkv projection: rotate them as one tensor
        qk = torch.as_strided(q, (n, q.shape[1] + k.shape[1], q.shape[2]), q.stride())
        _rotate(qk, plan.cos, plan.sin)
    else:
        _rotate(q, plan.cos, plan.sin)
        _rotate(k, plan.cos, plan.sin)

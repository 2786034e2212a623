"""Native CPU wrappers of csrc/decode_glue.cpp: RMSNorm, rotary + KV store, SiLU-and-mul, one call each (the torch
references they replace are in rmsnorm.py, rotary_store.py and activation.py)."""

from __future__ import annotations

import ctypes

import torch

from .cpu_native import DTYPE_CODES


def rmsnorm_cpu(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, eps: float,
                residual: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, residual stream) for float32 contiguous x [M, H] (and residual); new tensors, inputs untouched."""
    m, h = x.shape
    out = torch.empty_like(x)
    res = x if residual is None else torch.empty_like(x)
    lib.sglpy_rmsnorm(x.data_ptr(), None if residual is None else residual.data_ptr(), weight.data_ptr(), eps,
                      out.data_ptr(), res.data_ptr(), m, h, torch.get_num_threads())
    return out, res


def rotate_and_store_cpu(lib: ctypes.CDLL, qkv: torch.Tensor, heads: int, kv_heads: int, head_dim: int,
                         positions: torch.Tensor, cos_sin_cache: torch.Tensor, k_cache: torch.Tensor,
                         v_cache: torch.Tensor, loc: torch.Tensor) -> None:
    """Rotate q, k of qkv [M, (heads + 2 kv_heads) * head_dim] in place and write k, v at slots loc. Bad positions
    or slots raise ValueError before anything is written."""
    m = qkv.shape[0]
    rc = lib.sglpy_rotary_store(
        qkv.data_ptr(), m, qkv.stride(0), heads, kv_heads, head_dim, cos_sin_cache.data_ptr(), cos_sin_cache.shape[0],
        positions.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), DTYPE_CODES[k_cache.dtype], k_cache.shape[0],
        k_cache.stride(0), loc.data_ptr(), torch.get_num_threads())
    if rc != 0:
        row, bad_slot = divmod(rc - 1, 2)
        if bad_slot:
            raise ValueError(f"out_cache_loc[{row}] = {int(loc[row])} is not a slot of the pool [0, {k_cache.shape[0]})")
        raise ValueError(f"positions[{row}] = {int(positions[row])} must lie in [0, {cos_sin_cache.shape[0]})")


def silu_and_mul_cpu(lib: ctypes.CDLL, gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up for float32 contiguous gate_up [M, 2 I] -> [M, I]."""
    m, two_i = gate_up.shape
    out = torch.empty((m, two_i // 2), dtype=torch.float32)
    lib.sglpy_silu_mul(gate_up.data_ptr(), m, two_i // 2, out.data_ptr(), torch.get_num_threads())
    return out

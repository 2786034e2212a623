"""Store the K/V of new tokens into the per-layer KV pool at given slot ids."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module


def store_kv_reference(
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Pure-torch store: k_cache[loc] = k, v_cache[loc] = v (in place, converted to the cache dtype)."""
    # k_cache, v_cache: [slots, kv_heads, head_dim]; loc: [n]; k, v: [n, kv_heads, head_dim]
    loc = loc.long()
    k_cache.index_copy_(0, loc, k.to(k_cache.dtype))
    v_cache.index_copy_(0, loc, v.to(v_cache.dtype))


def check_store_kv_args(
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Raise ValueError naming the first bad argument of store_kv."""
    check_tensor("k_cache", k_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("loc", loc, 1, (torch.int32, torch.int64))
    check_tensor("k", k, 3, FLOAT_DTYPES)
    check_tensor("v", v, 3, FLOAT_DTYPES)
    check_same_device(k_cache=k_cache, v_cache=v_cache, loc=loc, k=k, v=v)
    check_same_dtype(k_cache=k_cache, v_cache=v_cache)
    check_same_dtype(k=k, v=v)  # k/v may differ from the caches: they are converted on store
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    _, kv_heads, head_dim = k_cache.shape
    for name, t in (("k", k), ("v", v)):
        check_dim(name, t.shape[0], loc.shape[0], "dim 0 (tokens, = len(loc))")
        check_dim(name, t.shape[1], kv_heads, "dim 1 (kv_heads)")
        check_dim(name, t.shape[2], head_dim, "dim 2 (head_dim)")


def store_kv(
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """Write k/v rows into k_cache/v_cache at slots `loc` in place (Triton on CUDA, torch otherwise)."""
    check_store_kv_args(k_cache, v_cache, loc, k, v)
    store_kv_unchecked(k_cache, v_cache, loc, k, v)


def store_kv_unchecked(
    k_cache: torch.Tensor, v_cache: torch.Tensor, loc: torch.Tensor, k: torch.Tensor, v: torch.Tensor
) -> None:
    """store_kv without the argument checks: the model's hot path, whose shapes are fixed at load."""
    if loc.numel() == 0:
        return
    impl = triton_module("kv_store_triton", k_cache)
    if impl is None:
        store_kv_reference(k_cache, v_cache, loc, k, v)
    else:
        with on_device(k_cache):
            impl.store_kv_triton(k_cache, v_cache, loc, k, v)

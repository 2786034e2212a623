"""Extend (prefill) attention: new tokens attend causally to themselves and to their cached prefix."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module


def extend_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Pure-torch extend attention: one float32 SDPA per request with a causal-with-prefix mask."""
    # q: [sum(extend_lens), heads, head_dim] packed request by request; returns o of the same shape
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    out = torch.empty_like(q)
    start = 0
    for row, prefix, ext in zip(req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist()):
        if ext == 0:
            continue
        total = prefix + ext
        slots = req_to_token[row, :total].long()
        # index_select of 2-D rows is much faster on CPU than advanced indexing of 3-D slabs.
        k = k_cache.flatten(1).index_select(0, slots).view(total, kv_heads, head_dim)
        v = v_cache.flatten(1).index_select(0, slots).view(total, kv_heads, head_dim)
        k = k.to(torch.float32).transpose(0, 1)  # [kv_heads, total, head_dim]
        v = v.to(torch.float32).transpose(0, 1)
        # Rows ordered (group, token) under each kv head, so K/V are never repeated per query head.
        qi = q[start : start + ext].to(torch.float32).reshape(ext, kv_heads, group, head_dim)
        qi = qi.permute(1, 2, 0, 3).reshape(kv_heads, group * ext, head_dim)
        if prefix == 0:
            # expand (stride 0, no copy) rather than rely on SDPA broadcasting, which not every backend does.
            shape = (kv_heads, group, total, head_dim)
            o = F.scaled_dot_product_attention(qi.view(kv_heads, group, ext, head_dim), k[:, None].expand(shape),
                                               v[:, None].expand(shape), is_causal=True, scale=sm_scale)
        else:
            # Query j sits at absolute position prefix + j and sees keys 0..prefix + j.
            pos_q = prefix + torch.arange(ext, device=q.device)
            mask = torch.arange(total, device=q.device)[None, :] <= pos_q[:, None]  # [ext, total]
            o = F.scaled_dot_product_attention(qi, k, v, attn_mask=mask.repeat(group, 1), scale=sm_scale)
        o = o.reshape(kv_heads, group, ext, head_dim).permute(2, 0, 1, 3)
        out[start : start + ext] = o.reshape(ext, heads, head_dim).to(q.dtype)
        start += ext
    return out


def check_extend_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
) -> None:
    """Raise ValueError naming the first bad argument of extend_attention (shapes, dtypes, devices)."""
    check_tensor("q", q, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("k_cache", k_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("req_to_token", req_to_token, 2, INDEX_DTYPES, last_dim_contiguous=True)
    check_tensor("req_pool_indices", req_pool_indices, 1, INDEX_DTYPES)
    check_tensor("prefix_lens", prefix_lens, 1, INDEX_DTYPES)
    check_tensor("extend_lens", extend_lens, 1, INDEX_DTYPES)
    check_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
        req_pool_indices=req_pool_indices, prefix_lens=prefix_lens, extend_lens=extend_lens,
    )
    check_same_dtype(q=q, k_cache=k_cache, v_cache=v_cache)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    heads, head_dim = q.shape[1], q.shape[2]
    kv_heads = k_cache.shape[1]
    check_dim("k_cache", k_cache.shape[2], head_dim, "dim 2 (head_dim, = q.shape[2])")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    b = req_pool_indices.shape[0]
    check_dim("prefix_lens", prefix_lens.shape[0], b, "length (batch, = len(req_pool_indices))")
    check_dim("extend_lens", extend_lens.shape[0], b, "length (batch, = len(req_pool_indices))")


def check_extend_len_values(
    n_tokens: int, prefix_lens: torch.Tensor, extend_lens: torch.Tensor, max_context: int
) -> int:
    """Raise ValueError when the lengths disagree with q or exceed req_to_token; return max(extend_lens).

    One host sync on CUDA (all statistics in one transfer); prefill is not graph-captured.
    """
    if prefix_lens.numel() == 0:
        if n_tokens != 0:
            raise ValueError(f"q has {n_tokens} tokens but the batch is empty")
        return 0
    stats = torch.stack([prefix_lens.min(), extend_lens.min(), extend_lens.sum(),
                         (prefix_lens + extend_lens).max(), extend_lens.max()])
    min_prefix, min_extend, total, longest, max_extend = (int(x) for x in stats.tolist())
    if min_prefix < 0:
        raise ValueError(f"prefix_lens must be >= 0, got min {min_prefix}")
    if min_extend < 0:
        raise ValueError(f"extend_lens must be >= 0, got min {min_extend}")
    if total != n_tokens:
        raise ValueError(f"sum(extend_lens) ({total}) must equal q.shape[0] ({n_tokens})")
    if longest > max_context:
        raise ValueError(f"prefix_lens + extend_lens must be <= req_to_token.shape[1] ({max_context}), got {longest}")
    return max_extend


def extend_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its prefix and themselves; returns o like q."""
    check_extend_attention_args(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    max_extend = check_extend_len_values(q.shape[0], prefix_lens, extend_lens, req_to_token.shape[1])
    if q.shape[0] == 0:
        return torch.empty_like(q)
    impl = triton_module("extend_attention_triton", q)
    args = (q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale)
    if impl is None:
        return extend_attention_reference(*args)
    with on_device(q):
        return impl.extend_attention_triton(*args, max_extend=max_extend)

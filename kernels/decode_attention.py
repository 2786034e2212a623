"""Decode attention: one new query token per request over its cached K/V, read through req_to_token.

Every path takes an optional sliding window (window > 0: the query at position p sees keys (p - window, p]) and
attention-logit soft-capping (softcap > 0: scaled scores s -> tanh(s / softcap) * softcap before the softmax), as
Gemma 2/3, Phi-3 and Mistral's windowed layers need; 0 (the default) is plain causal attention."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module
from .cpu_native import native_lib
from .decode_attention_cpu import decode_attention_cpu, supports


def window_softcap(window: int | None, softcap: float | None) -> tuple[int, float]:
    """(window, softcap) as the kernels take them (None -> 0: none); ValueError when one is negative or not finite."""
    w = 0 if window is None else int(window)
    c = 0.0 if softcap is None else float(softcap)
    if w < 0 or (window is not None and w != window):
        raise ValueError(f"window must be a whole number of tokens >= 0 (0 or None: none), got {window!r}")
    if not (c >= 0.0 and c != float("inf")):
        raise ValueError(f"softcap must be a finite number >= 0 (0 or None: none), got {softcap!r}")
    return w, c


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None, scale: float,
                     softcap: float = 0.0) -> torch.Tensor:
    """SDPA of float32 q [..., m, d] over k, v [..., n, d] under a boolean mask (True = visible), scores soft-capped
    as tanh(s / softcap) * softcap when softcap > 0 (SDPA has no cap: then the scores are written out)."""
    if not softcap:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale)
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = torch.tanh(s / softcap) * softcap
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf"))
    return torch.matmul(torch.softmax(s, dim=-1), v)


def length_groups(lens: list[int], max_waste: float = 2.0) -> list[list[int]]:
    """Split request indices into groups whose padded size (count x longest) is <= max_waste x their tokens."""
    groups: list[list[int]] = []
    tokens = 0
    for i in sorted(range(len(lens)), key=lambda j: -lens[j]):  # longest first: it sets the group's padding
        if groups and (len(groups[-1]) + 1) * lens[groups[-1][0]] <= max_waste * (tokens + lens[i]):
            groups[-1].append(i)
            tokens += lens[i]
        else:
            groups.append([i])
            tokens = lens[i]
    return groups


def gather_padded_kv(k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor,
                     req_pool_indices: torch.Tensor, seq_lens: torch.Tensor, max_len: int):
    """K/V of each request padded to max_len, float32 [b, kv_heads, max_len, head_dim], and the valid mask [b, max_len]."""
    b = req_pool_indices.shape[0]
    kv_heads, head_dim = k_cache.shape[1], k_cache.shape[2]
    pos = torch.arange(max_len, device=k_cache.device)
    valid = pos[None, :] < seq_lens[:, None]  # [b, max_len]
    slots = req_to_token[req_pool_indices.long(), :max_len].long()
    # Padding positions may hold stale slot ids; point them at slot 0 (always in range) and mask them out.
    slots = torch.where(valid, slots, torch.zeros_like(slots))
    # The gather dominates; index_select of 2-D rows is ~8x faster on CPU than of 3-D slabs.
    flat = slots.reshape(-1)
    k = k_cache.flatten(1).index_select(0, flat).view(b, max_len, kv_heads, head_dim)
    v = v_cache.flatten(1).index_select(0, flat).view(b, max_len, kv_heads, head_dim)
    return k.to(torch.float32).permute(0, 2, 1, 3), v.to(torch.float32).permute(0, 2, 1, 3), valid


def _decode_padded(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    max_len: int,
    sm_scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    # q: [b, heads, head_dim] -> o: [b, heads, head_dim] float32
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    k, v, valid = gather_padded_kv(k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, max_len)
    if window:  # the new token sits at seq_len - 1: keys before seq_len - window fall out of its window
        valid = valid & (torch.arange(max_len, device=valid.device)[None, :] >= seq_lens[:, None] - window)
    # Grouping query heads under their kv head avoids materialising K/V once per query head.
    qf = q.to(torch.float32).reshape(b, kv_heads, heads // kv_heads, head_dim)
    out = masked_attention(qf, k, v, valid[:, None, None, :], sm_scale, softcap)
    return out.reshape(b, heads, head_dim)


def decode_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Pure-torch decode attention: gather K/V padded per length group, one masked float32 SDPA per group
    (window, softcap: the module docstring)."""
    # q: [b, heads, head_dim]; k_cache, v_cache: [slots, kv_heads, head_dim]; seq_lens: [b]
    window, softcap = window_softcap(window, softcap)
    lens = seq_lens.tolist()
    groups = length_groups(lens)
    if len(groups) == 1:  # the common case: similar lengths, one batched SDPA, no reordering
        out = _decode_padded(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, max(lens), sm_scale,
                             window, softcap)
        return out.to(q.dtype)
    # Mixed lengths: padding everything to the longest could cost b x longest rows of K/V (one 8k request
    # among 63 short ones is ~60x the real work); groups bound the padding at 2x their tokens.
    o = torch.empty_like(q)
    for idx in groups:
        sel = torch.tensor(idx, device=q.device)
        out = _decode_padded(q[sel], k_cache, v_cache, req_to_token, req_pool_indices[sel], seq_lens[sel],
                             lens[idx[0]], sm_scale, window, softcap)
        o[sel] = out.to(q.dtype)
    return o


def check_decode_attention_args(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
) -> None:
    """Raise ValueError naming the first bad argument of decode_attention (shapes, dtypes, devices)."""
    check_tensor("q", q, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("k_cache", k_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("v_cache", v_cache, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("req_to_token", req_to_token, 2, INDEX_DTYPES, last_dim_contiguous=True)
    check_tensor("req_pool_indices", req_pool_indices, 1, INDEX_DTYPES)
    check_tensor("seq_lens", seq_lens, 1, INDEX_DTYPES)
    check_same_device(
        q=q, k_cache=k_cache, v_cache=v_cache, req_to_token=req_to_token,
        req_pool_indices=req_pool_indices, seq_lens=seq_lens,
    )
    check_same_dtype(k_cache=k_cache, v_cache=v_cache)  # q may differ: 16-bit caches are read as q's dtype
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache shape {tuple(v_cache.shape)} must equal k_cache shape {tuple(k_cache.shape)}")
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    check_dim("k_cache", k_cache.shape[2], head_dim, "dim 2 (head_dim, = q.shape[2])")
    if kv_heads == 0 or heads % kv_heads != 0:
        raise ValueError(f"q heads ({heads}) must be a multiple of kv_heads ({kv_heads})")
    check_dim("req_pool_indices", req_pool_indices.shape[0], b, "length (batch, = q.shape[0])")
    check_dim("seq_lens", seq_lens.shape[0], b, "length (batch, = q.shape[0])")


def _check_seq_len_values(seq_lens: torch.Tensor, max_context: int) -> None:
    lo, hi = int(seq_lens.min()), int(seq_lens.max())
    if lo < 1:
        raise ValueError(f"seq_lens must be >= 1 (the new token is already stored), got min {lo}")
    if hi > max_context:
        raise ValueError(f"seq_lens must be <= req_to_token.shape[1] ({max_context}), got max {hi}")


def decode_attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Attention of each request's single new query over its first seq_lens[i] cached tokens (its last `window` of
    them when window > 0, scores soft-capped when softcap > 0); returns o like q.

    CUDA: the Triton kernel. CPU: the native kernel (kernels/cpu_native.py) when it is built and can read these
    tensors, else the torch reference."""
    check_decode_attention_args(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens)
    window, softcap = window_softcap(window, softcap)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    impl = triton_module("decode_attention_triton", q)
    if impl is None:
        lib = native_lib() if q.device.type == "cpu" else None
        if lib is not None and supports(q, k_cache, v_cache, req_to_token):
            return decode_attention_cpu(lib, q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                        window, softcap)
        # Value checks cost a host sync, so only the reference path (CPU, or CUDA without Triton) makes them.
        _check_seq_len_values(seq_lens, req_to_token.shape[1])
        return decode_attention_reference(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                          window, softcap)
    with on_device(q):
        return impl.decode_attention_triton(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, sm_scale,
                                            window=window, softcap=softcap)

"""Extend (prefill) attention: new tokens attend causally to themselves and to their cached prefix, optionally
within a sliding window and with soft-capped scores (kernels/decode_attention.py says how)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module
from .cpu_native import native_lib
from .decode_attention_cpu import supports  # the native attention kernels read the same layouts
from .extend_attention_cpu import extend_attention_cpu
from .decode_attention import gather_padded_kv, length_groups, masked_attention, window_softcap


SHORT_EXTEND = 32  # requests extending at most this many tokens are batched into one padded SDPA


def _extend_short_padded(q, k_cache, v_cache, req_to_token, rows, prefix, ext, sm_scale, window=0, softcap=0.0):
    """One padded, masked SDPA for a group of short extends (jump-forward appends, short prompts)."""
    # q: [sum(ext), heads, head_dim] packed for this group only; returns o of the same shape
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    b, max_ext = len(ext), max(ext)
    dev = q.device
    ext_t = torch.tensor(ext, device=dev)
    seq = torch.tensor(prefix, device=dev) + ext_t  # [b]
    max_len = int(seq.max())
    starts = torch.cumsum(ext_t, 0) - ext_t
    j = torch.arange(max_ext, device=dev)
    q_valid = j[None, :] < ext_t[:, None]  # [b, max_ext]
    q_idx = torch.where(q_valid, starts[:, None] + j[None, :], torch.zeros_like(q_valid, dtype=torch.long))
    qp = q.to(torch.float32)[q_idx.reshape(-1)].view(b, max_ext, kv_heads, group, head_dim)
    qp = qp.permute(0, 2, 3, 1, 4).reshape(b, kv_heads, group * max_ext, head_dim)
    k, v, k_valid = gather_padded_kv(k_cache, v_cache, req_to_token, torch.tensor(rows, device=dev), seq, max_len)
    pos = torch.arange(max_len, device=dev)
    # query j of request i sits at absolute position prefix_i + j and sees keys 0..prefix_i + j
    q_pos = (seq - ext_t)[:, None] + j[None, :]  # [b, max_ext]
    mask = (pos[None, None, :] <= q_pos[:, :, None]) & k_valid[:, None, :]  # [b, max_ext, max_len]
    if window:
        mask &= pos[None, None, :] > q_pos[:, :, None] - window
    mask = mask.repeat(1, group, 1)[:, None]  # rows ordered (group, j): [b, 1, group * max_ext, max_len]
    o = masked_attention(qp, k, v, mask, sm_scale, softcap)
    o = o.reshape(b, kv_heads, group, max_ext, head_dim).permute(0, 3, 1, 2, 4).reshape(b, max_ext, heads, head_dim)
    return o[q_valid].to(q.dtype)


def extend_attention_reference(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Pure-torch extend attention: one float32 SDPA per request with a causal-with-prefix mask (and window)."""
    # q: [sum(extend_lens), heads, head_dim] packed request by request; returns o of the same shape
    window, softcap = window_softcap(window, softcap)
    n, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    out = torch.empty_like(q)
    rows_l, prefix_l, ext_l = req_pool_indices.tolist(), prefix_lens.tolist(), extend_lens.tolist()
    short = [i for i, e in enumerate(ext_l) if 0 < e <= SHORT_EXTEND]
    if len(short) > 1:
        # many short extends: one padded SDPA per length group instead of one call per request
        starts = [0] * len(ext_l)
        for i in range(1, len(ext_l)):
            starts[i] = starts[i - 1] + ext_l[i - 1]
        for grp in length_groups([prefix_l[i] + ext_l[i] for i in short]):
            idx = [short[g] for g in grp]
            tok = torch.cat([torch.arange(starts[i], starts[i] + ext_l[i], device=q.device) for i in idx])
            out[tok] = _extend_short_padded(q[tok], k_cache, v_cache, req_to_token, [rows_l[i] for i in idx],
                                            [prefix_l[i] for i in idx], [ext_l[i] for i in idx], sm_scale,
                                            window, softcap)
        done = set(short)
    else:
        done = set()
    start = 0
    for i, (row, prefix, ext) in enumerate(zip(rows_l, prefix_l, ext_l)):
        if ext == 0 or i in done:
            start += ext
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
        if prefix == 0 and not window and not softcap:
            # expand (stride 0, no copy) rather than rely on SDPA broadcasting, which not every backend does.
            shape = (kv_heads, group, total, head_dim)
            o = F.scaled_dot_product_attention(qi.view(kv_heads, group, ext, head_dim), k[:, None].expand(shape),
                                               v[:, None].expand(shape), is_causal=True, scale=sm_scale)
        else:
            # Query j sits at absolute position prefix + j and sees keys 0..prefix + j.
            pos_q = prefix + torch.arange(ext, device=q.device)
            pos_k = torch.arange(total, device=q.device)[None, :]
            mask = pos_k <= pos_q[:, None]  # [ext, total]
            if window:
                mask &= pos_k > pos_q[:, None] - window
            o = masked_attention(qi, k, v, mask.repeat(group, 1), sm_scale, softcap)
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
    check_same_dtype(k_cache=k_cache, v_cache=v_cache)  # q may differ: 16-bit caches are read as q's dtype
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
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """Causal attention of each request's new tokens over its prefix and themselves (within `window` keys when
    window > 0, scores soft-capped when softcap > 0); returns o like q.
    CUDA: Triton; CPU: the native kernel (kernels/cpu_native.py) when built, else the torch reference."""
    check_extend_attention_args(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    window, softcap = window_softcap(window, softcap)
    max_extend = check_extend_len_values(q.shape[0], prefix_lens, extend_lens, req_to_token.shape[1])
    if q.shape[0] == 0:
        return torch.empty_like(q)
    return _route(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale,
                  max_extend, window, softcap)


def _route(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale, max_extend,
           window=0, softcap=0.0):
    """CUDA -> Triton; CPU -> the native kernel when built and able to read these tensors; else the reference."""
    impl = triton_module("extend_attention_triton", q)
    args = (q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale)
    if impl is None:
        lib = native_lib() if q.device.type == "cpu" else None
        if lib is not None and supports(q, k_cache, v_cache, req_to_token):
            return extend_attention_cpu(lib, *args, window, softcap)
        return extend_attention_reference(*args, window, softcap)
    with on_device(q):
        return impl.extend_attention_triton(*args, max_extend=max_extend, window=window, softcap=softcap)


def extend_attention_planned(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
    max_extend: int,
    window: int | None = None,
    softcap: float | None = None,
) -> torch.Tensor:
    """extend_attention for a caller that built the lengths on the host and passes max(extend_lens).

    Shapes are checked, values are not: the runtime's own metadata, so a prefill step does not sync with
    the host once per layer (which would stall overlap scheduling on CUDA).
    """
    check_extend_attention_args(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens)
    window, softcap = window_softcap(window, softcap)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    return _route(q, k_cache, v_cache, req_to_token, req_pool_indices, prefix_lens, extend_lens, sm_scale,
                  max_extend, window, softcap)

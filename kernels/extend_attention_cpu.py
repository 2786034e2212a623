"""Native CPU extend (prefill) attention (csrc/extend_attention.cpp): causal over each request's prefix and new
tokens, K/V read in place through req_to_token, one call per layer; extend_attention_reference is its oracle."""

from __future__ import annotations

import ctypes

import torch

from .cpu_native import DTYPE_CODES
from .decode_attention_cpu import rejection


def extend_attention_cpu(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         req_to_token: torch.Tensor, rows: torch.Tensor, prefix_lens: torch.Tensor,
                         extend_lens: torch.Tensor, sm_scale: float, window: int = 0,
                         softcap: float = 0.0) -> torch.Tensor:
    """o [n, heads, head_dim] in q.dtype for q packed request by request (n = sum(extend_lens)). Bad lengths, rows
    or slot ids raise ValueError (checked by the kernel before or while reading; nothing is read out of bounds).
    window > 0: a query at position p sees keys (p - window, p]; softcap > 0: scores -> tanh(s / softcap) * softcap."""
    # q: [n, heads, d]; k_cache, v_cache: [slots, kv_heads, d]; rows, prefix_lens, extend_lens: [b]
    n = q.shape[0]
    rows, prefix, ext = (t.to(torch.int64).contiguous() for t in (rows, prefix_lens, extend_lens))
    start = torch.cumsum(ext, 0) - ext
    total = int(ext.sum()) if ext.numel() else 0
    if total != n or (ext.numel() and int(ext.min()) < 0):
        raise ValueError(f"sum(extend_lens) ({total}) must equal q.shape[0] ({n}), every length >= 0")
    return extend_attention_cpu_packed(lib, q, k_cache, v_cache, req_to_token, rows, prefix, ext, start, sm_scale,
                                       window, softcap)


def extend_attention_cpu_packed(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                                req_to_token: torch.Tensor, rows: torch.Tensor, prefix: torch.Tensor,
                                ext: torch.Tensor, start: torch.Tensor, sm_scale: float, window: int = 0,
                                softcap: float = 0.0) -> torch.Tensor:
    """extend_attention_cpu for metadata already int64 and contiguous, with each request's first q row (`start`)
    given and sum(ext) == q.shape[0] known (a decode step's one-token extends: planned once per forward)."""
    # q: [n, heads, d]; rows, prefix, ext, start: int64 [b]
    n, heads, d = q.shape
    in_place = q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == d
    qf = q if in_place else q.to(torch.float32).contiguous()
    out = torch.empty((n, heads, d), dtype=torch.float32)
    args = (qf.data_ptr(), qf.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), DTYPE_CODES[k_cache.dtype],
            k_cache.shape[0], k_cache.stride(0), req_to_token.data_ptr(), req_to_token.shape[0], req_to_token.shape[1],
            rows.data_ptr(), prefix.data_ptr(), ext.data_ptr(), start.data_ptr(), out.data_ptr(), rows.shape[0], heads,
            k_cache.shape[1], d, sm_scale)
    if window or softcap:
        rc = lib.sglpy_extend_attention_windowed(*args, window, softcap, torch.get_num_threads())
    else:
        rc = lib.sglpy_extend_attention(*args, torch.get_num_threads())
    if rc != 0:
        raise ValueError(rejection(
            rc, "extend", rows, k_cache.shape[0], req_to_token.shape, lambda i: int(prefix[i]) + int(ext[i]),
            lambda i: f"prefix_lens[{i}] + extend_lens[{i}] = {int(prefix[i])} + {int(ext[i])} must lie in "
                      f"[0, {req_to_token.shape[1]}]"))
    return out if q.dtype == torch.float32 else out.to(q.dtype)

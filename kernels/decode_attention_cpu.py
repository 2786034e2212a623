"""Native CPU decode attention (csrc/decode_attention.cpp): reads K/V in place through req_to_token, one call per
layer for the whole batch; decode_attention_reference is its oracle."""

from __future__ import annotations

import ctypes

import torch

from .cpu_native import DTYPE_CODES, pool_readable

_PROBLEMS = ("slot", "len", "row")  # = enum Problem in csrc/decode_attention.cpp and csrc/extend_attention.cpp


def supports(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, req_to_token: torch.Tensor) -> bool:
    """True when the native attention kernels (decode and extend) can read these tensors as they are (a pool
    pool_readable reads, head_dim a multiple of 16 up to 256, an int32 contiguous req_to_token on CPU); otherwise
    the reference runs."""
    d = k_cache.shape[2]
    return (q.device.type == "cpu" and q.dtype in DTYPE_CODES and pool_readable(k_cache, v_cache)
            and d % 16 == 0 and 0 < d <= 256 and req_to_token.device.type == "cpu"
            and req_to_token.dtype == torch.int32 and req_to_token.is_contiguous())


def decode_attention_cpu(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
                         req_to_token: torch.Tensor, rows: torch.Tensor, lens: torch.Tensor,
                         sm_scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """o [b, heads, head_dim] in q.dtype; rows, lens: int64 [b]. Bad lengths, rows or slot ids raise ValueError
    (checked by the kernel before or while reading; nothing is read out of bounds). window > 0: each request reads
    its last `window` keys only; softcap > 0: scores -> tanh(s / softcap) * softcap (both checked by the caller)."""
    # q: [b, heads, d]; k_cache, v_cache: [slots, kv_heads, d]; req_to_token: [max_reqs, max_context] int32
    b, heads, d = q.shape
    # read in place when each row's heads are contiguous (e.g. q as a view of a fused qkv projection)
    in_place = q.dtype == torch.float32 and q.stride(2) == 1 and q.stride(1) == d
    qf = q if in_place else q.to(torch.float32).contiguous()
    rows = rows if rows.dtype == torch.int64 and rows.is_contiguous() else rows.to(torch.int64).contiguous()
    lens = lens if lens.dtype == torch.int64 and lens.is_contiguous() else lens.to(torch.int64).contiguous()
    out = torch.empty((b, heads, d), dtype=torch.float32)
    args = (qf.data_ptr(), qf.stride(0), k_cache.data_ptr(), v_cache.data_ptr(), DTYPE_CODES[k_cache.dtype],
            k_cache.shape[0], k_cache.stride(0), req_to_token.data_ptr(), req_to_token.shape[0], req_to_token.shape[1],
            rows.data_ptr(), lens.data_ptr(), out.data_ptr(), b, heads, k_cache.shape[1], d, sm_scale)
    if window or softcap:
        rc = lib.sglpy_decode_attention_windowed(*args, window, softcap, torch.get_num_threads())
    else:
        rc = lib.sglpy_decode_attention(*args, torch.get_num_threads())
    if rc != 0:
        raise ValueError(rejection(rc, "decode", rows, k_cache.shape[0], req_to_token.shape, lambda i: int(lens[i]),
                                   lambda i: f"seq_lens[{i}] = {int(lens[i])} must lie in [1, {req_to_token.shape[1]}]"))
    return out if q.dtype == torch.float32 else out.to(q.dtype)


def rejection(rc: int, kernel: str, rows: torch.Tensor, num_slots: int, table: torch.Size, keys, bad_len) -> str:
    """The message for an attention kernel's nonzero return code (1 + 4 i + problem, or -1): keys(i) is how many
    req_to_token entries request i reads, bad_len(i) names its bad lengths."""
    if rc < 0:
        return f"{kernel} attention: unsupported K/V dtype (code {rc})"
    i, kind = divmod(rc - 1, 4)
    what = _PROBLEMS[kind]
    if what == "len":
        return f"{bad_len(i)} (req_to_token.shape[1])"
    if what == "row":
        return f"req_pool_indices[{i}] = {int(rows[i])} must lie in [0, {table[0]}) (req_to_token.shape[0])"
    return (f"request {i} (row {int(rows[i])}) has a slot id outside [0, {num_slots}) among its first "
            f"{keys(i)} req_to_token entries")

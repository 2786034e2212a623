"""Triton extend (prefill) attention over paged K/V with a causal-with-prefix mask; imported lazily.

A sliding window starts each block of queries at its first query's first key and masks keys before each row's
window; soft-capping maps scaled scores s to tanh(s / softcap) * softcap. Both are per-layer launch constants
(constexpr flags: without them the kernel compiles to what it was before)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .decode_attention_triton import soft_cap

_LOG2E = 1.4426950408889634


@triton.jit
def _extend_kernel(
    Q, KCache, VCache, O, ReqToToken, ReqPool, PrefixLens, ExtendLens, QStart,
    sm_scale_log2,
    stride_q_t, stride_q_h, stride_o_t, stride_o_h,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_r2t,
    group, head_dim, window, softcap,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    """One (request, query head, block of new tokens) per program; K/V of prefix and new tokens come via slots."""
    bid = tl.program_id(0)
    h = tl.program_id(1)
    mblk = tl.program_id(2)
    ext = tl.load(ExtendLens + bid).to(tl.int32)
    if mblk * BLOCK_M < ext:
        prefix = tl.load(PrefixLens + bid).to(tl.int32)
        row = tl.load(ReqPool + bid).to(tl.int64)
        q_start = tl.load(QStart + bid).to(tl.int64)
        kvh = h // group
        offs_m = mblk * BLOCK_M + tl.arange(0, BLOCK_M)
        mask_m = offs_m < ext
        offs_d = tl.arange(0, BLOCK_D)
        mask_d = offs_d < head_dim
        q = tl.load(Q + (q_start + offs_m)[:, None] * stride_q_t + h * stride_q_h + offs_d[None, :],
                    mask=mask_m[:, None] & mask_d[None, :], other=0.0)
        q_pos = prefix + offs_m  # absolute positions of this block's queries
        if HAS_WINDOW:  # rows past the extend (never stored) take the last row's window, so none sees no key
            q_pos = prefix + tl.minimum(offs_m, ext - 1)
        # Keys beyond the block's last query are invisible to every row in it.
        end = prefix + tl.minimum((mblk + 1) * BLOCK_M, ext)
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        lo = 0
        if HAS_WINDOW:  # the block's first query sees keys from prefix + mblk * BLOCK_M - window + 1 on
            lo = tl.maximum(prefix + mblk * BLOCK_M - window + 1, 0)
        for n0 in range(lo, end, BLOCK_N):
            offs_n = n0 + tl.arange(0, BLOCK_N)
            mask_n = offs_n < end
            slot = tl.load(ReqToToken + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
            kv_mask = mask_n[:, None] & mask_d[None, :]
            # K/V tiles take q's dtype (a 16-bit KV cache under float32 queries is converted while reading).
            k = tl.load(KCache + slot[:, None] * stride_k_t + kvh * stride_k_h + offs_d[None, :],
                        mask=kv_mask, other=0.0).to(Q.dtype.element_ty)
            if HAS_SOFTCAP:  # the cap bounds the scaled score (sm_scale_log2 / log2(e)), before exp2's base
                qk = soft_cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION)
                              * (sm_scale_log2 / 1.4426950408889634), softcap) * 1.4426950408889634
            else:
                qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_M, BLOCK_N]
            visible = mask_n[None, :] & (offs_n[None, :] <= q_pos[:, None])
            if HAS_WINDOW:
                visible = visible & (offs_n[None, :] > q_pos[:, None] - window)
            qk = tl.where(visible, qk, float("-inf"))
            # Block 0 holds position 0, visible to every row, so m is finite from the first iteration on. With a
            # window, row r's first key is key r of the first tile (BLOCK_M <= BLOCK_N): the same holds.
            m_new = tl.maximum(m, tl.max(qk, 1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(qk - m_new[:, None])
            l = l * alpha + tl.sum(p, 1)
            v = tl.load(VCache + slot[:, None] * stride_v_t + kvh * stride_v_h + offs_d[None, :],
                        mask=kv_mask, other=0.0).to(Q.dtype.element_ty)
            acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
            m = m_new
        out = (acc / l[:, None]).to(O.dtype.element_ty)
        tl.store(O + (q_start + offs_m)[:, None] * stride_o_t + h * stride_o_h + offs_d[None, :], out,
                 mask=mask_m[:, None] & mask_d[None, :])


def default_block(head_dim: int, elem_bytes: int) -> int:
    """BLOCK_M = BLOCK_N that keeps the Q/K/V tiles within 99 KiB of shared memory (sm_86/89 limit)."""
    return 64 if head_dim * elem_bytes <= 256 else 32


def extend_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    sm_scale: float,
    block_m: int | None = None,
    block_n: int | None = None,
    max_extend: int | None = None,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Launch the extend kernel; arguments already checked by extend_attention.extend_attention.
    window > 0: a query at position p sees keys (p - window, p]; softcap > 0: scores -> tanh(s / softcap) * softcap."""
    # q: [sum(extend_lens), heads, head_dim] packed by request; returns o of the same shape
    # The kernel reads 1-D metadata as Ptr + i; these are no-ops for the runtime's own tensors.
    req_pool_indices = req_pool_indices.contiguous()
    prefix_lens, extend_lens = prefix_lens.contiguous(), extend_lens.contiguous()
    n, heads, head_dim = q.shape
    b = extend_lens.shape[0]
    group = heads // k_cache.shape[1]
    q_start = torch.cumsum(extend_lens, 0) - extend_lens  # exclusive prefix sum, on device
    if max_extend is None:  # the wrapper passes it from its own (single) host sync
        max_extend = int(extend_lens.max())
    block = default_block(head_dim, q.element_size())
    block_m, block_n = block_m or block, block_n or block
    if window > 0 and block_m > block_n:
        raise ValueError(f"a window needs block_m <= block_n (each row's first key in the first tile), got "
                         f"{block_m} > {block_n}")
    block_d = max(16, triton.next_power_of_2(head_dim))
    o = torch.empty_like(q)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _extend_kernel[(b, heads, triton.cdiv(max_extend, block_m))](
        q, k_cache, v_cache, o, req_to_token, req_pool_indices, prefix_lens, extend_lens, q_start,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1), o.stride(0), o.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0),
        group, head_dim, int(window), float(softcap),
        BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_D=block_d, DOT_PRECISION=precision,
        HAS_WINDOW=window > 0, HAS_SOFTCAP=softcap > 0,
    )
    return o

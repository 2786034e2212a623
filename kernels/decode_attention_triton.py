"""Triton split-K decode attention over paged K/V (GQA-aware); imported lazily (this module imports triton).

A sliding window reads each request's last `window` keys only (its splits cover just those); soft-capping maps each
scaled score s to tanh(s / softcap) * softcap. Both are per-layer constants of the launch (no host reads: the step
can be captured in a CUDA graph); without them the kernel compiles to what it was before (constexpr flags)."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

_LOG2E = 1.4426950408889634


@triton.jit
def soft_cap(s, softcap):
    """softcap * tanh(s / softcap) from exp2 (the interpreter has no tanh): e = exp(-2|x|) in (0, 1], no overflow."""
    x = s / softcap
    e = tl.exp2(-2.8853900817779268 * tl.abs(x))  # 2 * log2(e)
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t) * softcap


@triton.jit
def _key_range(seq_len, sid, num_splits, fixed_split, window, BLOCK_N: tl.constexpr, HAS_WINDOW: tl.constexpr):
    """Keys [start, end) of split sid, and the first split holding any key (0 without a window)."""
    first = 0
    span = seq_len
    if HAS_WINDOW:
        first = tl.maximum(seq_len - window, 0)
        span = seq_len - first
    # Each request cuts its own (windowed) length into num_splits pieces (aligned to BLOCK_N): no host sync on
    # lengths. At least one tile, so an (invalid, unchecked on CUDA) zero length yields NaN rather than a division
    # by 0.
    split_len = tl.maximum(tl.cdiv(tl.cdiv(span, num_splits), BLOCK_N), 1) * BLOCK_N
    # every name this runtime `if` sets is set in both branches as a tensor (the compiler merges only those)
    if fixed_split > 0:  # deterministic inference: split points at multiples of fixed_split, whatever the batch
        split_len = fixed_split
        start = sid * split_len
        end = tl.minimum(start + split_len, seq_len)
        first_split = start * 0
        if HAS_WINDOW:
            first_split = first // split_len
            start = tl.maximum(start, first)
        used = tl.cdiv(seq_len, split_len)
    else:
        start = first + sid * split_len
        end = tl.minimum(start + split_len, seq_len)
        first_split = start * 0
        used = tl.cdiv(span, split_len)
    return start, end, first_split, used


@triton.jit
def _decode_split_kernel(
    Q, KCache, VCache, ReqToToken, ReqPool, SeqLens, MidO, MidLse,
    sm_scale_log2,
    stride_q_b, stride_q_h,
    stride_k_t, stride_k_h, stride_v_t, stride_v_h,
    stride_r2t,
    stride_mo_b, stride_mo_h, stride_mo_s,
    stride_ml_b, stride_ml_h,
    group, head_dim, num_splits, fixed_split, window, softcap,
    BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, DOT_PRECISION: tl.constexpr,
    HAS_WINDOW: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
):
    """Stage 1: one (request, kv head, split) per program; all query heads of the group share each K/V tile."""
    bid = tl.program_id(0)
    kvh = tl.program_id(1)
    sid = tl.program_id(2)
    row = tl.load(ReqPool + bid).to(tl.int64)
    seq_len = tl.load(SeqLens + bid).to(tl.int32)
    start, end, _, _ = _key_range(seq_len, sid, num_splits, fixed_split, window, BLOCK_N, HAS_WINDOW)

    offs_g = tl.arange(0, BLOCK_H)
    offs_h = kvh * group + offs_g
    mask_h = offs_g < group
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    q = tl.load(Q + bid * stride_q_b + offs_h[:, None] * stride_q_h + offs_d[None, :],
                mask=mask_h[:, None] & mask_d[None, :], other=0.0)

    m = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], dtype=tl.float32)
    for n0 in range(start, end, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        mask_n = offs_n < end
        slot = tl.load(ReqToToken + row * stride_r2t + offs_n, mask=mask_n, other=0).to(tl.int64)
        kv_mask = mask_n[:, None] & mask_d[None, :]
        # K/V tiles take q's dtype: a 16-bit KV cache under float32 queries is converted here, while reading.
        k = tl.load(KCache + slot[:, None] * stride_k_t + kvh * stride_k_h + offs_d[None, :], mask=kv_mask,
                    other=0.0).to(Q.dtype.element_ty)
        if HAS_SOFTCAP:  # sm_scale_log2 / log2(e) = sm_scale: the cap bounds the scaled score, before exp2's base
            qk = soft_cap(tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * (sm_scale_log2 / 1.4426950408889634),
                          softcap) * 1.4426950408889634
        else:
            qk = tl.dot(q, tl.trans(k), input_precision=DOT_PRECISION) * sm_scale_log2  # [BLOCK_H, BLOCK_N]
        qk = tl.where(mask_n[None, :], qk, float("-inf"))
        m_new = tl.maximum(m, tl.max(qk, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(qk - m_new[:, None])
        l = l * alpha + tl.sum(p, 1)
        v = tl.load(VCache + slot[:, None] * stride_v_t + kvh * stride_v_h + offs_d[None, :], mask=kv_mask,
                    other=0.0).to(Q.dtype.element_ty)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m = m_new
    if end > start:
        mo = MidO + bid * stride_mo_b + offs_h[:, None] * stride_mo_h + sid * stride_mo_s + offs_d[None, :]
        tl.store(mo, acc / l[:, None], mask=mask_h[:, None] & mask_d[None, :])
        tl.store(MidLse + bid * stride_ml_b + offs_h * stride_ml_h + sid, m + tl.log2(l), mask=mask_h)


@triton.jit
def _decode_merge_kernel(
    MidO, MidLse, O, SeqLens,
    stride_mo_b, stride_mo_h, stride_mo_s,
    stride_ml_b, stride_ml_h,
    stride_o_b, stride_o_h,
    head_dim, num_splits, fixed_split, window,
    BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, HAS_WINDOW: tl.constexpr,
):
    """Stage 2: merge the non-empty splits of one (request, head) by their log-sum-exp weights."""
    bid = tl.program_id(0)
    h = tl.program_id(1)
    seq_len = tl.load(SeqLens + bid).to(tl.int32)
    _, _, first_split, used = _key_range(seq_len, 0, num_splits, fixed_split, window, BLOCK_N, HAS_WINDOW)
    offs_d = tl.arange(0, BLOCK_D)
    mask_d = offs_d < head_dim
    m = float("-inf")
    l = 0.0
    acc = tl.zeros([BLOCK_D], dtype=tl.float32)
    for sid in range(first_split, used):
        lse = tl.load(MidLse + bid * stride_ml_b + h * stride_ml_h + sid)
        o = tl.load(MidO + bid * stride_mo_b + h * stride_mo_h + sid * stride_mo_s + offs_d, mask=mask_d, other=0.0)
        m_new = tl.maximum(m, lse)
        alpha = tl.exp2(m - m_new)
        w = tl.exp2(lse - m_new)
        acc = acc * alpha + w * o
        l = l * alpha + w
        m = m_new
    tl.store(O + bid * stride_o_b + h * stride_o_h + offs_d, (acc / l).to(O.dtype.element_ty), mask=mask_d)


@functools.lru_cache(maxsize=None)
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_num_splits(batch: int, kv_heads: int, max_context: int, block_n: int, sm_count: int) -> int:
    """Enough splits to give every SM ~4 programs, capped by the table width; depends on no lengths (graph-safe)."""
    want = triton.cdiv(4 * sm_count, max(batch * kv_heads, 1))
    return max(1, min(want, 32, triton.cdiv(max_context, block_n)))


def fixed_split_len(max_context: int, block_n: int = 64) -> int:
    """Deterministic inference's split length: a multiple of block_n fixed by the table width alone (>= 256 keys,
    at most 64 splits), so a request's split points never depend on its batch."""
    per = triton.cdiv(triton.cdiv(max_context, 64), block_n) * block_n
    return max(256, per)


def decode_attention_triton(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    sm_scale: float,
    num_splits: int | None = None,
    block_n: int = 64,
    batch_invariant: bool = False,
    window: int = 0,
    softcap: float = 0.0,
) -> torch.Tensor:
    """Launch split + merge; arguments already checked by decode_attention.decode_attention.
    batch_invariant: fixed split points (fixed_split_len), the same for any batch (deterministic inference).
    window > 0: each request's last `window` keys only; softcap > 0: scores -> tanh(s / softcap) * softcap."""
    # q: [b, heads, head_dim]; caches: [slots, kv_heads, head_dim]; returns o: [b, heads, head_dim]
    # The kernels read 1-D metadata as Ptr + i; these are no-ops for the runtime's own tensors.
    req_pool_indices, seq_lens = req_pool_indices.contiguous(), seq_lens.contiguous()
    b, heads, head_dim = q.shape
    kv_heads = k_cache.shape[1]
    group = heads // kv_heads
    block_d = max(16, triton.next_power_of_2(head_dim))
    block_h = max(16, triton.next_power_of_2(group))  # tl.dot needs M >= 16
    fixed = 0
    if batch_invariant:
        fixed = fixed_split_len(req_to_token.shape[1], block_n)
        num_splits = triton.cdiv(req_to_token.shape[1], fixed)
    elif num_splits is None:
        sms = _sm_count(q.device.index or 0) if q.is_cuda else 132
        num_splits = choose_num_splits(b, kv_heads, req_to_token.shape[1], block_n, sms)
    mid_o = torch.empty(b, heads, num_splits, head_dim, dtype=torch.float32, device=q.device)
    mid_lse = torch.empty(b, heads, num_splits, dtype=torch.float32, device=q.device)
    o = torch.empty_like(q)
    precision = "ieee" if q.dtype == torch.float32 else "tf32"
    _decode_split_kernel[(b, kv_heads, num_splits)](
        q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, mid_o, mid_lse,
        sm_scale * _LOG2E,
        q.stride(0), q.stride(1),
        k_cache.stride(0), k_cache.stride(1), v_cache.stride(0), v_cache.stride(1),
        req_to_token.stride(0),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        group, head_dim, num_splits, fixed, int(window), float(softcap),
        BLOCK_H=block_h, BLOCK_N=block_n, BLOCK_D=block_d, DOT_PRECISION=precision,
        HAS_WINDOW=window > 0, HAS_SOFTCAP=softcap > 0,
    )
    _decode_merge_kernel[(b, heads)](
        mid_o, mid_lse, o, seq_lens,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        mid_lse.stride(0), mid_lse.stride(1),
        o.stride(0), o.stride(1),
        head_dim, num_splits, fixed, int(window),
        BLOCK_N=block_n, BLOCK_D=block_d, HAS_WINDOW=window > 0,
    )
    return o

"""Triton segmented LoRA: one shrink launch (every segment's rows times its adapter's A, all slices) and one expand
launch per output slice (adds h B^T into y in place); imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .lora import LoraSegments


@triton.jit
def _shrink_kernel(
    X, A, H, Rows, Indptr, Slots, Ranks,
    n_in, pool_rank, n_cols,
    stride_x, stride_as, stride_ar, stride_h,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # one program: one segment x BLOCK_N columns of h (slices * R); loops over the segment's rows
    seg = tl.program_id(0)
    pid_n = tl.program_id(1)
    start = tl.load(Indptr + seg)
    end = tl.load(Indptr + seg + 1)
    slot = tl.load(Slots + seg).to(tl.int64)
    rank = tl.load(Ranks + seg)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = (offs_n < n_cols) & (offs_n % pool_rank < rank)  # the padding past an adapter's rank is never read
    offs_k = tl.arange(0, BLOCK_K)
    a_base = A + slot * stride_as
    for m0 in range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < end
        rows = tl.load(Rows + offs_m, mask=row_ok, other=0).to(tl.int64)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k0 in range(0, n_in, BLOCK_K):
            k_ok = k0 + offs_k < n_in
            xb = tl.load(X + rows[:, None] * stride_x + (k0 + offs_k)[None, :], mask=row_ok[:, None] & k_ok[None, :],
                         other=0.0)
            ab = tl.load(a_base + offs_n[None, :] * stride_ar + (k0 + offs_k)[:, None],
                         mask=k_ok[:, None] & col_ok[None, :], other=0.0)
            acc = tl.dot(xb, ab, acc, input_precision=DOT_PRECISION)
        tl.store(H + offs_m[:, None] * stride_h + offs_n[None, :], acc.to(H.dtype.element_ty),
                 mask=row_ok[:, None] & (offs_n < n_cols)[None, :])


@triton.jit
def _expand_kernel(
    H, B, Y, Rows, Indptr, Slots, Ranks,
    h_col0, out_col0, out_size,
    stride_h, stride_bs, stride_br, stride_y,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_R: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # one program: one segment x BLOCK_N output columns of one slice; y[row] += h[pos, slice] @ Bt[slot, :, cols]
    seg = tl.program_id(0)
    pid_n = tl.program_id(1)
    start = tl.load(Indptr + seg)
    end = tl.load(Indptr + seg + 1)
    slot = tl.load(Slots + seg).to(tl.int64)
    rank = tl.load(Ranks + seg)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < out_size
    offs_r = tl.arange(0, BLOCK_R)
    r_ok = offs_r < rank
    bb = tl.load(B + slot * stride_bs + offs_r[:, None] * stride_br + (out_col0 + offs_n)[None, :],
                 mask=r_ok[:, None] & col_ok[None, :], other=0.0)  # [R, N]
    for m0 in range(start, end, BLOCK_M):
        offs_m = m0 + tl.arange(0, BLOCK_M)
        row_ok = offs_m < end
        rows = tl.load(Rows + offs_m, mask=row_ok, other=0).to(tl.int64)
        hb = tl.load(H + offs_m[:, None] * stride_h + (h_col0 + offs_r)[None, :], mask=row_ok[:, None] & r_ok[None, :],
                     other=0.0)
        acc = tl.dot(hb, bb, input_precision=DOT_PRECISION)
        yp = Y + rows[:, None] * stride_y + (out_col0 + offs_n)[None, :]
        mask = row_ok[:, None] & col_ok[None, :]
        y = tl.load(yp, mask=mask, other=0.0).to(tl.float32)
        tl.store(yp, (y + acc.to(Y.dtype.element_ty).to(tl.float32)).to(Y.dtype.element_ty), mask=mask)


def _block(n: int, cap: int) -> int:
    return max(16, min(cap, triton.next_power_of_2(n)))


def lora_delta_triton(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, offsets: tuple[int, ...],
                      seg: LoraSegments) -> torch.Tensor:
    """y[rows] += the segments' LoRA deltas (lora.lora_delta's contract); h lives in row-sorted order."""
    n_rows, n_in = seg.rows.shape[0], x.shape[1]
    n_slices, pool_rank = len(offsets) - 1, bt.shape[1]
    n_cols = n_slices * pool_rank
    h = torch.empty((n_rows, n_cols), dtype=x.dtype, device=x.device)  # [n, slices * R]
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # float32 models stay float32 (no TF32 rounding)
    n_seg = len(seg.host_slots)
    bm = 16 if n_rows <= 16 * n_seg else 64  # decode-sized segments: less padding
    bn = _block(n_cols, 64)
    _shrink_kernel[(n_seg, triton.cdiv(n_cols, bn))](
        x, a, h, seg.rows, seg.indptr, seg.slots, seg.ranks,
        n_in, pool_rank, n_cols,
        x.stride(0), a.stride(0), a.stride(1), h.stride(0),
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=_block(n_in, 64), DOT_PRECISION=precision,
    )
    br = _block(pool_rank, 256)
    for s in range(n_slices):
        size = offsets[s + 1] - offsets[s]
        bn = _block(size, 64)
        _expand_kernel[(n_seg, triton.cdiv(size, bn))](
            h, bt, y, seg.rows, seg.indptr, seg.slots, seg.ranks,
            s * pool_rank, offsets[s], size,
            h.stride(0), bt.stride(0), bt.stride(1), y.stride(0),
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_R=br, DOT_PRECISION=precision,
        )
    return y

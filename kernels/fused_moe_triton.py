"""Triton fused MoE: token-expert pairs sorted by expert and padded per expert to BLOCK_M (fused_moe.align_pairs),
then one grouped-GEMM launch for gate_up with SiLU*up fused and one for down with the routing weight applied; the
top-k partial outputs are summed last. Imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .fused_moe import align_pairs


@triton.jit
def _gate_up_kernel(
    X, W, Inter, SortedPairs, BlockExperts,
    num_pairs, top_k, hidden, inter,
    stride_x, stride_we, stride_wn, stride_inter,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # one program: BLOCK_M pairs of one expert x BLOCK_N columns of its gate (and the matching up columns)
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(BlockExperts + pid_m).to(tl.int64)
    if expert < 0:
        return  # a block past the last expert's padded run
    pairs = tl.load(SortedPairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < num_pairs
    tokens = pairs // top_k
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < inter
    offs_k = tl.arange(0, BLOCK_K)
    w_base = W + expert * stride_we
    gate = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    up = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, hidden, BLOCK_K):
        k_ok = k0 + offs_k < hidden
        a = tl.load(X + tokens[:, None] * stride_x + (k0 + offs_k)[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        wmask = k_ok[:, None] & col_ok[None, :]
        wg = tl.load(w_base + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None], mask=wmask, other=0.0)
        wu = tl.load(w_base + (inter + offs_n)[None, :] * stride_wn + (k0 + offs_k)[:, None], mask=wmask, other=0.0)
        gate = tl.dot(a, wg, gate, input_precision=DOT_PRECISION)
        up = tl.dot(a, wu, up, input_precision=DOT_PRECISION)
    # round the projections to the input dtype first, as the reference's GEMM output is
    gate = gate.to(Inter.dtype.element_ty).to(tl.float32)
    up = up.to(Inter.dtype.element_ty).to(tl.float32)
    act = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(Inter + pairs[:, None] * stride_inter + offs_n[None, :], act.to(Inter.dtype.element_ty),
             mask=row_ok[:, None] & col_ok[None, :])


@triton.jit
def _down_kernel(
    Inter, W, Out, SortedPairs, BlockExperts, TopkWeights,
    num_pairs, hidden, inter,
    stride_inter, stride_we, stride_wn, stride_out,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, DOT_PRECISION: tl.constexpr,
):
    # one program: BLOCK_M pairs of one expert x BLOCK_N hidden columns, scaled by each pair's routing weight
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    expert = tl.load(BlockExperts + pid_m).to(tl.int64)
    if expert < 0:
        return
    pairs = tl.load(SortedPairs + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_ok = pairs < num_pairs
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    col_ok = offs_n < hidden
    offs_k = tl.arange(0, BLOCK_K)
    w_base = W + expert * stride_we
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, inter, BLOCK_K):
        k_ok = k0 + offs_k < inter
        a = tl.load(Inter + pairs[:, None] * stride_inter + (k0 + offs_k)[None, :],
                    mask=row_ok[:, None] & k_ok[None, :], other=0.0)
        w = tl.load(w_base + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None],
                    mask=k_ok[:, None] & col_ok[None, :], other=0.0)
        acc = tl.dot(a, w, acc, input_precision=DOT_PRECISION)
    # the reference rounds the down output and the weight to the dtype and rounds their product (torch multiplies
    # half types in float32): the same roundings here, the product taken in float32
    dt = Out.dtype.element_ty
    weight = tl.load(TopkWeights + pairs, mask=row_ok, other=0.0).to(dt).to(tl.float32)
    y = acc.to(dt).to(tl.float32) * weight[:, None]
    tl.store(Out + pairs[:, None] * stride_out + offs_n[None, :], y.to(dt), mask=row_ok[:, None] & col_ok[None, :])


def _block(n: int, cap: int) -> int:
    return max(16, min(cap, triton.next_power_of_2(n)))


def fused_moe_triton(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor,
                     topk_weights: torch.Tensor, block_m: int | None = None) -> torch.Tensor:
    """Launch the two grouped GEMMs; x: [tokens, hidden] -> [tokens, hidden] (block_m: 16 for decode-sized batches,
    64 for prefill)."""
    t, hidden = x.shape
    top_k = topk_ids.shape[1]
    experts, two_inter, _ = w_gate_up.shape
    inter = two_inter // 2
    num_pairs = t * top_k
    if block_m is None:
        block_m = 16 if num_pairs <= 4 * experts else 64  # few pairs per expert: less padding
    align = align_pairs(topk_ids, experts, block_m)
    blocks = align.block_experts.numel()
    inter_buf = torch.empty((num_pairs, inter), dtype=x.dtype, device=x.device)  # [pairs, inter]
    pair_out = torch.empty((num_pairs, hidden), dtype=x.dtype, device=x.device)  # [pairs, hidden]
    weights = topk_weights.reshape(-1).contiguous()
    precision = "ieee" if x.dtype == torch.float32 else "tf32"  # float32 models stay float32 (no TF32 rounding)
    bn, bk = _block(inter, 64), _block(hidden, 64)
    _gate_up_kernel[(blocks, triton.cdiv(inter, bn))](
        x, w_gate_up, inter_buf, align.sorted_pairs, align.block_experts,
        num_pairs, top_k, hidden, inter,
        x.stride(0), w_gate_up.stride(0), w_gate_up.stride(1), inter_buf.stride(0),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, DOT_PRECISION=precision,
    )
    bn, bk = _block(hidden, 64), _block(inter, 64)
    _down_kernel[(blocks, triton.cdiv(hidden, bn))](
        inter_buf, w_down, pair_out, align.sorted_pairs, align.block_experts, weights,
        num_pairs, hidden, inter,
        inter_buf.stride(0), w_down.stride(0), w_down.stride(1), pair_out.stride(0),
        BLOCK_M=block_m, BLOCK_N=bn, BLOCK_K=bk, DOT_PRECISION=precision,
    )
    return pair_out.view(t, top_k, hidden).sum(dim=1)  # [tokens, hidden]: the top-k experts' weighted outputs

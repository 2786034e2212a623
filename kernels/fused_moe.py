"""Fused mixture-of-experts feed-forward: each token's top-k experts (gate_up GEMM, SiLU*up, down GEMM) weighted by
the router and summed. Triton on CUDA (kernels/fused_moe_triton.py: token-expert pairs sorted by expert, one grouped
GEMM launch per projection), the torch reference elsewhere; both compute only the chosen experts."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, INDEX_DTYPES, check_dim, check_same_device, check_same_dtype, check_tensor
from ._dispatch import on_device, triton_module


class MoEAlignment(NamedTuple):
    """Token-expert pairs sorted by expert, each expert's run padded to a multiple of block_m.

    sorted_pairs [capacity]: pair index t * top_k + j, or num_pairs in padding slots; block_experts
    [capacity // block_m]: the expert of each block of block_m slots, -1 for blocks past the last used one."""

    sorted_pairs: torch.Tensor
    block_experts: torch.Tensor


def align_pairs(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> MoEAlignment:
    """Sort the [tokens, top_k] expert choices by expert, padding each expert's run to block_m (no host sync: the
    buffers are sized for the worst case, num_pairs + experts * (block_m - 1), so CUDA graphs can capture it)."""
    flat = topk_ids.reshape(-1).to(torch.int64)  # [pairs]
    pairs = flat.numel()
    capacity = -(-(pairs + num_experts * (block_m - 1)) // block_m) * block_m
    counts = torch.zeros(num_experts, dtype=torch.int64, device=flat.device).scatter_add_(
        0, flat, torch.ones_like(flat))  # [experts] (bincount would sync with the host on CUDA)
    padded = (counts + block_m - 1) // block_m * block_m
    starts = torch.cumsum(padded, 0) - padded  # each expert's first slot
    order = torch.argsort(flat, stable=True)  # pairs grouped by expert, in token order within one
    first_sorted = torch.cumsum(counts, 0) - counts  # each expert's first index in `order`
    expert_of_sorted = flat[order]
    slot = starts[expert_of_sorted] + torch.arange(pairs, device=flat.device) - first_sorted[expert_of_sorted]
    sorted_pairs = torch.full((capacity,), pairs, dtype=torch.int32, device=flat.device)
    sorted_pairs[slot] = order.to(torch.int32)
    # block b belongs to the expert whose padded run covers slot b * block_m
    block_start = torch.arange(0, capacity, block_m, device=flat.device)
    ends = torch.cumsum(padded, 0)
    block_experts = torch.searchsorted(ends, block_start, right=True).to(torch.int32)
    block_experts = torch.where(block_experts < num_experts, block_experts, -1)  # (a masked store would sync)
    return MoEAlignment(sorted_pairs, block_experts)


def fused_moe_reference(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor,
                        topk_weights: torch.Tensor) -> torch.Tensor:
    """Torch oracle: per chosen expert, its tokens through gate_up, SiLU*up, down, times the routing weight.

    x: [tokens, hidden]; w_gate_up: [experts, 2 inter, hidden]; w_down: [experts, hidden, inter];
    topk_ids, topk_weights: [tokens, top_k] -> [tokens, hidden]."""
    t, k = topk_ids.shape
    out = torch.zeros_like(x)
    if t == 0:
        return out
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    weights = topk_weights.reshape(-1).to(x.dtype)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue  # an expert no token chose is never read
        sel = order[start:start + c]
        start += c
        tok = sel // k
        gate, up = (x[tok] @ w_gate_up[e].t()).chunk(2, dim=-1)
        out.index_add_(0, tok, ((F.silu(gate) * up) @ w_down[e].t()) * weights[sel, None])
    return out


def check_fused_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights) -> None:
    """Raise ValueError naming the first bad argument of fused_moe."""
    check_tensor("x", x, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("w_gate_up", w_gate_up, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("w_down", w_down, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("topk_ids", topk_ids, 2, INDEX_DTYPES)
    check_tensor("topk_weights", topk_weights, 2, FLOAT_DTYPES)
    check_same_device(x=x, w_gate_up=w_gate_up, w_down=w_down, topk_ids=topk_ids, topk_weights=topk_weights)
    check_same_dtype(x=x, w_gate_up=w_gate_up, w_down=w_down)
    experts, two_inter, hidden = w_gate_up.shape
    check_dim("w_gate_up", hidden, x.shape[1], "dim 2 (hidden, = x.shape[1])")
    if two_inter % 2:
        raise ValueError(f"w_gate_up dim 1 must be even (gate and up halves), got {two_inter}")
    check_dim("w_down", w_down.shape[0], experts, "dim 0 (experts, = w_gate_up.shape[0])")
    check_dim("w_down", w_down.shape[1], hidden, "dim 1 (hidden, = x.shape[1])")
    check_dim("w_down", w_down.shape[2], two_inter // 2, "dim 2 (inter, = w_gate_up.shape[1] / 2)")
    check_dim("topk_ids", topk_ids.shape[0], x.shape[0], "dim 0 (tokens, = x.shape[0])")
    if topk_weights.shape != topk_ids.shape:
        raise ValueError(f"topk_weights shape {tuple(topk_weights.shape)} must equal topk_ids shape "
                         f"{tuple(topk_ids.shape)}")
    if topk_ids.numel() and (int(topk_ids.min()) < 0 or int(topk_ids.max()) >= experts):
        raise ValueError(f"topk_ids must lie in [0, {experts}), got [{int(topk_ids.min())}, {int(topk_ids.max())}]")


def fused_moe(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> torch.Tensor:
    """Each token through its top-k experts, weighted and summed: [tokens, hidden] -> [tokens, hidden]."""
    check_fused_moe_args(x, w_gate_up, w_down, topk_ids, topk_weights)
    return fused_moe_unchecked(x, w_gate_up, w_down, topk_ids, topk_weights)


def fused_moe_unchecked(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, topk_ids: torch.Tensor,
                        topk_weights: torch.Tensor) -> torch.Tensor:
    """fused_moe without the checks (the model's hot path: shapes fixed at load, ids from the router's top-k)."""
    impl = triton_module("fused_moe_triton", x)
    if impl is None or x.shape[0] == 0:
        return fused_moe_reference(x, w_gate_up, w_down, topk_ids, topk_weights)
    with on_device(x):
        return impl.fused_moe_triton(x, w_gate_up, w_down, topk_ids, topk_weights)

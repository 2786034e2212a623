"""Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): top-k routing with each model's renormalisation, and
a torch reference that runs only the chosen experts (tokens grouped per expert, one GEMM pair per active expert).

There is no fused MoE kernel yet (Triton or native CPU): this reference is the only path, float weights only.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels.activation import silu_and_mul


@dataclass(frozen=True)
class Routing:
    """Each token's chosen experts and their weights: ids, weights [tokens, top_k]."""

    ids: torch.Tensor
    weights: torch.Tensor


def route(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> Routing:
    """Softmax over all experts in float32, keep the top k, renormalise them to sum 1 when the model does."""
    probs = torch.softmax(router_logits, dim=-1, dtype=torch.float32)  # [tokens, experts]
    w, ids = torch.topk(probs, top_k, dim=-1)
    if renormalize:
        w = w / w.sum(dim=-1, keepdim=True)
    return Routing(ids, w.to(router_logits.dtype))


def moe_reference(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, routing: Routing) -> torch.Tensor:
    """x: [tokens, hidden]; w_gate_up: [experts, 2 inter, hidden]; w_down: [experts, hidden, inter] -> [tokens, hidden].

    Only experts some token chose are read (a decode step touches top_k experts per token, not all of them)."""
    t, k = routing.ids.shape
    out = torch.zeros_like(x)
    if t == 0:
        return out
    flat = routing.ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w_gate_up.shape[0]).tolist()
    weights = routing.weights.reshape(-1)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        sel = order[start:start + c]
        start += c
        tok = sel // k
        h = silu_and_mul((x[tok] @ w_gate_up[e].t()).contiguous()) @ w_down[e].t()  # [c, hidden]
        out.index_add_(0, tok, h * weights[sel, None])
    return out


class Expert(nn.Module):
    """One expert's checkpoint tensors (stacked into the block's weights by fuse())."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


class MoEBlock(nn.Module):
    """Router (`gate`) and experts; Mixtral always renormalises the top k, Qwen3-MoE when norm_topk_prob."""

    def __init__(self, config, family: str):
        super().__init__()
        self.num_experts = getattr(config, "num_local_experts", None) or config.num_experts
        self.top_k = config.num_experts_per_tok
        inter = getattr(config, "moe_intermediate_size", None) or config.intermediate_size
        self.renormalize = True if family == "mixtral" else bool(getattr(config, "norm_topk_prob", False))
        self.gate = nn.Linear(config.hidden_size, self.num_experts, bias=False)
        self.experts = nn.ModuleList(Expert(config.hidden_size, inter) for _ in range(self.num_experts))

    def fuse(self) -> None:
        """Stack the experts' weights: w_gate_up [experts, 2 inter, hidden], w_down [experts, hidden, inter]."""
        ex = self.experts
        self.w_gate_up = nn.Parameter(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in ex]),
                                      requires_grad=False)
        self.w_down = nn.Parameter(torch.stack([e.down_proj.weight for e in ex]), requires_grad=False)
        del self.experts

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return moe_reference(x, self.w_gate_up, self.w_down, route(self.gate(x), self.top_k, self.renormalize))

"""Mixture-of-experts feed-forward (Mixtral, Qwen3-MoE): top-k routing with each model's renormalisation, and
a torch reference that runs only the chosen experts (tokens grouped per expert, one GEMM pair per active expert).

On CUDA the float experts run in the fused Triton kernel (kernels/fused_moe.py: pairs sorted by expert, one
grouped GEMM launch per projection). On CPU, decode-sized batches (up to NATIVE_MAX_ROWS rows of float32) run in
one native call over float32 or int8/int4 experts (kernels/moe_cpu.py); larger ones, and CPUs without the native
kernels, as one GEMM pair per active expert (float, or packed per expert through the quantized linear kernels).

Deterministic inference (`batch_invariant`, docs/determinism.md) sends every row count on CPU through the native
call: its GEMVs compute each row alone and a token sums its own experts in ascending order, so a token's output never
depends on the other tokens of the step. Without the native kernels for these weights (e.g. bf16 experts) the
tokens run one at a time, in order, through the reference.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels.activation import silu_and_mul
from sglpy.kernels.cpu_native import native_lib
from sglpy.kernels.fused_moe import fused_moe_unchecked
from sglpy.kernels.moe_cpu import NativeExperts, float_experts, moe_experts_cpu, packed_experts
from sglpy.kernels.quant_linear_cpu import NATIVE_MAX_ROWS


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


def _run_grouped(x: torch.Tensor, routing: Routing, num_experts: int, run) -> torch.Tensor:
    """Tokens grouped per chosen expert; run(e, xs [c, hidden]) -> [c, hidden] once per expert some token chose."""
    t, k = routing.ids.shape
    out = torch.zeros_like(x)
    if t == 0:
        return out
    flat = routing.ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=num_experts).tolist()
    weights = routing.weights.reshape(-1)
    start = 0
    for e, c in enumerate(counts):
        if c == 0:
            continue
        sel = order[start:start + c]
        start += c
        tok = sel // k
        out.index_add_(0, tok, run(e, x[tok]) * weights[sel, None])
    return out


def moe_reference(x: torch.Tensor, w_gate_up: torch.Tensor, w_down: torch.Tensor, routing: Routing) -> torch.Tensor:
    """x: [tokens, hidden]; w_gate_up: [experts, 2 inter, hidden]; w_down: [experts, hidden, inter] -> [tokens, hidden].

    Only experts some token chose are read (a decode step touches top_k experts per token, not all of them)."""
    return _run_grouped(x, routing, w_gate_up.shape[0],
                        lambda e, xs: silu_and_mul((xs @ w_gate_up[e].t()).contiguous()) @ w_down[e].t())


def moe_experts(x: torch.Tensor, routing: Routing, gate_up, down) -> torch.Tensor:
    """moe_reference over per-expert linear modules (the quantized experts): gate_up[e]: hidden -> 2 inter,
    down[e]: inter -> hidden. x: [tokens, hidden] -> [tokens, hidden]; only the chosen experts run."""
    return _run_grouped(x, routing, len(gate_up), lambda e, xs: down[e](silu_and_mul(gate_up[e](xs).contiguous())))


class Expert(nn.Module):
    """One expert's checkpoint tensors (stacked into the block's weights by fuse())."""

    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)


def expert_intermediate_size(config) -> int:
    """One expert's intermediate size (Qwen3-MoE: moe_intermediate_size; Mixtral: intermediate_size)."""
    return getattr(config, "moe_intermediate_size", None) or config.intermediate_size


class MoEBlock(nn.Module):
    """Router (`gate`) and experts; Mixtral always renormalises the top k, Qwen3-MoE when norm_topk_prob.

    Under tensor parallelism (`shard`) each rank holds every expert's slice of the intermediate dimension and the
    router whole: its output is a partial sum that the shard's group all-reduces."""

    def __init__(self, config, family: str, shard=None, batch_invariant: bool = False):
        super().__init__()
        self.num_experts = getattr(config, "num_local_experts", None) or config.num_experts
        self.top_k = config.num_experts_per_tok
        inter = expert_intermediate_size(config) if shard is None else shard.expert_intermediate
        self.group = None if shard is None else shard.group  # tensor parallel: the partial sums' all-reduce
        self.renormalize = True if family == "mixtral" else bool(getattr(config, "norm_topk_prob", False))
        self.gate = nn.Linear(config.hidden_size, self.num_experts, bias=False)
        self._native: NativeExperts | None = None  # pointer tables for csrc/moe.cpp, built on first CPU decode
        self.batch_invariant = batch_invariant  # deterministic inference: experts row by row at any row count
        self.experts = nn.ModuleList(Expert(config.hidden_size, inter) for _ in range(self.num_experts))

    def fuse(self) -> None:
        """Stack the experts' weights: w_gate_up [experts, 2 inter, hidden], w_down [experts, hidden, inter]."""
        ex = self.experts
        self.w_gate_up = nn.Parameter(torch.stack([torch.cat([e.gate_proj.weight, e.up_proj.weight]) for e in ex]),
                                      requires_grad=False)
        self.w_down = nn.Parameter(torch.stack([e.down_proj.weight for e in ex]), requires_grad=False)
        del self.experts

    def quantize_experts(self, mode: str) -> int:
        """Pack every expert's gate_up and down weights int8/int4 (CPU, weight-only; no dense copy: the packed
        kernels run every row count, so an expert holds 1 or 0.5 bytes per weight); returns the packed bytes."""
        from .quantization import QuantizedLinear

        with torch.no_grad():
            self.q_gate_up = nn.ModuleList(QuantizedLinear.from_weight(w, None, mode, None) for w in self.w_gate_up)
            self.q_down = nn.ModuleList(QuantizedLinear.from_weight(w, None, mode, None) for w in self.w_down)
        del self.w_gate_up, self.w_down
        return sum(q.packed.nbytes for q in (*self.q_gate_up, *self.q_down))

    def _native_experts(self, x: torch.Tensor) -> NativeExperts | None:
        """The experts' tables for the native CPU call when x is a few float32 CPU rows (any number of rows under
        batch_invariant) and the weights fit it."""
        many = x.shape[0] > NATIVE_MAX_ROWS and not self.batch_invariant
        if x.device.type != "cpu" or x.dtype != torch.float32 or many:
            return None
        if hasattr(self, "q_gate_up"):
            if self._native is None:
                self._native = packed_experts([q.packed for q in self.q_gate_up], [q.packed for q in self.q_down])
            return self._native
        w1, w2 = self.w_gate_up, self.w_down
        if w1.dtype != torch.float32 or w1.device.type != "cpu" or not (w1.is_contiguous() and w2.is_contiguous()):
            return None
        if self._native is None or self._native.keep[0].data_ptr() != w1.data_ptr():  # built for these tensors
            self._native = float_experts(w1.data, w2.data)
        return self._native

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        routing = route(self.gate(x), self.top_k, self.renormalize)  # every rank routes alike (the router is whole)
        native = self._native_experts(x)
        lib = native_lib() if native is not None else None
        if lib is not None:  # decode rows: every token's top-k experts in one call (csrc/moe.cpp)
            y = moe_experts_cpu(lib, x, routing.ids, routing.weights, native)
        elif self.batch_invariant and x.shape[0] > 1:  # no native call here: one token at a time, in order
            y = torch.cat([self._experts(x[i:i + 1], Routing(routing.ids[i:i + 1], routing.weights[i:i + 1]))
                           for i in range(x.shape[0])])
        else:
            y = self._experts(x, routing)
        if self.group is not None:  # tensor parallel: the ranks' intermediate slices summed
            self.group.all_reduce(y)
        return y

    def _experts(self, x: torch.Tensor, routing: Routing) -> torch.Tensor:
        """x: [tokens, hidden] -> [tokens, hidden] through the chosen experts, off the native CPU call."""
        if hasattr(self, "q_gate_up"):
            return moe_experts(x, routing, self.q_gate_up, self.q_down)
        if x.is_cuda:  # the fused Triton kernel (the torch reference under SGLPY_DISABLE_TRITON=1)
            return fused_moe_unchecked(x, self.w_gate_up, self.w_down, routing.ids, routing.weights)
        return moe_reference(x, self.w_gate_up, self.w_down, routing)


"""Native CPU mixture-of-experts for a few rows (csrc/moe.cpp): each token's top-k experts (gate_up GEMV, SiLU*up,
down GEMV, weighted sum) in one call, over float32, int8 or int4 expert weights; runtime/model/moe.py's grouped
Python loop is its oracle."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from .quant_linear import PackedLinear

KIND_CODES = {"float32": 0, "int8": 1, "int4": 2}  # = enum ExpertKind in csrc/moe.cpp


@dataclass(frozen=True)
class NativeExperts:
    """Every expert's gate_up [2 inter, hidden] and down [hidden, inter] weights as pointer tables for one call.

    ptrs: int64 [4, experts] (gate_up weights, gate_up scales, down weights, down scales); `keep` holds the tensors
    the pointers address, so they live as long as this table."""

    kind: str
    hidden: int
    inter: int
    ptrs: torch.Tensor
    keep: tuple

    def __post_init__(self):
        if self.kind not in KIND_CODES:
            raise ValueError(f"kind must be one of {sorted(KIND_CODES)}, got {self.kind!r}")

    @property
    def num_experts(self) -> int:
        return self.ptrs.shape[1]


def float_experts(w_gate_up: torch.Tensor, w_down: torch.Tensor) -> NativeExperts:
    """Tables over stacked float32 weights: w_gate_up [experts, 2 inter, hidden], w_down [experts, hidden, inter]."""
    if w_gate_up.dtype != torch.float32 or w_down.dtype != torch.float32:
        raise ValueError(f"float experts must be float32, got {w_gate_up.dtype} / {w_down.dtype}")
    w_gate_up, w_down = w_gate_up.contiguous(), w_down.contiguous()
    gu = [w.data_ptr() for w in w_gate_up]
    dn = [w.data_ptr() for w in w_down]
    ptrs = torch.tensor([gu, [0] * len(gu), dn, [0] * len(dn)], dtype=torch.int64)
    return NativeExperts("float32", w_gate_up.shape[2], w_down.shape[2], ptrs, (w_gate_up, w_down))


def packed_experts(gate_up: list[PackedLinear], down: list[PackedLinear]) -> NativeExperts | None:
    """Tables over per-expert packed weights, or None when some expert is not in the native layout (or has a bias)."""
    every = [*gate_up, *down]
    kinds = {p.kind for p in every}
    if len(kinds) != 1 or not all(p.native and p.bias is None for p in every):
        return None
    ptrs = torch.tensor([[p.qweight.data_ptr() for p in gate_up], [p.scales.data_ptr() for p in gate_up],
                         [p.qweight.data_ptr() for p in down], [p.scales.data_ptr() for p in down]], dtype=torch.int64)
    return NativeExperts(kinds.pop(), gate_up[0].in_features, down[0].in_features, ptrs, tuple(every))


def moe_experts_cpu(lib: ctypes.CDLL, x: torch.Tensor, ids: torch.Tensor, weights: torch.Tensor,
                    experts: NativeExperts) -> torch.Tensor:
    """x float32 [M, hidden]; ids [M, top_k]; weights [M, top_k] -> [M, hidden] float32: only the chosen experts."""
    x = x.contiguous()
    ids = ids.to(torch.int64).contiguous()
    weights = weights.to(torch.float32).contiguous()
    m, top_k = ids.shape
    out = torch.empty((m, experts.hidden), dtype=torch.float32)
    p = experts.ptrs
    rc = lib.sglpy_moe_experts(x.data_ptr(), m, experts.hidden, experts.inter, top_k, experts.num_experts,
                               ids.data_ptr(), weights.data_ptr(), KIND_CODES[experts.kind], p[0].data_ptr(),
                               p[1].data_ptr(), p[2].data_ptr(), p[3].data_ptr(), out.data_ptr(),
                               torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"expert ids must lie in [0, {experts.num_experts}), got [{int(ids.min())}, "
                         f"{int(ids.max())}]")
    return out

"""SiLU-and-multiply of a fused gate/up projection (Llama's MLP activation)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, check_tensor
from .cpu_native import native_lib
from .decode_glue_cpu import silu_and_mul_cpu


def silu_and_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """silu(gate) * up, gate and up the two halves of the last dim (torch; the oracle)."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.silu(gate) * up


def silu_and_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """[M, 2 I] -> [M, I]: the native kernel on CPU for float32 rows, torch elsewhere."""
    check_tensor("gate_up", gate_up, 2, FLOAT_DTYPES)
    if gate_up.shape[1] % 2:
        raise ValueError(f"gate_up dim 1 must be even (gate and up halves), got {gate_up.shape[1]}")
    lib = native_lib() if gate_up.device.type == "cpu" else None
    if lib is None or gate_up.dtype != torch.float32 or not gate_up.is_contiguous():
        return silu_and_mul_reference(gate_up)
    return silu_and_mul_cpu(lib, gate_up)

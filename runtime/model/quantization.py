"""Quantize-at-load of our model: weight-only int8/int4 linear layers and the lm_head's own quantized copy."""

from __future__ import annotations

import torch
from torch import nn

from sglpy.kernels.quant_linear import PackedLinear, pack_linear, quant_linear_unchecked
from ..config import QUANTIZATION_MODES

INT4_GROUP_SIZE = 32  # GGUF Q4_1's block: the embedded model's weights sit exactly on this grid


def resolve_quantization(mode: str, device: torch.device) -> str:
    """The mode that runs: 'auto' is none for now (float32 weights) on every device.

    int8 passes the quality gate and decodes ~1.9x faster on CPU (benchmarks/README.md), but its bf16-rounded
    activations turn last-bit differences between batch shapes into visible logprob and greedy-token
    differences, so a request's output would depend on its neighbours in the batch; it stays opt-in
    (--quantization int8) until that is fixed."""
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, got {mode!r}")
    if mode == "auto":
        return "none"
    if mode != "none" and device.type != "cpu":
        raise ValueError(f"quantization={mode!r} runs on CPU only (device is {device}); use none or auto")
    return mode


def dense_bf16_matmul_is_fast() -> bool:
    """True on CPUs with native bf16 matmul (AMX or AVX512-BF16), where a bf16 GEMM beats the packed kernels."""
    cpu = torch.cpu
    return bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()
                or getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())


class QuantizedLinear(nn.Module):
    """Drop-in for nn.Linear over a PackedLinear weight (weight-only quantized, CPU)."""

    def __init__(self, packed: PackedLinear):
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.in_features, packed.out_features

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, mode: str, dense: bool) -> "QuantizedLinear":
        """Quantize an fp32 [out, in] weight per `mode` ('int8' or 'int4')."""
        return cls(pack_linear(weight, bias, mode, INT4_GROUP_SIZE, dense=dense))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear_unchecked(x, self.packed)  # x: [M, in] -> [M, out]

    def extra_repr(self) -> str:
        p = self.packed
        return f"{p.kind}, in={p.in_features}, out={p.out_features}, dense_copy={p.dense is not None}"


def _replace(parent: nn.Module, name: str, mode: str, dense: bool) -> int:
    lin = getattr(parent, name)
    if hasattr(lin, "linear"):  # a tensor-parallel RowParallel wrapper: quantize this rank's shard inside it
        parent, name, lin = lin, "linear", lin.linear
    q = QuantizedLinear.from_weight(lin.weight, lin.bias, mode, dense)
    setattr(parent, name, q)
    return q.packed.nbytes


def quantize_model(model: nn.Module, mode: str, dense: bool | None = None) -> int:
    """Replace every projection of a loaded, fused LlamaForCausalLM by its quantized form; returns weight bytes.

    The lm_head gets its own quantized copy (int8 per channel in both modes: the embedded model's
    embedding is Q8_0, and 4 bits lose 15 points of top-1 agreement); the embedding lookup stays exact.
    dense=None keeps a bf16 copy for many-row calls when this CPU multiplies bf16 natively.
    Under tensor parallelism each rank quantizes its own shards: per output channel, a column-parallel shard
    gets exactly the numbers of tp=1; a row-parallel shard's channel scale covers its own input columns.
    """
    if mode not in ("none", "int8", "int4"):
        raise ValueError(f"quantize_model takes none, int8 or int4 (resolve 'auto' first), got {mode!r}")
    if mode == "none":
        return 0
    if dense is None:
        dense = dense_bf16_matmul_is_fast()
    total = 0
    with torch.no_grad():
        for layer in model.model.layers:
            for name in ("qkv_proj", "o_proj"):
                total += _replace(layer.self_attn, name, mode, dense)
            for name in ("gate_up_proj", "down_proj"):
                total += _replace(layer.mlp, name, mode, dense)
        vocab_parallel = model.logits_head is not None and hasattr(model.logits_head, "inner")
        head_weight = model.logits_head.inner.weight if vocab_parallel else model.lm_head_weight()
        head = QuantizedLinear.from_weight(head_weight, None, "int8", dense)
        if vocab_parallel:
            model.logits_head.inner = head  # this rank's vocabulary slice
        else:
            model.set_lm_head(head)
        total += head.packed.nbytes
    return total

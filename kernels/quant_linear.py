"""Weight-only quantized linear layers: int8 per output channel or int4 per group, packed once at load.

Two layouts of the same quantized values: the native CPU kernels' (kernels/quant_linear_cpu.py, float32 activations,
chosen when the native library is built) and torch's packed kernels' (bf16 activations, the fallback).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, check_dim, check_tensor
from .cpu_native import native_lib
from .quant_linear_cpu import (NATIVE_MAX_ROWS, int4_from_native, int4_to_native, native_layout_fits,
                               quant_linear_cpu, tiled_linear_cpu)

INT4_GROUP_SIZES = (32, 64, 128, 256)  # what torch's packed int4 CPU kernel accepts
# Above this many rows a dense copy of the dequantized weights (when one was kept) runs as a plain GEMM: the packed
# kernels cost the same per row at any M, a GEMM gets cheaper per row. Measured on the 2-core dev box (which has
# AMX), [576 -> 3072], 2 threads, ms packed int8 vs float32 dense: M=8 0.21 vs 0.36, M=16 0.38 vs 0.41, M=24
# 0.60 vs 0.50, M=64 1.5 vs 0.92, M=512 14.9 vs 6.2; packed int4 vs bf16 dense (AMX): M=8 0.19 vs 0.13, M=16
# 0.38 vs 0.17, M=64 1.47 vs 0.27, M=512 12.0 vs 0.96 (float32 is the copy on CPUs without native bf16).
PACKED_MAX_ROWS = {torch.float32: 16, torch.bfloat16: 8}
PACK_ROWS = 4096  # output rows quantized per slice (a multiple of the native int4 scale tile, 8)


@dataclass(frozen=True)
class PackedLinear:
    """A quantized [out_features, in_features] weight in the layout its CPU kernel reads, plus fp32 bias."""

    kind: str  # "int8" (per output channel) or "int4" (asymmetric, per group of group_size inputs)
    out_features: int
    in_features: int
    qweight: torch.Tensor  # torch layout: int8 [N, K] | uint8 [N, K // 2]; native: see kernels/quant_linear_cpu.py
    scales: torch.Tensor  # torch layout: int8 bf16 [N]; int4 bf16 [K // group, N, 2] (scale, zero) per group
    group_size: int  # in_features for int8
    dense: torch.Tensor | None = None  # float32 or bf16 [N, K]: the same dequantized weights, for many-row calls
    bias: torch.Tensor | None = None  # float32 [N]
    native: bool = False  # qweight/scales in the native CPU kernels' layout
    # native layout without a dense copy: many-row calls dequantize tiles of W in this dtype (float32 or bf16) into
    # one reused buffer and run a GEMM on each (tiled_linear_cpu); None: the packed kernels for every row count
    tiles: torch.dtype | None = None

    def __post_init__(self):
        if self.kind not in ("int8", "int4"):
            raise ValueError(f"kind must be 'int8' or 'int4', got {self.kind!r}")
        if self.tiles not in (None, torch.float32, torch.bfloat16) or (self.tiles is not None and not self.native):
            raise ValueError(f"tiles must be None, or float32/bfloat16 with the native layout, got {self.tiles}")

    @property
    def nbytes(self) -> int:
        """Bytes held by this layer's tensors (packed weight, scales, dense copy, bias)."""
        ts = [self.qweight, self.scales, self.dense, self.bias]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)


def quantize_int8(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-output-channel int8: (q int8 [N, K], scale bf16 [N]) with weight ~= q * scale."""
    w = weight.detach().to(torch.float32)
    # The kernel multiplies by a bf16 scale, so round the scale first and quantize against the rounded value.
    scale = (w.abs().amax(dim=1) / 127.0).clamp(min=1e-10).to(torch.bfloat16)
    q = torch.round(w / scale.to(torch.float32)[:, None]).clamp(-127, 127).to(torch.int8)
    return q, scale


def quantize_int4(weight: torch.Tensor, group_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Asymmetric int4 per group of inputs: (codes int32 [N, K] in 0..15, scales_and_zeros bf16 [K // g, N, 2]).

    Dequantized weight = (code - 8) * scale + zero, the layout of torch's int4 CPU kernel; zero = min + 8 * scale,
    so code 0 is the group minimum (the same grid as GGUF Q4_1 blocks when group_size is 32).
    """
    n, k = weight.shape
    if group_size not in INT4_GROUP_SIZES:
        raise ValueError(f"group_size must be one of {INT4_GROUP_SIZES}, got {group_size}")
    if k % group_size:
        raise ValueError(f"in_features ({k}) must be a multiple of group_size ({group_size})")
    w = weight.detach().to(torch.float32).reshape(n, k // group_size, group_size)
    lo, hi = w.amin(dim=-1), w.amax(dim=-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-10).to(torch.bfloat16)
    zero = (lo + 8.0 * scale.to(torch.float32)).to(torch.bfloat16)
    # Codes against the rounded bf16 scale/zero the kernel will use: code = round((w - zero) / scale) + 8.
    codes = torch.round((w - zero.to(torch.float32)[..., None]) / scale.to(torch.float32)[..., None]) + 8
    codes = codes.clamp(0, 15).to(torch.int32).reshape(n, k)
    scales_and_zeros = torch.stack([scale, zero], dim=-1).transpose(0, 1).contiguous()  # [K // g, N, 2]
    return codes, scales_and_zeros


def dequantize_int8(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 [N, K] weights an int8 (q, scale) pair stands for."""
    return q.to(torch.float32) * scale.to(torch.float32)[:, None]


def dequantize_int4(codes: torch.Tensor, scales_and_zeros: torch.Tensor, group_size: int) -> torch.Tensor:
    """float32 [N, K] weights int4 (codes, scales_and_zeros) stand for."""
    n, k = codes.shape
    sz = scales_and_zeros.to(torch.float32).transpose(0, 1)  # [N, K // g, 2]
    c = codes.to(torch.float32).reshape(n, k // group_size, group_size)
    return ((c - 8.0) * sz[..., 0:1] + sz[..., 1:2]).reshape(n, k)


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None, kind: str, group_size: int = 32,
                dense: torch.dtype | None = None, native: bool | None = None,
                tiles: torch.dtype | None = None) -> PackedLinear:
    """Quantize an fp32 [N, K] weight into a kernel layout; `dense` (float32 or bfloat16) also keeps a copy of the
    dequantized weights in that dtype for many-row calls. native: the native kernels' layout (None = when the native
    library is built and can hold this shape), else torch's packed layout. tiles (native layout only, ignored
    otherwise): many-row calls dequantize tiles in that dtype per call instead of keeping a copy."""
    if dense not in (None, torch.float32, torch.bfloat16):
        raise ValueError(f"dense must be None, torch.float32 or torch.bfloat16, got {dense}")
    if kind not in ("int8", "int4"):
        raise ValueError(f"kind must be 'int8' or 'int4', got {kind!r}")
    check_tensor("weight", weight, 2, FLOAT_DTYPES)
    n, k = weight.shape
    if native is None:
        native = native_lib() is not None and native_layout_fits(kind, n, k, group_size)
    elif native and not native_layout_fits(kind, n, k, group_size):
        raise ValueError(f"the native layout cannot hold {kind} [{n}, {k}] with group_size {group_size}")
    if native and dense is None and n > PACK_ROWS:  # a large weight (an lm_head) in slices: bounded temporaries
        parts = [pack_linear(weight[i:i + PACK_ROWS], None, kind, group_size, None, True, tiles)
                 for i in range(0, n, PACK_ROWS)]
        b = None if bias is None else bias.detach().to(torch.float32).contiguous()
        return PackedLinear(kind, n, k, torch.cat([p.qweight for p in parts]), torch.cat([p.scales for p in parts]),
                            parts[0].group_size, None, b, True, parts[0].tiles)
    if kind == "int8":
        q, scales = quantize_int8(weight)
        deq = dequantize_int8(q, scales) if dense is not None else None
        packed, group_size = q.contiguous(), k
        if native:
            scales = scales.to(torch.float32)  # exact: the kernel multiplies by a float32
    else:
        if n % 16 and not native:  # torch's packed CPU layout interleaves 16 output rows
            raise ValueError(f"int4 needs out_features divisible by 16, got {n}")
        codes, scales = quantize_int4(weight, group_size)
        deq = dequantize_int4(codes, scales, group_size) if dense is not None else None
        if native:
            packed, scales = int4_to_native(codes, scales)
        else:
            packed = torch._convert_weight_to_int4pack_for_cpu(codes, 1)
    b = None if bias is None else bias.detach().to(torch.float32).contiguous()
    return PackedLinear(kind, n, k, packed, scales, group_size,
                        deq.to(dense).contiguous() if dense is not None else None, b, native,
                        tiles if native and dense is None else None)


def dequantize(p: PackedLinear) -> torch.Tensor:
    """float32 [N, K] weights a PackedLinear stands for (torch's int4: unpacked by its kernel's exact float32 path)."""
    if p.kind == "int8":
        return dequantize_int8(p.qweight, p.scales)
    if p.native:
        return dequantize_int4(*int4_from_native(p.qweight, p.scales), p.group_size)
    # torch has no public int4 unpack; an identity through the kernel's float32 path returns W^T exactly.
    eye = torch.eye(p.in_features, dtype=torch.float32)
    wt = torch._weight_int4pack_mm_for_cpu(eye, p.qweight, p.group_size, p.scales.to(torch.float32))  # [K, N]
    return wt.t().contiguous()


def quant_linear_reference(x: torch.Tensor, p: PackedLinear) -> torch.Tensor:
    """Pure-torch oracle: float32 x @ dequantized W^T (+ bias), in x.dtype."""
    # x: [M, K] -> [M, N]
    y = x.to(torch.float32) @ dequantize(p).t()
    if p.bias is not None:
        y = y + p.bias
    return y.to(x.dtype)


def check_quant_linear_args(x: torch.Tensor, p: PackedLinear) -> None:
    """Raise ValueError naming the first bad argument of quant_linear."""
    if not isinstance(p, PackedLinear):
        raise ValueError(f"p must be a PackedLinear, got {type(p).__name__}")
    check_tensor("x", x, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_dim("x", x.shape[1], p.in_features, "dim 1 (in_features)")
    if x.device.type != "cpu":
        raise ValueError(f"quantized linear layers run on CPU only, got x on {x.device}")


def quant_linear_unchecked(x: torch.Tensor, p: PackedLinear) -> torch.Tensor:
    """quant_linear without argument checks (the model's hot path; its shapes are fixed at load)."""
    # x: [M, K] float -> [M, N] in x.dtype. Native kernels: float32 activations in and out. Torch's packed kernels:
    # activations enter as bf16 (their fast path; fp32 takes a scalar path ~10x slower), accumulate in float32.
    rows = x.shape[0]
    if p.dense is not None and rows > (NATIVE_MAX_ROWS if p.native else PACKED_MAX_ROWS[p.dense.dtype]):
        y = F.linear(x if x.dtype == p.dense.dtype else x.to(p.dense.dtype), p.dense)
        return _finish(y, x, p)
    if p.native:
        lib = native_lib()
        if lib is None:  # the library was disabled after packing (SGLPY_DISABLE_CPU_KERNELS): correct, not fast
            return quant_linear_reference(x, p)
        if p.tiles is not None and rows > NATIVE_MAX_ROWS:
            y = tiled_linear_cpu(lib, x, p.kind, p.qweight, p.scales, p.bias, p.out_features, p.tiles)
            return y if x.dtype == torch.float32 else y.to(x.dtype)
        y = quant_linear_cpu(lib, x, p.kind, p.qweight, p.scales, p.bias, p.out_features)
        return y if x.dtype == torch.float32 else y.to(x.dtype)
    xb = x if x.dtype == torch.bfloat16 else x.to(torch.bfloat16)  # (a no-op .to still costs ~1 us)
    if p.kind == "int8":
        y = torch._weight_int8pack_mm(xb, p.qweight, p.scales)
    else:
        y = torch._weight_int4pack_mm_for_cpu(xb, p.qweight, p.group_size, p.scales)
    return _finish(y, x, p)


def _finish(y: torch.Tensor, x: torch.Tensor, p: PackedLinear) -> torch.Tensor:
    # y: [M, N] from a kernel -> x.dtype, + bias
    if y.dtype != x.dtype:
        y = y.to(x.dtype)
    if p.bias is not None:
        y = y + p.bias.to(x.dtype)
    return y


def quant_linear(x: torch.Tensor, p: PackedLinear) -> torch.Tensor:
    """x @ W^T (+ bias) for a packed weight-only quantized W; returns [M, N] in x.dtype."""
    check_quant_linear_args(x, p)
    return quant_linear_unchecked(x, p)

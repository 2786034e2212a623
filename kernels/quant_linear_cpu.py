"""Native CPU weight-only GEMV (csrc/quant_gemv.cpp) for a few rows: float32 activations, the weights in the native
layout; quant_linear_reference is its oracle. Also the float32 GEMV of deterministic inference (linear_f32_cpu).

Native layout (the same quantized values as torch's packed kernels read, arranged for the kernels' loads):
  int8: qweight int8 [N, K], scales float32 [N].
  int4: qweight uint8 [N, K // 32, 16] (byte i of a group: input i in the low nibble, input i + 16 in the high one),
        scales bf16 [ceil(N / 8), K // 32, 2, 8]: per tile of 8 output rows and group, the 8 rows' scales, then
        their 8 zeros (zero rows pad N to a multiple of 8): the x86 kernels scale 8 rows at once with one load.
"""

from __future__ import annotations

import ctypes

import torch

NATIVE_GROUP = 32  # the int4 kernel's group size (GGUF Q4_1's block)
SCALE_TILE = 8  # output rows per tile of the int4 scales (csrc/q8_dot.h: TILE)
MAX_INT4_K = 32 * 1024  # csrc/gemv_float.h: MAX_GROUPS
# Rows up to which the native kernels beat a dense bf16 copy of the weights. Measured on the 2-core AMD EPYC dev box
# (AVX-512, no AMX), every layer's weights read from memory, us per SmolLM2 layer: int4 native M=1 139, M=8 507,
# dense bf16 747 / 829; M=16 about even (1,014 vs 1,127); the int8 lm_head at M=8 3.0 vs 6.2 ms.
NATIVE_MAX_ROWS = 16


def native_layout_fits(kind: str, n: int, k: int, group_size: int) -> bool:
    """Whether the native kernels can hold this weight (int4: group 32 and K <= 32k; int8: K a multiple of 16)."""
    if kind == "int4":
        return group_size == NATIVE_GROUP and k % NATIVE_GROUP == 0 and k <= MAX_INT4_K
    return kind == "int8" and k % 16 == 0


def int4_to_native(codes: torch.Tensor, scales_and_zeros: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """codes int32 [N, K] in 0..15 and torch's bf16 [K // 32, N, 2] -> (uint8 [N, K // 32, 16],
    bf16 [ceil(N / 8), K // 32, 2, 8])."""
    n, k = codes.shape
    c = codes.reshape(n, k // NATIVE_GROUP, NATIVE_GROUP)
    packed = (c[..., :16] | (c[..., 16:] << 4)).to(torch.uint8).contiguous()
    sz = torch.nn.functional.pad(scales_and_zeros, (0, 0, 0, (-n) % SCALE_TILE))  # [G, N8, 2]
    groups = sz.shape[0]
    return packed, sz.view(groups, -1, SCALE_TILE, 2).permute(1, 0, 3, 2).contiguous()


def int4_from_native(packed: torch.Tensor, scales: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The inverse of int4_to_native: (codes int32 [N, K], scales_and_zeros bf16 [K // 32, N, 2])."""
    n, groups, _ = packed.shape
    codes = torch.cat([packed & 15, packed >> 4], dim=-1).to(torch.int32).reshape(n, groups * NATIVE_GROUP)
    sz = scales.permute(1, 0, 3, 2).reshape(groups, -1, 2)[:, :n]
    return codes, sz.contiguous()


def quant_linear_cpu(lib: ctypes.CDLL, x: torch.Tensor, kind: str, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None, out_features: int) -> torch.Tensor:
    """x @ W^T (+ bias) through the native kernels: x [M, K] float32 -> [M, N] float32 (any M; fastest up to
    NATIVE_MAX_ROWS)."""
    # x: [M, K] -> y: [M, N]
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    m, k = x.shape
    expected = qweight.shape[1] if kind == "int8" else qweight.shape[1] * NATIVE_GROUP
    if k != expected:  # the kernel would read past the weights
        raise ValueError(f"x dim 1 (in_features) must be {expected}, got {k}")
    y = torch.empty((m, out_features), dtype=torch.float32)
    fn = lib.sglpy_gemv_int4 if kind == "int4" else lib.sglpy_gemv_int8
    fn(x.data_ptr(), m, k, qweight.data_ptr(), scales.data_ptr(), None if bias is None else bias.data_ptr(),
       y.data_ptr(), out_features, torch.get_num_threads())
    return y


def linear_f32_cpu(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """x @ weight^T (+ bias) in float32 through csrc/quant_gemv.cpp: row m of the result depends on row m of x
    alone, never on how many rows share the call (torch's float32 GEMM picks its blocking by M)."""
    # x: [M, K], weight: float32 [N, K] contiguous, bias: float32 [N] or None -> [M, N] float32
    if x.dtype != torch.float32 or not x.is_contiguous():
        x = x.to(torch.float32).contiguous()
    m, k = x.shape
    n = weight.shape[0]
    if weight.dtype != torch.float32 or not weight.is_contiguous() or weight.shape[1] != k:
        raise ValueError(f"weight must be contiguous float32 [N, {k}], got {weight.dtype} {tuple(weight.shape)}")
    y = torch.empty((m, n), dtype=torch.float32)
    lib.sglpy_gemv_f32(x.data_ptr(), m, k, weight.data_ptr(), None if bias is None else bias.data_ptr(),
                       y.data_ptr(), n, torch.get_num_threads())
    return y


def native_error_bound(lib: ctypes.CDLL, x: torch.Tensor, weight: torch.Tensor, int8_weights: bool) -> torch.Tensor:
    """[M, N] bound on |native GEMV - float32 x @ weight^T| (weight: the dequantized float32 [N, K]): float32
    rounding, plus, where the build quantizes activations to int8 per block of 32 (csrc/q8_dot.h),
    sum_k |W[n, k]| * d_block(k) / 2 with d = max |x| over the block / Q (each activation moves by <= d / 2); Q is
    127, or the build's sglpy_gemv_int8_weight_act_max() against int8 weights (63 at AVX2 without VNNI)."""
    # x: [M, K], weight: [N, K] -> [M, N]
    x = x.to(torch.float32)
    tol = 1e-5 + 1e-5 * (x @ weight.t()).abs()
    if lib.sglpy_gemv_int8_activations():
        m, k = x.shape
        pad = torch.nn.functional.pad(x.abs(), (0, (-k) % 32)).view(m, -1, 32)
        qmax = float(lib.sglpy_gemv_int8_weight_act_max()) if int8_weights else 127.0
        d = (pad.amax(-1) / qmax).repeat_interleave(32, 1)[:, :k]  # [M, K]
        tol = tol + (d / 2) @ weight.abs().t() * 1.0001
    return tol


# Output rows dequantized per GEMM of the many-row path: a bf16 tile of 256 x 2048 is 1 MiB (stays in L2 while the
# GEMM reads it); fewer, larger tiles only add Python calls' worth of savings (~20 us each).
TILE_BYTES = 1 << 20


def dequantize_rows_cpu(lib: ctypes.CDLL, kind: str, qweight: torch.Tensor, scales: torch.Tensor, n0: int, n1: int,
                        dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """Rows n0 .. n1 - 1 of a natively packed weight as float32 or bf16 [n1 - n0, K] (csrc/dequant.cpp)."""
    k = qweight.shape[1] if kind == "int8" else qweight.shape[1] * NATIVE_GROUP
    if out is None:
        out = torch.empty((n1 - n0, k), dtype=dtype)
    code = {torch.float32: 0, torch.bfloat16: 1}[dtype]
    rc = lib.sglpy_dequant_rows(0 if kind == "int8" else 1, qweight.data_ptr(), scales.data_ptr(), k, n0, n1,
                                out.data_ptr(), code, torch.get_num_threads())
    if rc != 0:
        raise ValueError(f"sglpy_dequant_rows refused {kind} rows {n0}..{n1} of K={k} as {dtype}")
    return out


def tiled_linear_cpu(lib: ctypes.CDLL, x: torch.Tensor, kind: str, qweight: torch.Tensor, scales: torch.Tensor,
                     bias: torch.Tensor | None, out_features: int, dtype: torch.dtype) -> torch.Tensor:
    """x @ W^T (+ bias) for many rows without a dense copy of W: each tile of output rows is dequantized into one
    reused buffer (`dtype`: bf16 where the CPU multiplies it natively) and multiplied by torch's GEMM.
    x [M, K] float -> [M, N] float32."""
    # x: [M, K] -> yT: [N, M] (a tile's rows land contiguous), returned transposed as [M, N]
    m, k = x.shape
    xt = x.to(dtype).t()  # [K, M]
    yt = torch.empty((out_features, m), dtype=dtype)
    rows = max(SCALE_TILE, TILE_BYTES // (k * (4 if dtype == torch.float32 else 2)) // SCALE_TILE * SCALE_TILE)
    buf = torch.empty((min(rows, out_features), k), dtype=dtype)
    for n0 in range(0, out_features, rows):
        n1 = min(out_features, n0 + rows)
        w = dequantize_rows_cpu(lib, kind, qweight, scales, n0, n1, dtype, buf[: n1 - n0])
        torch.mm(w, xt, out=yt[n0:n1])
    y = torch.empty((m, out_features), dtype=torch.float32)
    y.copy_(yt.t())
    return y if bias is None else y.add_(bias)

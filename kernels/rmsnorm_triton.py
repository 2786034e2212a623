"""Triton fused residual-add + RMSNorm; imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rmsnorm_kernel(
    X, Res, W, Out, ResOut,
    stride_x, stride_res, stride_out, stride_res_out,
    hidden, eps,
    HAS_RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < hidden
    x = tl.load(X + row * stride_x + offs, mask=mask, other=0.0)
    if HAS_RESIDUAL:
        # Add in float32 and round once to x.dtype, as torch does for x + residual; that rounded sum is both
        # the new residual and the norm input (HF semantics).
        r = tl.load(Res + row * stride_res + offs, mask=mask, other=0.0)
        x = (x.to(tl.float32) + r.to(tl.float32)).to(r.dtype)
        tl.store(ResOut + row * stride_res_out + offs, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = 1.0 / tl.sqrt(tl.sum(xf * xf, axis=0) / hidden + eps)
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    # Round the normalised value to x.dtype before the weight multiply, as HF LlamaRMSNorm does.
    normed = (xf * rstd).to(x.dtype).to(tl.float32)
    tl.store(Out + row * stride_out + offs, (normed * w).to(Out.dtype.element_ty), mask=mask)


def rmsnorm_triton(
    x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launch the fused kernel; returns (out, residual_out) with residual_out = x when residual is None."""
    # x, residual: [tokens, hidden]; weight: [hidden]
    n, hidden = x.shape
    out = torch.empty_like(x)
    res_out = torch.empty_like(x) if residual is not None else x
    res_in = residual if residual is not None else x
    block = triton.next_power_of_2(hidden)
    num_warps = min(max(block // 256, 1), 16)
    _rmsnorm_kernel[(n,)](
        x, res_in, weight, out, res_out,
        x.stride(0), res_in.stride(0), out.stride(0), res_out.stride(0),
        hidden, eps,
        HAS_RESIDUAL=residual is not None, BLOCK=block, num_warps=num_warps,
    )
    return out, res_out

"""Triton in-place token-bitmask apply; imported lazily (this module imports triton)."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _bitmask_kernel(
    Logits, Bitmask, Indices,
    stride_logits, stride_bitmask,
    vocab, words,
    HAS_INDICES: tl.constexpr, BLOCK: tl.constexpr,
):
    mrow = tl.program_id(0)
    if HAS_INDICES:
        row = tl.load(Indices + mrow).to(tl.int64)
    else:
        row = mrow.to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    word_idx = offs // 32
    # Tokens past the bitmask's last word read 0 (disallowed).
    word = tl.load(Bitmask + mrow.to(tl.int64) * stride_bitmask + word_idx, mask=word_idx < words, other=0)
    allowed = ((word >> (offs % 32)) & 1) != 0
    tl.store(Logits + row * stride_logits + offs, float("-inf"), mask=(offs < vocab) & ~allowed)


def apply_token_bitmask_triton(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    """Launch the mask kernel; bitmask row i masks logits row indices[i] (or row i)."""
    # logits: [b, vocab]; bitmask: [rows, words] int32; indices: [rows] or None
    indices = indices.contiguous() if indices is not None else None  # the kernel reads Indices + i
    rows, words = bitmask.shape
    vocab = logits.shape[1]
    block = 1024
    _bitmask_kernel[(rows, triton.cdiv(vocab, block))](
        logits, bitmask, indices if indices is not None else bitmask,
        logits.stride(0), bitmask.stride(0),
        vocab, words,
        HAS_INDICES=indices is not None, BLOCK=block,
    )

"""Apply a packed int32 allowed-token bitmask to logits in place (disallowed -> -inf)."""

from __future__ import annotations

import torch

from ._checks import FLOAT_DTYPES, check_same_device, check_tensor
from ._dispatch import on_device, triton_module


def unpack_bitmask(bitmask: torch.Tensor, vocab: int) -> torch.Tensor:
    """Expand [rows, words] int32 bitmask to [rows, vocab] bool; tokens past words*32 are disallowed."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)
    bits = (bitmask[:, :, None] >> shifts) & 1  # arithmetic shift is fine: only the low bit is kept
    allowed = bits.reshape(bitmask.shape[0], -1).bool()[:, :vocab]
    if allowed.shape[1] < vocab:
        pad = torch.zeros(bitmask.shape[0], vocab - allowed.shape[1], dtype=torch.bool, device=bitmask.device)
        allowed = torch.cat([allowed, pad], dim=1)
    return allowed


def apply_token_bitmask_reference(
    logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None
) -> None:
    """Pure-torch in-place mask: logits[r, t] = -inf where bit t%32 of bitmask[r, t//32] is clear."""
    # logits: [b, vocab]; bitmask: [b or len(indices), words]; indices: [k] rows of logits to mask
    allowed = unpack_bitmask(bitmask, logits.shape[1])
    if indices is None:
        logits.masked_fill_(~allowed, float("-inf"))
    else:
        idx = indices.long()
        logits[idx] = logits[idx].masked_fill(~allowed, float("-inf"))


def check_bitmask_args(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None) -> None:
    """Raise ValueError naming the first bad argument of apply_token_bitmask."""
    check_tensor("logits", logits, 2, FLOAT_DTYPES, last_dim_contiguous=True)
    check_tensor("bitmask", bitmask, 2, (torch.int32,), last_dim_contiguous=True)
    rows = logits.shape[0]
    if indices is not None:
        check_tensor("indices", indices, 1, (torch.int32, torch.int64))
        check_same_device(logits=logits, bitmask=bitmask, indices=indices)
        rows = indices.shape[0]
        what = "len(indices)"
    else:
        check_same_device(logits=logits, bitmask=bitmask)
        what = "logits.shape[0]"
    if bitmask.shape[0] != rows:
        raise ValueError(f"bitmask rows ({bitmask.shape[0]}) must equal {what} ({rows})")
    if bitmask.shape[1] < 1 and logits.shape[1] > 0:
        raise ValueError("bitmask must have at least one int32 word per row")


def apply_token_bitmask(logits: torch.Tensor, bitmask: torch.Tensor, indices: torch.Tensor | None = None) -> None:
    """Set disallowed logits to -inf in place; with `indices`, bitmask row i masks logits row indices[i]."""
    check_bitmask_args(logits, bitmask, indices)
    if bitmask.shape[0] == 0 or logits.shape[1] == 0:
        return
    impl = triton_module("bitmask_triton", logits)
    if impl is None:
        if indices is not None:
            n = logits.shape[0]
            if int(indices.min()) < 0 or int(indices.max()) >= n:
                raise ValueError(f"indices must lie in [0, {n}), got min {int(indices.min())} max {int(indices.max())}")
        apply_token_bitmask_reference(logits, bitmask, indices)
    else:
        with on_device(logits):
            impl.apply_token_bitmask_triton(logits, bitmask, indices)

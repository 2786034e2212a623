"""Host-to-device copies that never wait for the device: pinned staging and non_blocking copies (CUDA).

A plain `torch.tensor(values, device=cuda)` or `cuda_tensor[...] = cpu_tensor` synchronises the stream
before returning (pageable source), so with overlap scheduling it would wait for the forward in flight.
Staging through pinned memory lets the copy queue behind that work instead; PyTorch's caching host
allocator keeps the pinned block alive until the copy has run. On CPU these are the plain operations.
"""

from __future__ import annotations

import array

import torch

_ARRAY_CODES = {torch.int64: "q", torch.int32: "i", torch.float32: "f"}


def host_tensor(values, dtype: torch.dtype) -> torch.Tensor:
    """torch.tensor(values, dtype) on the CPU; a list of ints or floats goes through array.array (its C loop), which
    costs a third of torch.tensor's per-element conversion (several such lists are built every step)."""
    code = _ARRAY_CODES.get(dtype)
    if code is not None and type(values) is list and values:
        try:
            return torch.frombuffer(array.array(code, values), dtype=dtype)  # the tensor keeps the array alive
        except (TypeError, OverflowError):
            pass  # not plain numbers of that kind: torch.tensor converts (or raises) as before
    return torch.tensor(values, dtype=dtype)


def to_device(values, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """torch.tensor(values, dtype) on `device`, queued without a host wait on CUDA."""
    t = host_tensor(values, dtype)
    if device.type != "cuda":
        return t if device.type == "cpu" else t.to(device)
    return t.pin_memory().to(device, non_blocking=True)


def copy_to(dst: torch.Tensor, values, dtype: torch.dtype) -> None:
    """dst[:] = values (a host list), queued without a host wait on CUDA."""
    src = host_tensor(values, dtype)
    if dst.is_cuda:
        dst.copy_(src.pin_memory(), non_blocking=True)
    else:
        dst.copy_(src)


def rows(t: torch.Tensor, index: list[int], copy: bool = True) -> torch.Tensor:
    """t[index] for a host list of row indices, without a host wait on CUDA.

    A copy, unless copy=False and the rows are one ascending run (a decode batch samples rows 0..n-1): then a
    view of t. A run is sliced, not gathered (no index tensor, no per-row work)."""
    n = len(index)
    if n and index[-1] - index[0] == n - 1 and index == list(range(index[0], index[0] + n)):
        view = t.narrow(0, index[0], n)
        return view.clone() if copy else view
    if not t.is_cuda:
        return t.index_select(0, torch.as_tensor(index, dtype=torch.int64))
    return t.index_select(0, to_device(index, torch.int64, t.device))

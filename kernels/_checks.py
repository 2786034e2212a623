"""Argument checks shared by the kernel wrappers: each failure names the argument and the problem."""

from __future__ import annotations

from collections.abc import Iterable

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
INDEX_DTYPES = (torch.int32, torch.int64)


def check_tensor(
    name: str,
    t: object,
    ndim: int,
    dtypes: Iterable[torch.dtype] | None = None,
    last_dim_contiguous: bool = False,
) -> torch.Tensor:
    """Raise ValueError unless `t` is a tensor with `ndim` dims and one of `dtypes`."""
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dim() != ndim:
        raise ValueError(f"{name} must have {ndim} dims, got shape {tuple(t.shape)}")
    if dtypes is not None:
        dtypes = tuple(dtypes)
        if t.dtype not in dtypes:
            allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
            raise ValueError(f"{name} dtype must be one of ({allowed}), got {str(t.dtype).replace('torch.', '')}")
    if last_dim_contiguous and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must have a contiguous last dim (stride 1), got strides {t.stride()}")
    return t


def check_same_device(**tensors: torch.Tensor) -> torch.device:
    """Raise ValueError unless every tensor lives on one device; return that device."""
    devices = {name: t.device for name, t in tensors.items()}
    first = next(iter(devices.values()))
    if any(d != first for d in devices.values()):
        listing = ", ".join(f"{n}={d}" for n, d in devices.items())
        raise ValueError(f"tensors must share one device, got {listing}")
    return first


def check_dim(name: str, actual: int, expected: int, what: str) -> None:
    """Raise ValueError when a dimension disagrees with the one it must match."""
    if actual != expected:
        raise ValueError(f"{name} {what} must be {expected}, got {actual}")


def check_same_dtype(**tensors: torch.Tensor) -> torch.dtype:
    """Raise ValueError unless every tensor has one dtype; return it."""
    dtypes = {name: t.dtype for name, t in tensors.items()}
    first = next(iter(dtypes.values()))
    if any(d != first for d in dtypes.values()):
        listing = ", ".join(f"{n}={str(d).replace('torch.', '')}" for n, d in dtypes.items())
        raise ValueError(f"tensors must share one dtype, got {listing}")
    return first

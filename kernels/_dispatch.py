"""Chooses Triton for CUDA tensors and the torch reference otherwise, importing triton only when needed."""

from __future__ import annotations

import contextlib
import functools
import importlib
import os
import warnings
from types import ModuleType

import torch

# Set SGLPY_DISABLE_TRITON=1 to run the torch references on CUDA too (A/B checks, debugging).
_DISABLE_ENV = "SGLPY_DISABLE_TRITON"


@functools.lru_cache(maxsize=None)
def _load(module: str) -> ModuleType | None:
    try:
        return importlib.import_module(f"{__package__}.{module}")
    except ImportError as exc:  # triton missing or broken: the references still run on CUDA
        warnings.warn(f"sglpy.kernels: Triton unavailable ({exc}); using torch references on CUDA", stacklevel=3)
        return None


def triton_module(module: str, t: torch.Tensor) -> ModuleType | None:
    """Return the Triton implementation module when `t` is on CUDA and Triton is usable, else None."""
    if not t.is_cuda or os.environ.get(_DISABLE_ENV, "") not in ("", "0"):
        return None
    return _load(module)


def on_device(t: torch.Tensor) -> contextlib.AbstractContextManager:
    """Make t's GPU current for a launch: Triton launches on the current device, not the tensors' device."""
    if t.is_cuda and t.device.index is not None and t.device.index != torch.cuda.current_device():
        return torch.cuda.device(t.device)
    return contextlib.nullcontext()

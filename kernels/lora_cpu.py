"""Native CPU segmented LoRA (csrc/lora.cpp): every segment's shrink and expand of one projection in one call, split
across threads, for decode steps and prefill chunks alike; beside kernels/lora.py's torch reference (one matmul pair
per adapter, ~11 small torch ops per adapter per layer: a prefill of 16 prompts over 8 adapters spent longer in them
than in the base model's layers). The fused decode layer runs the same entry point."""

from __future__ import annotations

import ctypes
import functools

import torch

from .cpu_native import DTYPE_CODES, bind_signatures, native_lib

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_SIGNATURES = {"sglpy_lora_delta": (_I64, [_P, _I64, _P, _I64, _P, _P, _I32, _I64, _I64, _I64, _P, _P, _P, _P, _P,
                                           _I64, _I64, _I64, _I32])}
WEIGHT_DTYPES = (torch.float32, torch.bfloat16)  # the adapter pool's dtypes the kernel reads


@functools.lru_cache(maxsize=None)
def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    return bind_signatures(lib, _SIGNATURES)


def lora_lib(x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor) -> ctypes.CDLL | None:
    """The native library when it runs this call (x, y float32 on CPU with unit column strides; a, bt contiguous
    float32 or bf16), else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or y.dtype != torch.float32:
        return None
    if a.dtype not in WEIGHT_DTYPES or bt.dtype != a.dtype:
        return None
    if x.stride(1) != 1 or y.stride(1) != 1 or not a.is_contiguous() or not bt.is_contiguous():
        return None
    lib = native_lib()
    return _typed(lib) if lib is not None else None


def lora_delta_cpu(lib: ctypes.CDLL, x: torch.Tensor, y: torch.Tensor, a: torch.Tensor, bt: torch.Tensor,
                   offsets: torch.Tensor, seg) -> torch.Tensor:
    """y[rows] += the segments' LoRA deltas (kernels/lora.py's contract); offsets: int64 [slices + 1] on the CPU."""
    n_slices = offsets.shape[0] - 1
    rc = lib.sglpy_lora_delta(x.data_ptr(), x.stride(0), y.data_ptr(), y.stride(0), a.data_ptr(), bt.data_ptr(),
                              DTYPE_CODES[a.dtype], x.shape[1], bt.shape[1], n_slices, offsets.data_ptr(),
                              seg.rows.data_ptr(), seg.indptr.data_ptr(), seg.slots.data_ptr(), seg.ranks.data_ptr(),
                              len(seg.host_slots), a.shape[0], x.shape[0], torch.get_num_threads())
    if rc != 0:
        raise ValueError("LoRA segments name a row, slot or rank outside the tensors")
    return y

"""ctypes mirrors of csrc/decode_layer.cpp's structs and its one-call decoder layer (a decode step's layer for
weight-only quantized projections in the native layout); the model's per-op path is its oracle."""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int32, c_int64, c_void_p

import torch

INT8, INT4 = 0, 1  # QLinear.kind
_FIRST_STAGE, _SECOND_STAGE = 1_000_000_000, 2_000_000_000


class QLinearC(ctypes.Structure):
    """One projection: int8 (scales float32 [N]) or int4 (scales bf16 [N, 2, K // 32]) in the native layout."""

    _fields_ = [("kind", c_int64), ("q", c_void_p), ("scales", c_void_p), ("bias", c_void_p), ("n", c_int64),
                ("k", c_int64)]


class DecodeLayerC(ctypes.Structure):
    """A layer's weights and sizes (built once at load; the tensors must outlive it: the model holds them)."""

    _fields_ = [("qkv", QLinearC), ("o", QLinearC), ("gate_up", QLinearC), ("down", QLinearC),
                ("norm1", c_void_p), ("norm2", c_void_p), ("layer", c_int64), ("heads", c_int64),
                ("kv_heads", c_int64), ("head_dim", c_int64), ("hidden", c_int64), ("intermediate", c_int64),
                ("eps", c_float), ("scale", c_float)]


class DecodeStepC(ctypes.Structure):
    """One decode forward's metadata, shared by every layer (its tensors must outlive the forward)."""

    _fields_ = [("positions", c_void_p), ("cos_sin", c_void_p), ("max_pos", c_int64), ("k_base", c_void_p),
                ("v_base", c_void_p), ("layer_bytes", c_int64), ("num_slots", c_int64), ("kv_row", c_int64),
                ("kv_dtype", c_int32), ("nthreads", c_int32), ("loc", c_void_p), ("req_to_token", c_void_p),
                ("r2t_rows", c_int64), ("r2t_stride", c_int64), ("rows", c_void_p), ("lens", c_void_p)]


def qlinear(kind: str, qweight: torch.Tensor, scales: torch.Tensor, bias: torch.Tensor | None, n: int,
            k: int) -> QLinearC:
    """The struct for one natively packed projection."""
    return QLinearC(INT8 if kind == "int8" else INT4, qweight.data_ptr(), scales.data_ptr(),
                    None if bias is None else bias.data_ptr(), n, k)


class DecodeLayerFailed(RuntimeError):
    """The fused layer stopped at a bad input (a slot, position, length or row out of range); the per-op path
    raises the precise ValueError for the same input."""


def decode_layer_cpu(lib: ctypes.CDLL, layer: DecodeLayerC, step: DecodeStepC, x: torch.Tensor,
                     residual: torch.Tensor, first: bool,
                     extend: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> None:
    """Run one layer in place: x [M, hidden] -> the layer's output, residual -> the residual stream (float32,
    contiguous; first=True: residual is only written). extend = (prefix, ext, start), int64 [M] each: attention
    as one-token extends (deterministic inference, csrc/decode_layer.cpp:sglpy_decode_layer_extend)."""
    args = (ctypes.byref(layer), ctypes.byref(step), x.data_ptr(), residual.data_ptr(), 1 if first else 0, x.shape[0])
    if extend is None:
        rc = lib.sglpy_decode_layer(*args)
    else:
        rc = lib.sglpy_decode_layer_extend(*args, *(t.data_ptr() for t in extend))
    if rc != 0:
        stage = "rotary/KV store" if rc < _SECOND_STAGE else "attention"
        raise DecodeLayerFailed(f"native decode layer {layer.layer}: {stage} rejected its input (code {rc})")

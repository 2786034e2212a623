"""ctypes mirrors of csrc/decode_layer.cpp's structs and its one-call decoder layer (a decode step's layer for
weight-only quantized projections in the native layout); the model's per-op path is its oracle."""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int32, c_int64, c_void_p

import torch

INT8, INT4 = 0, 1  # QLinear.kind
_FIRST_STAGE, _SECOND_STAGE, _LORA_STAGE = 1_000_000_000, 2_000_000_000, 3_000_000_000


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


class LoraProjC(ctypes.Structure):
    """One fused projection's adapter pool (csrc/lora.cpp's layout: A [slots, slices * R, in], Bt [slots, R, out]);
    a = None: the projection is not adapted."""

    _fields_ = [("a", c_void_p), ("bt", c_void_p), ("offsets", c_void_p), ("n_slices", c_int64)]


class LoraLayerC(ctypes.Structure):
    """A layer's adapter pools (built once with the pool; the tensors must outlive it: the pool holds them)."""

    _fields_ = [("qkv", LoraProjC), ("o", LoraProjC), ("gate_up", LoraProjC), ("down", LoraProjC)]


class LoraStepC(ctypes.Structure):
    """One forward's adapter segments (kernels/lora.py:LoraSegments) and the pool's sizes, shared by every layer."""

    _fields_ = [("rows", c_void_p), ("indptr", c_void_p), ("slots", c_void_p), ("ranks", c_void_p),
                ("n_seg", c_int64), ("num_slots", c_int64), ("pool_rank", c_int64), ("w_dtype", c_int32)]


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
                     extend: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
                     lora: tuple[LoraLayerC, LoraStepC] | None = None) -> None:
    """Run one layer in place: x [M, hidden] -> the layer's output, residual -> the residual stream (float32,
    contiguous; first=True: residual is only written). extend = (prefix, ext, start), int64 [M] each: attention
    as one-token extends (deterministic inference, csrc/decode_layer.cpp:sglpy_decode_layer_extend). lora = (the
    layer's adapter pools, the forward's segments): each adapted projection adds its rows' LoRA deltas
    (sglpy_decode_layer_lora; not together with extend: deterministic inference refuses LoRA)."""
    args = (ctypes.byref(layer), ctypes.byref(step), x.data_ptr(), residual.data_ptr(), 1 if first else 0, x.shape[0])
    if lora is not None:
        if extend is not None:
            raise ValueError("the fused decode layer runs LoRA adapters only with decode attention (no extend)")
        rc = lib.sglpy_decode_layer_lora(*args, ctypes.byref(lora[0]), ctypes.byref(lora[1]))
    elif extend is None:
        rc = lib.sglpy_decode_layer(*args)
    else:
        rc = lib.sglpy_decode_layer_extend(*args, *(t.data_ptr() for t in extend))
    if rc != 0:
        stage = "rotary/KV store" if rc < _SECOND_STAGE else "attention" if rc < _LORA_STAGE else "LoRA segments"
        raise DecodeLayerFailed(f"native decode layer {layer.layer}: {stage} rejected its input (code {rc})")

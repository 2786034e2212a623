"""The CPU decode fast path: each decoder layer of a small decode step as one native call (kernels/csrc/
decode_layer.cpp) when every projection is natively packed (quantization int8/int4 with the native kernels built).

Owns: which forwards qualify (decode-only, at most NATIVE_MAX_ROWS rows, the native decode-attention plan), the
per-layer weight structs (built once per model), the LoRA adapter pools' structs (built once, when the model's
projections are wrapped by runtime/lora/pool.py), the per-forward step struct, and the layer loop. The per-op path
(LlamaDecoderLayer.forward) stays the oracle and runs everything else: prefill, mixed and big steps, quantization
none, tensor parallelism, and any step whose input the fused layer rejects (it then raises the precise error).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels.cpu_native import DTYPE_CODES, pool_readable
from sglpy.kernels.decode_layer_cpu import (DecodeLayerC, DecodeLayerFailed, DecodeStepC, LoraLayerC, LoraProjC,
                                            LoraStepC, decode_layer_cpu, qlinear)
from sglpy.kernels.lora import LoraSegments
from sglpy.kernels.lora_cpu import WEIGHT_DTYPES
from sglpy.kernels.decode_plan import DecodePlan
from sglpy.kernels.quant_linear_cpu import NATIVE_MAX_ROWS

from .forward_batch import ForwardBatch
from ..memory.kv_manager import KVBuffers


@dataclass(frozen=True)
class NativeStep:
    """One forward's step struct and the tensors it points into (kept alive with it)."""

    lib: ctypes.CDLL
    step: DecodeStepC
    keep: tuple[torch.Tensor, ...]
    extend: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None  # deterministic: (prefix, ext, start)
    lora: LoraStepC | None = None  # the forward's adapter segments (their tensors in keep)


@dataclass(frozen=True)
class NativeLora:
    """The adapter pools of every layer for the fused layers (the pool's tensors outlive it: the model holds them)."""

    layers: tuple[LoraLayerC, ...]
    num_slots: int
    pool_rank: int
    w_dtype: int  # DTYPE_CODES of the pool
    keep: tuple[torch.Tensor, ...]  # the slices' offsets


_LORA_PROJS = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj")  # = LoraLayerC's fields, in order


def _packed(module: nn.Module):
    """The PackedLinear of a natively packed QuantizedLinear, else None (float32, torch layout, TP wrappers).
    LoRA's LoraLinear and deterministic inference's RowByRowLinear are looked through: the fused layer runs the
    wrapped GEMV (and the adapters' deltas, build_lora_structs)."""
    module = getattr(module, "base", module)  # LoraLinear
    p = getattr(getattr(module, "inner", module), "packed", None)
    return p if p is not None and p.native else None


def build_lora_structs(model: nn.Module) -> NativeLora | None:
    """The fused layers' view of the LoRA pool wrapped around the model's projections (runtime/lora/pool.py), or
    None when no projection is wrapped or the pool's layout is one the native kernel does not read."""
    layers, keep, pools = [], [], []
    for layer in model.model.layers:
        projs = []
        for name in _LORA_PROJS:
            mod = getattr(layer.self_attn if name in ("qkv_proj", "o_proj") else layer.mlp, name)
            a, bt = getattr(mod, "a", None), getattr(mod, "bt", None)
            if a is None:
                projs.append(LoraProjC(None, None, None, 0))
                continue
            if a.device.type != "cpu" or a.dtype not in WEIGHT_DTYPES or bt.dtype != a.dtype \
                    or not a.is_contiguous() or not bt.is_contiguous():
                return None
            offsets = torch.tensor(mod.offsets, dtype=torch.int64)
            keep.append(offsets)
            pools.append((a.shape[0], bt.shape[1], a.dtype))
            projs.append(LoraProjC(a.data_ptr(), bt.data_ptr(), offsets.data_ptr(), len(mod.offsets) - 1))
        layers.append(LoraLayerC(*projs))
    if not pools or len(set(pools)) != 1:
        return None
    slots, rank, dtype = pools[0]
    return NativeLora(tuple(layers), slots, rank, DTYPE_CODES[dtype], tuple(keep))


def build_layer_structs(model: nn.Module) -> list[DecodeLayerC] | None:
    """Per-layer structs for the fused decode layer, or None when any projection is not natively packed."""
    structs = []
    for i, layer in enumerate(model.model.layers):
        attn, mlp = layer.self_attn, layer.mlp
        mods = [attn.qkv_proj, attn.o_proj, mlp.gate_up_proj, mlp.down_proj]
        packed = [_packed(m) for m in mods]
        if any(p is None for p in packed):
            return None
        norms = [layer.input_layernorm, layer.post_attention_layernorm]
        if any(n.weight.dtype != torch.float32 or not n.weight.is_contiguous() for n in norms) \
                or norms[0].eps != norms[1].eps:
            return None
        hidden = packed[1].out_features
        structs.append(DecodeLayerC(
            *(qlinear(p.kind, p.qweight, p.scales, p.bias, p.out_features, p.in_features) for p in packed),
            norms[0].weight.data_ptr(), norms[1].weight.data_ptr(), i, attn.num_heads, attn.num_kv_heads,
            attn.head_dim, hidden, packed[3].in_features, norms[0].eps, attn.scale))
    return structs


def native_step(lib: ctypes.CDLL | None, fb: ForwardBatch, kv: KVBuffers, decode: DecodePlan | None,
                rope_cache: torch.Tensor, lora: NativeLora | None = None) -> NativeStep | None:
    """The step struct when this forward qualifies for the fused layers, else None (adapter rows need `lora`)."""
    t = fb.num_tokens
    if lib is None or decode is None or decode.native is None or fb.num_decode != t or t == 0 \
            or t > NATIVE_MAX_ROWS or (fb.lora is not None and (lora is None or decode.batch_invariant)):
        return None
    k, v = kv.k_buffer, kv.v_buffer
    # the step addresses layer l's pool at base + l * stride(0): the [layers, slots, ...] buffers must be contiguous
    if (not pool_readable(k[0], v[0]) or not k.is_contiguous() or k.stride() != v.stride()
            or rope_cache.dtype != torch.float32 or not rope_cache.is_contiguous()):
        return None
    keep = (fb.positions.contiguous(), fb.out_cache_loc.contiguous(), decode.req_pool_indices, decode.seq_lens)
    if any(x.dtype != torch.int64 for x in keep):
        return None
    positions, loc, rows, lens = keep
    r2t = decode.req_to_token
    step = DecodeStepC(positions.data_ptr(), rope_cache.data_ptr(), rope_cache.shape[0], k.data_ptr(), v.data_ptr(),
                       k.stride(0) * k.element_size(), k.shape[1], k.stride(1), DTYPE_CODES[k.dtype],
                       torch.get_num_threads(), loc.data_ptr(), r2t.data_ptr(), r2t.shape[0], r2t.shape[1],
                       rows.data_ptr(), lens.data_ptr())
    if decode.batch_invariant:  # deterministic inference: attention as one-token extends (DecodePlan)
        extend = (decode.prefix_lens, decode.extend_lens, decode.starts)
        if any(t.dtype != torch.int64 or not t.is_contiguous() for t in extend):
            return None
        return NativeStep(lib, step, keep + extend, extend)
    if fb.lora is not None:
        seg: LoraSegments = fb.lora
        idx = (seg.rows, seg.indptr, seg.slots, seg.ranks)
        if any(x.dtype != torch.int64 or x.device.type != "cpu" or not x.is_contiguous() for x in idx):
            return None
        lora_step = LoraStepC(*(x.data_ptr() for x in idx), len(seg.host_slots), lora.num_slots, lora.pool_rank,
                              lora.w_dtype)
        return NativeStep(lib, step, keep + idx, lora=lora_step)
    return NativeStep(lib, step, keep)


def run_native_layers(structs: list[DecodeLayerC], ns: NativeStep, x: torch.Tensor,
                      lora: NativeLora | None = None) -> tuple[torch.Tensor, torch.Tensor] | None:
    """Every decoder layer on the native path: (x, residual) as the per-op loop returns them, or None when a layer
    rejected its input (a slot, position, length or row out of range; the per-op path then raises the precise
    ValueError for it). `x` is left untouched. lora: the adapter pools, read when the step carries segments."""
    # x: [tokens, hidden] float32, the embedding output
    h = x.to(torch.float32, copy=True).contiguous()  # updated in place layer by layer
    residual = torch.empty_like(h)
    try:
        for i, layer in enumerate(structs):
            decode_layer_cpu(ns.lib, layer, ns.step, h, residual, first=i == 0, extend=ns.extend,
                             lora=None if ns.lora is None else (lora.layers[i], ns.lora))
    except DecodeLayerFailed:
        return None
    return h, residual

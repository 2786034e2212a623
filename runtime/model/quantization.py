"""Quantize-at-load of our model: weight-only int8/int4 linear layers and the lm_head's own quantized copy; the
batch-invariant linear layers of deterministic inference (RowByRowLinear)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels.cpu_native import native_isa, native_lib
from sglpy.kernels.quant_linear import (PackedLinear, dequantize_int4, dequantize_int8, pack_linear,
                                        quant_linear_unchecked, quantize_int4, quantize_int8)
from sglpy.kernels.quant_linear_cpu import (NATIVE_MAX_ROWS, SCALE_TILE, linear_f32_cpu, native_layout_fits,
                                            quant_linear_cpu)
from ..config import QUANTIZATION_MODES

INT4_GROUP_SIZE = 32  # GGUF Q4_1's block: the embedded model's weights sit exactly on this grid


def resolve_quantization(mode: str, device: torch.device, model: nn.Module | None = None,
                         tensor_parallel: bool = False) -> str:
    """The mode that runs. 'auto': none off CPU; on CPU int4 when `model`'s projections already sit on a 4-bit
    grid (int4_loses_nothing), else int8. Both pass the quality gate on the default model (benchmarks/README.md).

    Under tensor parallelism auto is int8 on CPU: each rank sees only its shards, and every rank must run the same
    mode. Quantized outputs depend on the batch a request runs in (bf16 roundings; docs/runtime.md); `none`
    (float32) is the mode whose outputs equal HF's and do not depend on the batch."""
    if mode not in QUANTIZATION_MODES:
        raise ValueError(f"quantization must be one of {QUANTIZATION_MODES}, got {mode!r}")
    if mode == "auto":
        if device.type != "cpu":
            return "none"
        return "int4" if not tensor_parallel and model is not None and int4_loses_nothing(model) else "int8"
    if mode != "none" and device.type != "cpu":
        raise ValueError(f"quantization={mode!r} runs on CPU only (device is {device}); use none or auto")
    return mode


def _projections(layer: nn.Module) -> list[nn.Linear]:
    """The fused projections of one decoder layer (what quantize_model replaces)."""
    mlp = [layer.mlp.gate_up_proj, layer.mlp.down_proj] if hasattr(layer.mlp, "gate_up_proj") else []  # MoE: none
    return [layer.self_attn.qkv_proj, layer.self_attn.o_proj] + mlp


def int4_loses_nothing(model: nn.Module) -> bool:
    """True when the first and last layers' projections re-quantized to int4 (group 32) are at least as close
    to them as int8 is (checking every layer took ~10 s at load; a checkpoint quantizes its layers alike).

    That happens when the weights came from 4-bit blocks (a Q4_0/Q4_1 GGUF such as the embedded default model:
    int4 then only re-rounds the block scales, ~0.4% relative error vs int8's ~0.9%); ordinary float weights
    lose ~10% to int4 and stay with int8.
    """
    return int4_loses_nothing_in([model.model.layers[0], model.model.layers[-1]])


def int4_loses_nothing_in(layers: list[nn.Module]) -> bool:
    """int4_loses_nothing over these (float, fused) decoder layers."""
    lins = [getattr(p, "inner", p) for layer in layers for p in _projections(layer)]  # unwrapped
    return all(on_4bit_grid(lin.weight) for lin in lins)


def on_4bit_grid(weight: torch.Tensor) -> bool:
    """Whether int4 (group 32) re-quantizes this float [N, K] weight at least as closely as int8 does."""
    with torch.no_grad():
        w = weight.detach().to(torch.float32)
        n, k = w.shape
        if n % 16 or k % INT4_GROUP_SIZE:
            return False
        err4 = (dequantize_int4(*quantize_int4(w, INT4_GROUP_SIZE), INT4_GROUP_SIZE) - w).norm()
        return bool(err4 <= (dequantize_int8(*quantize_int8(w)) - w).norm())


def dense_copy_dtype() -> torch.dtype:
    """dtype of the dense weight copy for many-row calls: bf16 on CPUs with native bf16 matmul (AMX or
    AVX512-BF16), where a bf16 GEMM beats the packed kernels from 8 rows; float32 elsewhere (from 16 rows), where a
    bf16 GEMM is emulated and slow. A native kernel level forced below avx512 (SGLPY_CPU_ISA=avx2|baseline) stands
    for a CPU without either, so it takes the float32 copy too."""
    cpu = torch.cpu
    native = bool(getattr(cpu, "_is_amx_tile_supported", lambda: False)()
                  or getattr(cpu, "_is_avx512_bf16_supported", lambda: False)())
    isa = native_isa()
    if isa is not None and isa != "avx512":
        native = False
    return torch.bfloat16 if native else torch.float32


class QuantizedLinear(nn.Module):
    """Drop-in for nn.Linear over a PackedLinear weight (weight-only quantized, CPU)."""

    def __init__(self, packed: PackedLinear):
        super().__init__()
        self.packed = packed
        self.in_features, self.out_features = packed.in_features, packed.out_features

    @classmethod
    def from_weight(cls, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                    dense: torch.dtype | None, keep_dense: bool = True) -> "QuantizedLinear":
        """Quantize an fp32 [out, in] weight per `mode` ('int8' or 'int4'); `dense`: dtype of many-row calls' weights,
        kept as a copy (keep_dense, or where the native kernels do not run) or dequantized per call in tiles."""
        if not keep_dense and native_lib() is not None:
            return cls(pack_linear(weight, bias, mode, INT4_GROUP_SIZE, tiles=dense))
        return cls(pack_linear(weight, bias, mode, INT4_GROUP_SIZE, dense=dense))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return quant_linear_unchecked(x, self.packed)  # x: [M, in] -> [M, out]

    def extra_repr(self) -> str:
        p = self.packed
        return f"{p.kind}, in={p.in_features}, out={p.out_features}, dense_copy={p.dense is not None}"


CUDA_TILE_ROWS = 64  # deterministic inference on CUDA: every GEMM is [64, in] x [in, out] (rows zero-padded)
TILE_ROWS = 64  # deterministic inference on CPU: prefill rows run the dense copy as [64, in] GEMMs (zero-padded)


@dataclass
class RowSplit:
    """Deterministic inference, quantized weights on CPU: which rows of this forward hold generated tokens.
    Generated tokens (decode rows, drafts, jump-forward spans) run the native GEMV, prompt tokens the dense copy in
    fixed 64-row tiles: each row's kernel follows from its own token, never from the batch, the chunking or the
    cache (a prompt's last token is a prompt row whether it ends a full prefill or a one-token chunk).
    The runner `prepare`s each forward's rows; the model `begin`s the forward (no prepared rows: all generated, as
    in a decode-only graph step)."""

    prepared: torch.Tensor | None = None  # bool [tokens]: True = a generated token (set by prepare)
    native: torch.Tensor | None = None  # the layers' rows of this forward (None: every row native)
    head_native: torch.Tensor | None = None  # the lm_head's rows (logits_indices of `native`)

    def prepare(self, entries) -> None:
        """Mark the generated-token rows of a forward over BatchEntry's, in build_host_batch's row order."""
        kinds: list[bool] = []
        for e in entries:
            if e.draft:
                kinds.extend([True] * (1 + len(e.draft)))
                continue
            n = len(e.req.input_ids)
            kinds.extend(p >= n for p in range(e.prefix_len, e.prefix_len + e.extend_len))
        self.prepared = torch.tensor(kinds, dtype=torch.bool)

    def begin(self, num_tokens: int, logits_indices: torch.Tensor) -> None:
        """Start a forward of num_tokens rows: take the prepared rows (if they fit it), else all generated."""
        mask, self.prepared = self.prepared, None
        if mask is None or mask.shape[0] != num_tokens or bool(mask.all()):
            self.native = self.head_native = None
            return
        self.native = mask
        self.head_native = mask[logits_indices.to(mask.device)]


class RowByRowLinear(nn.Module):
    """A linear layer whose row m depends on input row m alone (deterministic inference, docs/determinism.md).

    Wraps a float nn.Linear (quantization none) or a packed QuantizedLinear. Float32 weights on CPU run the native
    kernel (csrc/quant_gemv.cpp, one reduction order for every row count); natively packed weights already do (no
    dense copy is kept). Without the native kernels each row is its own call: slow, but never batch-dependent.
    On CUDA every call is cut into zero-padded tiles of CUDA_TILE_ROWS rows, so cuBLAS always sees one shape and
    picks one kernel (the GPU check, tests/kernels/test_determinism_gpu.py, measures that rows then agree)."""

    def __init__(self, inner: nn.Module, split: RowSplit | None = None, head: bool = False):
        super().__init__()
        self.inner, self.split, self.head = inner, split, head
        self.in_features, self.out_features = inner.in_features, inner.out_features
        w = getattr(inner, "weight", None)
        self.native_f32 = (w is not None and w.device.type == "cpu" and w.dtype == torch.float32
                           and w.is_contiguous() and native_lib() is not None)
        self.cuda_tiles = w is not None and w.device.type == "cuda"
        packed = getattr(inner, "packed", None)
        native = packed is not None and packed.native and native_lib() is not None
        self.native_packed = native and packed.dense is None
        # by row kind (RowSplit): quantized with a dense copy, or float32 on CPU (MKL's GEMM for the prompt tiles)
        self.split_dense = split is not None and ((native and packed.dense is not None) or self.native_f32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, in] -> [M, out]
        if self.native_f32 and not self.split_dense:
            return self._native(x)
        if self.cuda_tiles:
            m, t = x.shape[0], CUDA_TILE_ROWS
            if m == 0:  # a forward whose chunk samples nothing (chunked prefill) asks the head for no rows
                return self.inner.forward(x)
            xp = torch.nn.functional.pad(x, (0, 0, 0, (-m) % t)) if m % t else x
            return torch.cat([self.inner.forward(xp[i:i + t]) for i in range(0, xp.shape[0], t)])[:m]
        if self.split_dense:
            native = self.split.head_native if self.head else self.split.native
            if native is None or native.shape[0] != x.shape[0]:
                return self._native(x)
            if not bool(native.any()):
                return self._dense_tiles(x)
            y = torch.empty(x.shape[0], self.out_features, dtype=x.dtype)
            y[native] = self._native(x[native])
            y[~native] = self._dense_tiles(x[~native])
            return y
        if self.native_packed or x.shape[0] <= 1:
            return self.inner.forward(x)
        return torch.cat([self.inner.forward(x[i:i + 1]) for i in range(x.shape[0])])

    def _native(self, x: torch.Tensor) -> torch.Tensor:
        # x: [m, in] -> [m, out], the native GEMV at any m (float32 weights or the packed ones)
        if self.native_f32:
            b = self.inner.bias
            y = linear_f32_cpu(native_lib(), x, self.inner.weight, None if b is None else b.detach())
        else:
            p = self.inner.packed
            y = quant_linear_cpu(native_lib(), x, p.kind, p.qweight, p.scales, p.bias, p.out_features)
        return y if y.dtype == x.dtype else y.to(x.dtype)

    def _dense_tiles(self, x: torch.Tensor) -> torch.Tensor:
        # x: [m, in] -> [m, out]: [64, in] GEMMs on the dense weights (the packed layer's copy, or the float weight)
        if self.native_f32:
            w, bias = self.inner.weight, self.inner.bias
        else:
            w, bias = self.inner.packed.dense, self.inner.packed.bias
        m, t = x.shape[0], TILE_ROWS
        if m == 0:
            return x.new_empty((0, self.out_features))
        xd = x if x.dtype == w.dtype else x.to(w.dtype)
        xd = torch.nn.functional.pad(xd, (0, 0, 0, (-m) % t)) if m % t else xd
        y = torch.cat([torch.nn.functional.linear(xd[i:i + t], w) for i in range(0, xd.shape[0], t)])[:m]
        y = y if y.dtype == x.dtype else y.to(x.dtype)
        return y if bias is None else y + bias.detach().to(x.dtype)


class _HeadWeight(nn.Module):
    """The (tied) output projection's weight as a bias-free linear layer, for RowByRowLinear."""

    def __init__(self, weight: torch.Tensor):
        super().__init__()
        self.weight, self.bias = weight, None
        self.out_features, self.in_features = weight.shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()  # x: [M, in] -> [M, out]


class DecodeRowsLinear(nn.Module):
    """quantization none on CPU: forwards of up to NATIVE_MAX_ROWS rows (decode steps, speculative verify steps) run
    the native float32 GEMV, whose row m depends on input row m alone; more rows run torch's GEMM. torch's float32
    GEMM gives a row other bits at every row count (M = 1 vs 2-16), so a verify row could pick another token than a
    one-row step of the same sequence (docs/speculative.md). The cost (benchmarks/README.md, "Speculative decoding"):
    on a 2-vCPU EPYC the GEMV beat torch's GEMM at one row; on an AMX Xeon a one-row decode step's projections
    take ~1.2x the CPU time of torch's (the 49,152-wide head 12.3 vs 9.9 ms), 5-row verify steps ~0.75x."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner
        self.in_features, self.out_features = inner.in_features, inner.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # x: [M, in] -> [M, out]
        if x.shape[0] > NATIVE_MAX_ROWS or x.dtype != torch.float32:
            return self.inner.forward(x)
        b = self.inner.bias
        return linear_f32_cpu(native_lib(), x, self.inner.weight, None if b is None else b.detach())


def route_decode_rows(model: nn.Module) -> int:
    """Wrap every float32 linear layer of a CPU model (the float head included) in DecodeRowsLinear, when the native
    kernels are built; returns how many were wrapped."""
    def fits(m: nn.Module) -> bool:
        w = getattr(m, "weight", None)
        return (type(m) in (nn.Linear, _HeadWeight) and w is not None and w.device.type == "cpu"
                and w.dtype == torch.float32 and w.is_contiguous())

    if model.model.embed_tokens.weight.device.type != "cpu" or native_lib() is None:
        return 0
    count = 0
    with torch.no_grad():
        for layer in model.model.layers:
            for parent in list(layer.modules()):
                for name, child in list(parent.named_children()):
                    if fits(child):
                        setattr(parent, name, DecodeRowsLinear(child))
                        count += 1
        if model.logits_head is None:
            head = _HeadWeight(model.lm_head_weight().detach())
            if fits(head):
                model.set_lm_head(DecodeRowsLinear(head))
                count += 1
    return count


def make_batch_invariant(model: nn.Module) -> int:
    """Route every linear layer of a loaded (and quantized) model built batch-invariant through RowByRowLinear, the
    lm_head included, so that no row's logits depend on the other rows of its forward; returns how many were
    wrapped. On CPU the wrappers share the model's RowSplit (given at build time: loader.load_model)."""
    if model.model.embed_tokens.weight.device.type not in ("cpu", "cuda"):
        return 0
    def needs_wrap(m: nn.Module) -> bool:
        if isinstance(m, QuantizedLinear):  # natively packed without a dense copy: one kernel for every M already
            return not (m.packed.native and m.packed.dense is None and native_lib() is not None)
        return isinstance(m, nn.Linear)

    split = model.row_split
    count = 0
    with torch.no_grad():
        for layer in model.model.layers:
            for parent in list(layer.modules()):
                moe = hasattr(parent, "batch_invariant") and hasattr(parent, "top_k")  # a MoEBlock (moe.py)
                for name, child in list(parent.named_children()):
                    if needs_wrap(child):
                        # a router is a few columns: the native GEMV for every row, never the dense 64-row tiles
                        router = moe and name == "gate"
                        setattr(parent, name, RowByRowLinear(child, None if router else split))
                        count += 1
        head = model.logits_head
        if head is None:  # the float (tied) head: its own module now, the weight is shared, not copied
            model.set_lm_head(RowByRowLinear(_HeadWeight(model.lm_head_weight().detach()), split, head=True))
            count += 1
        elif needs_wrap(head):
            model.logits_head = RowByRowLinear(head, split, head=True)
            count += 1
    return count


def _replace(parent: nn.Module, name: str, mode: str, dense: torch.dtype | None, keep_dense: bool,
             packed: PackedLinear | None = None) -> PackedLinear:
    lin = getattr(parent, name)
    if hasattr(lin, "linear"):  # a tensor-parallel RowParallel wrapper: quantize this rank's shard inside it
        parent, name, lin = lin, "linear", lin.linear
    if packed is not None and (packed.kind != mode or packed.out_features != lin.out_features
                               or packed.in_features != lin.in_features):
        raise ValueError(f"packed {name} ({packed.kind} [{packed.out_features}, {packed.in_features}]) does not fit "
                         f"the layer ({mode} [{lin.out_features}, {lin.in_features}])")
    q = QuantizedLinear(packed) if packed is not None else QuantizedLinear.from_weight(lin.weight, lin.bias, mode,
                                                                                      dense, keep_dense)
    setattr(parent, name, q)
    return q.packed


PROJECTIONS = (("self_attn", "qkv_proj"), ("self_attn", "o_proj"), ("mlp", "gate_up_proj"), ("mlp", "down_proj"))


def quantize_layer(layer: nn.Module, mode: str, keep_dense: bool = False,
                   packed: dict[str, PackedLinear] | None = None) -> dict[str, PackedLinear]:
    """Pack one fused decoder layer's projections (its experts, for a mixture of experts); returns the packed
    projections by name (the experts' are not among them). packed: the projections packed by an earlier load
    (runtime/model/pack_cache.py), used as they are."""
    dense = dense_copy_dtype()
    out: dict[str, PackedLinear] = {}
    with torch.no_grad():
        for part, name in PROJECTIONS:
            if name == "gate_up_proj" and hasattr(layer.mlp, "quantize_experts"):  # a mixture of experts packs
                layer.mlp.quantize_experts(mode)  # each expert (moe.py)
                break
            out[name] = _replace(getattr(layer, part), name, mode, dense, keep_dense, (packed or {}).get(name))
    return out


HEAD_CHECK_ROWS = 4096  # vocabulary rows (spread over the table) head_kind judges


def head_kind(weight: torch.Tensor, mode: str | None) -> str:
    """The lm_head copy's format: int4 when the layers run int4 (or auto, still undecided) and the head's weights sit
    on a 4-bit grid (a Q4_0/Q4_1 GGUF's table: re-quantizing only re-rounds its block scales), else int8.

    Every decode step reads the whole head: at Qwen2.5-0.5B's 151,936 x 896 the int8 copy (136 MB) was a third of
    an int4 step's time, the int4 one is half the bytes. A table stored in 8 bits (the default model's Q8_0
    embedding) stays int8: 4 bits lose 15 points of top-1 agreement there (benchmarks/quality_gate.py)."""
    if mode not in ("int4", None) or native_lib() is None:
        return "int8"
    n, k = weight.shape
    if not native_layout_fits("int4", n, k, INT4_GROUP_SIZE):
        return "int8"
    rows = weight[:: max(1, n // HEAD_CHECK_ROWS)][:HEAD_CHECK_ROWS]
    return "int4" if on_4bit_grid(rows[: len(rows) // 16 * 16]) else "int8"


def packed_bytes(layer: nn.Module) -> int:
    """Bytes of a quantized layer's packed weights (its experts' included)."""
    return sum(m.packed.nbytes for m in layer.modules() if isinstance(m, QuantizedLinear))


def quantize_head(model: nn.Module, keep_dense: bool = False, embedding: bool = False,
                  mode: str | None = "int8", packed: PackedLinear | None = None) -> PackedLinear:
    """The lm_head's own quantized copy (head_kind: int8, or int4 for a 4-bit table under `mode` int4/auto(None));
    returns it. embedding: the token lookups then read packed rows too (PackedEmbedding: the tied head's
    copy, else the embedding's own int8 one), freeing the float table. packed: the head packed by an earlier load
    (runtime/model/pack_cache.py)."""
    with torch.no_grad():
        vocab_parallel = model.logits_head is not None and hasattr(model.logits_head, "inner")
        head_weight = model.logits_head.inner.weight if vocab_parallel else model.lm_head_weight()
        if packed is not None and (packed.out_features, packed.in_features) != tuple(head_weight.shape):
            raise ValueError(f"the packed head ({packed.kind} [{packed.out_features}, {packed.in_features}]) does not "
                             f"fit the model's ({tuple(head_weight.shape)})")
        if packed is not None:
            head = QuantizedLinear(packed)
        else:
            kind = "int8" if vocab_parallel else head_kind(head_weight, mode)
            head = QuantizedLinear.from_weight(head_weight, None, kind, dense_copy_dtype(), keep_dense)
        del head_weight
        if vocab_parallel:
            model.logits_head.inner = head  # this rank's vocabulary slice
        else:
            model.set_lm_head(head)
        if embedding and not vocab_parallel:
            emb = model.model.embed_tokens
            if model.tie_word_embeddings and (head.packed.kind == "int8" or head.packed.native):
                model.model.embed_tokens = PackedEmbedding(head.packed.qweight, head.packed.scales, head.packed.kind)
            else:
                model.model.embed_tokens = PackedEmbedding.from_weight(emb.weight)
            del emb
    return head.packed


class PackedEmbedding(nn.Module):
    """Token embedding lookups from a packed table, each gathered row dequantized: no float copy of the vocabulary is
    kept (for a tied model the table is the lm_head's own copy). int8: one scale per row; int4: the native GEMV
    layout (kernels/quant_linear_cpu.py: codes [vocab, K / 32, 16], scales/zeros per tile of 8 rows and group)."""

    def __init__(self, qweight: torch.Tensor, scales: torch.Tensor, kind: str = "int8"):
        super().__init__()
        if kind not in ("int8", "int4"):
            raise ValueError(f"kind must be 'int8' or 'int4', got {kind!r}")
        self.qweight, self.scales, self.kind = qweight, scales, kind  # int8 [vocab, hidden] | uint8 [vocab, G, 16]
        self.weight = qweight  # where the table lives (device checks); its values are the dequantized rows
        self.num_embeddings = qweight.shape[0]
        self.embedding_dim = qweight.shape[1] if kind == "int8" else qweight.shape[1] * 2 * qweight.shape[2]

    @classmethod
    def from_weight(cls, weight: torch.Tensor) -> "PackedEmbedding":
        """Quantize a float [vocab, hidden] table per row (in slices: bounded temporaries)."""
        parts = [quantize_int8(weight[i:i + 4096]) for i in range(0, weight.shape[0], 4096)]
        return cls(torch.cat([q for q, _ in parts]), torch.cat([s for _, s in parts]).to(torch.float32))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        # ids: [tokens] -> [tokens, hidden] float32
        if self.kind == "int8":
            return self.qweight[ids].to(torch.float32) * self.scales[ids].to(torch.float32)[:, None]
        q = self.qweight[ids]  # [tokens, G, 16]: input i in the low nibble, i + 16 in the high one
        codes = torch.cat([q & 15, q >> 4], dim=-1).to(torch.float32)  # [tokens, G, 32]
        sz = self.scales[ids // SCALE_TILE, :, :, ids % SCALE_TILE].to(torch.float32)  # [tokens, G, 2]
        return ((codes - 8.0) * sz[..., 0:1] + sz[..., 1:2]).reshape(len(ids), self.embedding_dim)


def quantize_model(model: nn.Module, mode: str, dense: bool = False, skip_layers: bool = False) -> int:
    """Replace every projection of a loaded, fused LlamaForCausalLM by its quantized form; returns weight bytes.

    The lm_head gets its own quantized copy (head_kind: int8 per channel, int4 in mode int4 when the table sits on a
    4-bit grid); while loading (LayerPacker) the embedding lookups read the packed rows as well (PackedEmbedding),
    here they stay exact.
    Many-row calls (prefill chunks and batches) multiply weights in dense_copy_dtype() (bf16 above 8 rows where the
    CPU multiplies bf16 natively, 5-12x faster than the packed kernels there; float32 above 16 rows elsewhere):
    dequantized per call, a tile of output rows at a time (kernels/quant_linear_cpu.py: tiled_linear_cpu), so only
    the packed weights stay in memory. dense=True keeps a dequantized copy of every weight instead (deterministic
    inference's fixed 64-row tiles read it; also where the native kernels do not run).
    Under tensor parallelism each rank quantizes its own shards: per output channel, a column-parallel shard
    gets exactly the numbers of tp=1; a row-parallel shard's channel scale covers its own input columns.
    A model built batch_invariant (deterministic inference) gets every linear layer wrapped in RowByRowLinear
    (make_batch_invariant): decode rows run the native GEMV at any row count, prefill rows the dense copy in fixed
    64-row tiles. Otherwise mode none on CPU runs forwards of up to 16 rows on the native float32 GEMV (route_decode_rows).
    skip_layers: the decoder layers and the head were packed while loading (LayerPacker).
    """
    if mode not in ("none", "int8", "int4"):
        raise ValueError(f"quantize_model takes none, int8 or int4 (resolve 'auto' first), got {mode!r}")
    if mode == "none":
        if model.batch_invariant:
            make_batch_invariant(model)
        else:
            route_decode_rows(model)
        return 0
    if skip_layers:
        total = 0
    else:
        for layer in model.model.layers:
            quantize_layer(layer, mode, dense)
        total = sum(map(packed_bytes, model.model.layers)) + quantize_head(model, dense, mode=mode).nbytes
    if model.batch_invariant:
        make_batch_invariant(model)
    return total


class LayerPacker:
    """Packs each decoder layer as the loader finishes it (loader.load_model's on_layer), so the float weights of at
    most two layers are ever held. Quantization 'auto' is decided on the first and the last layer, which the loader
    hands over first (int4_loses_nothing); `mode` is what runs once decided. cache: the packed weights of an earlier
    load of this model (runtime/model/pack_cache.py), used instead of packing; what is packed here is recorded in it
    and written by finish()."""

    def __init__(self, requested: str, device: torch.device, keep_dense: bool = False, cache=None):
        self.requested, self.device, self.keep_dense, self.cache = requested, device, keep_dense, cache
        self.mode: str | None = None if requested == "auto" else resolve_quantization(requested, device)
        if cache is not None and cache.hit:
            self.mode = cache.mode  # what 'auto' decided for these weights before
        self.pending: list[tuple[int, nn.Module]] = []
        self.used = False  # the loader streamed the model through it (not a vision-language checkpoint)

    def __call__(self, model: nn.Module, index: int | None) -> None:
        self.used = True
        cache = self.cache
        if index is None:  # the embedding, final norm and head came first (head_kind: int8, or int4 from a 4-bit table)
            if self.mode != "none" and (self.mode is not None or self.device.type == "cpu"):
                head = quantize_head(model, self.keep_dense, embedding=not self.keep_dense, mode=self.mode,
                                     packed=cache.head() if cache is not None else None)
                if cache is not None:
                    cache.record("head", head)
            return
        self.pending.append((index, model.model.layers[index]))
        last = len(model.model.layers) - 1
        if self.mode is None:
            if len(self.pending) < 2 and index != last:
                return  # the last layer comes next
            four = self.device.type == "cpu" and int4_loses_nothing_in([layer for _, layer in self.pending])
            self.mode = resolve_quantization("auto", self.device) if not four else "int4"
        if self.mode != "none":
            for i, layer in self.pending:
                packed = quantize_layer(layer, self.mode, self.keep_dense,
                                        packed=cache.layer(i) if cache is not None else None)
                if cache is not None:
                    for name, p in packed.items():
                        cache.record(f"layers.{i}.{name}", p)
        self.pending = []

    def finish(self) -> None:
        """The model is loaded: write what was packed to the cache when it was not there."""
        if self.cache is not None and self.used and self.mode not in (None, "none"):
            self.cache.save(self.mode)

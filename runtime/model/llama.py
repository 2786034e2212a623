"""Llama-family decoder (Llama/SmolLM2, Mistral, Qwen2) reading and writing K/V through pool slots."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from sglpy.kernels import build_rope_cache
from sglpy.kernels.activation import silu_and_mul
from sglpy.kernels.cpu_native import native_lib
from sglpy.kernels.extend_attention import extend_attention_planned
from sglpy.kernels.decode_plan import DecodePlan, decode_attention_planned, plan_decode_attention
from sglpy.kernels.rmsnorm import rmsnorm_unchecked
from sglpy.kernels.rotary import RotaryPlan, plan_rotary
from sglpy.kernels.rotary_store import rotate_and_store
from .families import LLAMA_ARCHITECTURES, SUPPORTED_ARCHITECTURES, architecture  # noqa: F401 - re-exported
from .forward_batch import ForwardBatch
from .native_decode import build_layer_structs, build_lora_structs, native_step, run_native_layers
from ..memory.kv_manager import KVBuffers

QWEN2_TYPES = ("qwen2", "qwen2_vl_text", "qwen2_5_vl_text")  # q/k/v biases, none on o_proj (Qwen2-VL's decoder too)


def rope_settings(config) -> tuple[float, dict | None]:
    """(rope_theta, scaling dict or None) from a transformers 4.x or 5.x config."""
    params = getattr(config, "rope_parameters", None) or {}
    theta = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
    scaling = getattr(config, "rope_scaling", None) or params
    rope_type = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    return float(theta), (None if rope_type in (None, "default") else dict(scaling, rope_type=rope_type))


def fused_linear(weights: list[torch.Tensor], biases: list[torch.Tensor] | None) -> nn.Linear:
    """One Linear whose rows are `weights` stacked (and `biases`): built on meta, so no random init is computed
    only to be overwritten (that init was a few seconds of every engine start)."""
    w = weights[0]
    with torch.device("meta"):
        fused = nn.Linear(w.shape[1], sum(x.shape[0] for x in weights), bias=biases is not None, dtype=w.dtype)
    with torch.no_grad():
        fused.weight = nn.Parameter(torch.cat(weights), requires_grad=w.requires_grad)
        if biases is not None:
            fused.bias = nn.Parameter(torch.cat(biases), requires_grad=w.requires_grad)
    return fused


@dataclass(frozen=True)
class StepPlan:
    """Per-forward work shared by every layer: rotary cos/sin and how decode attention reads K/V."""

    rope: RotaryPlan
    decode: DecodePlan | None  # None when the forward has no decode requests


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: torch.Tensor, residual: torch.Tensor | None = None):
        return rmsnorm_unchecked(x, self.weight, self.eps, residual)  # shapes fixed at load


class LlamaAttention(nn.Module):
    def __init__(self, config, layer_id: int, shard=None):
        super().__init__()
        self.layer_id = layer_id
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        if shard is not None:  # tensor parallel: this rank's heads only (model/parallel.py)
            self.num_heads, self.num_kv_heads = shard.heads, shard.kv_heads
        self.scale = self.head_dim ** -0.5
        qwen2 = config.model_type in QWEN2_TYPES
        bias = qwen2 or bool(getattr(config, "attention_bias", False))
        h = config.hidden_size
        self.q_proj = nn.Linear(h, self.num_heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(h, self.num_kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * self.head_dim, h, bias=bool(getattr(config, "attention_bias", False)) and not qwen2)

    def fuse(self) -> None:
        """Replace q/k/v projections by one matmul (fewer, larger GEMMs; called after loading weights)."""
        projs = [self.q_proj, self.k_proj, self.v_proj]
        self.qkv_proj = fused_linear([p.weight for p in projs],
                                     [p.bias for p in projs] if projs[0].bias is not None else None)
        del self.q_proj, self.k_proj, self.v_proj

    def forward(self, x: torch.Tensor, fb: ForwardBatch, kv: KVBuffers, plan: StepPlan) -> torch.Tensor:
        t = x.shape[0]
        k_cache, v_cache = kv.k_buffer[self.layer_id], kv.v_buffer[self.layer_id]
        # q, k rotated inside the fused projection, k, v written to the pool; q: [tokens, heads, head_dim] (a view)
        q = rotate_and_store(self.qkv_proj(x), self.num_heads, self.num_kv_heads, self.head_dim, plan.rope,
                             k_cache, v_cache, fb.out_cache_loc)
        nd = fb.num_decode
        if nd == t:
            o = decode_attention_planned(q, k_cache, v_cache, plan.decode, self.scale)
        elif nd == 0:
            o = extend_attention_planned(q, k_cache, v_cache, fb.req_to_token, fb.req_pool_indices,
                                         fb.prefix_lens, fb.extend_lens, self.scale, fb.max_extend_len)
        else:  # mixed step: decode rows first, then extend rows
            o = torch.cat([
                decode_attention_planned(q[:nd], k_cache, v_cache, plan.decode, self.scale),
                extend_attention_planned(q[nd:], k_cache, v_cache, fb.req_to_token, fb.req_pool_indices[nd:],
                                         fb.prefix_lens[nd:], fb.extend_lens[nd:], self.scale, fb.max_extend_len),
            ])
        return self.o_proj(o.reshape(t, self.num_heads * self.head_dim))


class LlamaMLP(nn.Module):
    def __init__(self, config, shard=None):
        super().__init__()
        h, i = config.hidden_size, (config.intermediate_size if shard is None else shard.intermediate)
        self.gate_proj = nn.Linear(h, i, bias=False)
        self.up_proj = nn.Linear(h, i, bias=False)
        self.down_proj = nn.Linear(i, h, bias=False)

    def fuse(self) -> None:
        """One matmul for gate and up projections (called after loading weights)."""
        self.gate_up_proj = fused_linear([self.gate_proj.weight, self.up_proj.weight], None)
        del self.gate_proj, self.up_proj

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(silu_and_mul(self.gate_up_proj(x)))


class LlamaDecoderLayer(nn.Module):
    def __init__(self, config, layer_id: int, shard=None):
        super().__init__()
        self.self_attn = LlamaAttention(config, layer_id, shard)
        self.mlp = LlamaMLP(config, shard)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(self, x, residual, fb, kv, plan):
        # residual carries the running sum; the fused norm adds it (HF order: add, then norm)
        # .forward() directly: nn.Module.__call__ costs ~0.7 us a call, ~270 calls a step (no hooks are used)
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, fb, kv, plan)
        x, residual = self.post_attention_layernorm.forward(x, residual)
        return self.mlp.forward(x), residual


class LlamaModel(nn.Module):
    def __init__(self, config, shard=None):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)  # replicated under TP
        self.layers = nn.ModuleList(LlamaDecoderLayer(config, i, shard) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class LlamaForCausalLM(nn.Module):
    """The model. forward() returns logits only for fb.logits_indices.

    `shard` (a model/parallel.py ShardShape) sizes one tensor-parallel rank's layers; None = the whole model.
    `batch_invariant` / `row_split`: deterministic inference (loader.load_model passes them; quantization.py).
    Other families (runtime/model/decoder.py) subclass it through build_decoder and forward.
    """

    def __init__(self, config, shard=None, batch_invariant: bool = False, row_split=None):
        super().__init__()
        self.config = config
        # deterministic inference (docs/determinism.md): attention in fixed key blocks, MoE experts row by row, and
        # on CPU the RowSplit (quantization.py) that routes each forward's rows of the linear layers by kind
        self.batch_invariant = batch_invariant
        self.row_split = row_split
        self.model = self.build_decoder(config, shard)
        self.tie_word_embeddings = bool(getattr(config, "tie_word_embeddings", False))
        if not self.tie_word_embeddings:
            self.lm_head = nn.Linear(config.hidden_size, config.vocab_size if shard is None else shard.vocab,
                                     bias=False)
        attn = self.model.layers[0].self_attn
        self.num_kv_heads, self.head_dim = attn.num_kv_heads, attn.head_dim
        self.rope_cache: torch.Tensor | None = None
        self.logits_head: nn.Module | None = None  # replaces the (tied) lm_head matmul when set (quantization)
        self.native_layers = None  # per-layer structs of the fused CPU decode layer (prepare_native_decode)
        self.native_lora = None  # the LoRA pool's structs for the fused layers (prepare_native_decode)

    def build_decoder(self, config, shard) -> nn.Module:
        """The decoder stack (embedding, layers, final norm) for `config`."""
        arch = architecture(config)
        if arch not in LLAMA_ARCHITECTURES:
            raise ValueError(f"{arch} is not a Llama-family architecture (build it with decoder.build_model)")
        return LlamaModel(config, shard)

    def fuse_projections(self) -> None:
        """Fuse q/k/v and gate/up weights once the HF-named weights are loaded."""
        for layer in self.model.layers:
            self.fuse_layer(layer)
        self.finish_fusing()

    def fuse_layer(self, layer: nn.Module) -> None:
        """Fuse one layer's projections once its weights are loaded (the loader streams layer by layer)."""
        layer.self_attn.fuse()
        layer.mlp.fuse()

    def finish_fusing(self) -> None:
        """What fusing does once every layer is fused (nothing for the Llama family)."""

    def lm_head_weight(self) -> torch.Tensor:
        """The output projection's weight [vocab, hidden]: the embedding's when tied."""
        return self.model.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight

    def set_lm_head(self, head: nn.Module) -> None:
        """Compute logits with `head` (its own copy, e.g. quantized); the embedding lookup is untouched."""
        self.logits_head = head
        if not self.tie_word_embeddings:
            del self.lm_head  # the head now holds the only copy

    def prepare_native_decode(self) -> bool:
        """Build the fused CPU decode layers' structs when every projection is natively packed (call after
        quantizing and after a LoRA pool wrapped the projections); small decode steps then run one native call per
        layer, adapter rows included (runtime/model/native_decode.py)."""
        on_cpu = self.model.embed_tokens.weight.device.type == "cpu"
        self.native_layers = build_layer_structs(self) if on_cpu and native_lib() is not None else None
        self.native_lora = build_lora_structs(self) if self.native_layers else None
        return self.native_layers is not None

    def init_rope(self, max_pos: int, device, dtype) -> None:
        """Build the cos/sin table once the model is on its device."""
        theta, scaling = rope_settings(self.config)
        self.rope_cache = build_rope_cache(self.head_dim, max_pos, theta, scaling, dtype=dtype).to(device)

    def embed(self, fb: ForwardBatch) -> torch.Tensor:
        """The input embeddings of a forward's tokens [tokens, hidden] (vision models also place image tokens')."""
        return self.model.embed_tokens(fb.input_ids)

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, kv: KVBuffers) -> torch.Tensor:
        x = self.embed(fb)  # x: [tokens, hidden]
        if self.row_split is not None:  # deterministic inference: which rows hold generated tokens (quantization.py)
            self.row_split.begin(fb.input_ids.shape[0], fb.logits_indices)
        nd = fb.num_decode
        # metadata checked and index tensors built once here, not once per layer
        plan = StepPlan(plan_rotary(fb.positions, self.rope_cache),
                        plan_decode_attention(fb.req_to_token, fb.req_pool_indices[:nd], fb.seq_lens[:nd],
                                             self.batch_invariant)
                        if nd else None)
        # adapter rows (fb.lora) run in the fused layers too, from the LoRA pool's structs (runtime/lora/pool.py)
        ns = native_step(native_lib(), fb, kv, plan.decode, self.rope_cache, self.native_lora) \
            if self.native_layers else None
        fused = run_native_layers(self.native_layers, ns, x, self.native_lora) if ns is not None else None
        if fused is not None:
            x, residual = fused
        else:  # the per-op path (also for an input the fused layers rejected: it raises the precise ValueError)
            residual = None
            for layer in self.model.layers:
                x, residual = layer.forward(x, residual, fb, kv, plan)
        x, _ = self.model.norm(x, residual)
        x = x[fb.logits_indices]  # only the rows we sample from or score
        if self.logits_head is not None:
            return self.logits_head(x).float()
        w = self.model.embed_tokens.weight if self.tie_word_embeddings else self.lm_head.weight
        return (x @ w.t()).float()  # logits: [m, vocab]

"""The decoder of the non-Llama families (Qwen3, Gemma 2/3, Phi-3/4, Mixtral, Qwen3-MoE), built from a Family
(runtime/model/families.py) over the Llama model's pieces: per-head q/k norms, (1 + w) and sandwich norms,
scaled embeddings, GeGLU, per-layer sliding windows and rope tables, soft-capping, mixtures of experts.

Runs the per-op torch path (the native CPU decode layer knows none of these features); attention runs the same
kernels as Llama (native CPU / Triton / torch reference), each layer passing its sliding window and logit soft-cap
as constants of the call (no host reads: the decode step can be captured in a CUDA graph).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from sglpy.kernels.activation import silu_and_mul
from sglpy.kernels.decode_plan import DecodePlan, decode_attention_planned, plan_decode_attention
from sglpy.kernels.extend_attention import extend_attention_planned
from sglpy.kernels.kv_store import store_kv_unchecked
from .families import Family, family_of, layer_windows, moe_layers
from .forward_batch import ForwardBatch
from .llama import LlamaAttention, LlamaForCausalLM, LlamaMLP, RMSNorm
from .moe import MoEBlock
from .rope import RopeRows, gather_rows, layer_rope_keys, rope_tables, rotate
from ..memory.kv_manager import KVBuffers


@dataclass(frozen=True)
class FamilyStepPlan:
    """Per-forward work shared by the layers: cos/sin rows per rope table, the decode attention plan."""

    rope: dict[str | None, RopeRows]
    decode: DecodePlan | None


class FamilyAttention(LlamaAttention):
    def __init__(self, config, fam: Family, layer_id: int, window: int | None, rope_key: str | None, shard=None):
        super().__init__(config, layer_id, shard)  # shard: this tensor-parallel rank's heads (q/k norms are per head)
        if fam.qk_norm:  # Qwen3 / Gemma 3: RMSNorm over each head's q and k before rotary
            self.q_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
            self.k_norm = RMSNorm(self.head_dim, config.rms_norm_eps)
        scalar = getattr(config, "query_pre_attn_scalar", None)
        if fam.gemma_norms and scalar:
            self.scale = float(scalar) ** -0.5
        self.qk_norm, self.window, self.rope_key = fam.qk_norm, window, rope_key
        self.softcap = getattr(config, "attn_logit_softcapping", None) or None

    def forward(self, x: torch.Tensor, fb: ForwardBatch, kv: KVBuffers, plan: FamilyStepPlan) -> torch.Tensor:
        t, h, g, d = x.shape[0], self.num_heads, self.num_kv_heads, self.head_dim
        k_cache, v_cache = kv.k_buffer[self.layer_id], kv.v_buffer[self.layer_id]
        q, k, v = self.qkv_proj(x).split([h * d, g * d, g * d], dim=-1)  # x: [t, hidden] -> [t, (h + 2g) d]
        q, k, v = q.reshape(t, h, d), k.reshape(t, g, d), v.reshape(t, g, d)
        if self.qk_norm:  # contiguous rows: with one kv head, k.reshape is a strided view that counts as contiguous
            # only at t == 1, so a lone decode row would run the native norm and a batched one torch's (other bits)
            q = self.q_norm.forward(q.reshape(t * h, d).contiguous())[0].view(t, h, d)
            k = self.k_norm.forward(k.reshape(t * g, d).contiguous())[0].view(t, g, d)
        rows = plan.rope[self.rope_key]
        q, k = rotate(q, rows), rotate(k, rows)
        store_kv_unchecked(k_cache, v_cache, fb.out_cache_loc, k, v.contiguous())
        o = _attention(q, k_cache, v_cache, fb, plan.decode, self.scale, self.window, self.softcap)
        return self.o_proj(o.reshape(t, h * d))


def _attention(q, k_cache, v_cache, fb: ForwardBatch, decode: DecodePlan | None, scale: float,
               window: int | None, softcap: float | None) -> torch.Tensor:
    """Causal attention through the kernels (decode rows first, then extend rows), as Llama runs it, within the
    layer's sliding window and with its logit soft-cap (None: none)."""
    nd, t = fb.num_decode, q.shape[0]
    if nd == t:
        return decode_attention_planned(q, k_cache, v_cache, decode, scale, window, softcap)
    ext = extend_attention_planned(q[nd:], k_cache, v_cache, fb.req_to_token, fb.req_pool_indices[nd:],
                                   fb.prefix_lens[nd:], fb.extend_lens[nd:], scale, fb.max_extend_len, window, softcap)
    if nd == 0:
        return ext
    return torch.cat([decode_attention_planned(q[:nd], k_cache, v_cache, decode, scale, window, softcap), ext])


class FamilyMLP(LlamaMLP):
    def __init__(self, config, act: str, shard=None):
        super().__init__(config, shard)
        self.act = act

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gu = self.gate_up_proj(x)  # [t, 2 inter]
        if self.act == "silu":
            return self.down_proj(silu_and_mul(gu))
        gate, up = gu.chunk(2, dim=-1)
        return self.down_proj(F.gelu(gate, approximate="tanh") * up)  # GeGLU (Gemma's gelu_pytorch_tanh)


class FamilyDecoderLayer(nn.Module):
    def __init__(self, config, fam: Family, layer_id: int, window: int | None, rope_key: str | None, moe: bool,
                 shard=None, batch_invariant: bool = False):
        super().__init__()
        eps = config.rms_norm_eps
        self.self_attn = FamilyAttention(config, fam, layer_id, window, rope_key, shard)
        self.mlp = MoEBlock(config, fam.name, shard, batch_invariant) if moe else FamilyMLP(config, fam.act, shard)
        self.input_layernorm = RMSNorm(config.hidden_size, eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, eps)
        self.sandwich = fam.gemma_norms
        if self.sandwich:  # Gemma: the attention and feed-forward outputs are normed before the residual add
            self.pre_feedforward_layernorm = RMSNorm(config.hidden_size, eps)
            self.post_feedforward_layernorm = RMSNorm(config.hidden_size, eps)

    def forward(self, x, residual, fb, kv, plan):
        x, residual = self.input_layernorm.forward(x, residual)
        x = self.self_attn.forward(x, fb, kv, plan)
        if not self.sandwich:
            x, residual = self.post_attention_layernorm.forward(x, residual)
            return self.mlp.forward(x), residual
        x = self.post_attention_layernorm.forward(x)[0]
        x, residual = self.pre_feedforward_layernorm.forward(x, residual)
        return self.post_feedforward_layernorm.forward(self.mlp.forward(x))[0], residual


class FamilyModel(nn.Module):
    def __init__(self, config, fam: Family, shard=None, batch_invariant: bool = False):
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        windows, keys, moe = layer_windows(config), layer_rope_keys(config), moe_layers(config)
        self.layers = nn.ModuleList(FamilyDecoderLayer(config, fam, i, windows[i], keys[i], fam.moe and moe[i], shard,
                                                       batch_invariant)
                                    for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class FamilyForCausalLM(LlamaForCausalLM):
    """A non-Llama family's model; the same interface as LlamaForCausalLM (loader, runner, quantization)."""

    def build_decoder(self, config, shard) -> nn.Module:
        self.family = family_of(config)
        self.final_softcap = getattr(config, "final_logit_softcapping", None) or None
        self.rope_tables = {}
        return FamilyModel(config, self.family, shard, self.batch_invariant)

    def finish_fusing(self) -> None:
        """Fold Gemma's (1 + w) into the norm weights (once, after every layer's projections and experts are
        fused by fuse_layer)."""
        if self.family.gemma_norms:
            with torch.no_grad():
                for name, mod in self.model.named_modules():
                    if isinstance(mod, RMSNorm):
                        mod.weight.add_(1.0)

    def prepare_native_decode(self) -> bool:
        """The fused native CPU decode layer has none of this family's features: the per-op path runs."""
        self.native_layers = None
        return False

    def init_rope(self, max_pos: int, device, dtype) -> None:
        """Build every rope table this model's layers read; drop the windows no sequence within max_pos exceeds
        (they never apply: those layers run plain causal attention)."""
        for layer in self.model.layers:
            if layer.self_attn.window is not None and layer.self_attn.window >= max_pos:
                layer.self_attn.window = None
        self.rope_tables = {k: type(t)(t.cache.to(device=device, dtype=dtype), t.rot_dim)
                            for k, t in rope_tables(self.config, self.head_dim, max_pos).items()}
        self.rope_cache = next(iter(self.rope_tables.values())).cache

    def rope_rows(self, fb: ForwardBatch) -> dict[str | None, RopeRows]:
        """cos/sin rows of this forward's positions per rope table (Qwen2-VL's multimodal positions override it)."""
        return {k: gather_rows(t, fb.positions) for k, t in self.rope_tables.items()}

    @torch.inference_mode()
    def forward(self, fb: ForwardBatch, kv: KVBuffers) -> torch.Tensor:
        x = self.embed(fb)  # x: [tokens, hidden]
        if self.row_split is not None:  # deterministic inference: which rows hold generated tokens (quantization.py)
            self.row_split.begin(fb.input_ids.shape[0], fb.logits_indices)
        if self.family.embed_scale:
            x = x * torch.tensor(self.config.hidden_size ** 0.5, dtype=x.dtype)
        nd = fb.num_decode
        plan = FamilyStepPlan(self.rope_rows(fb),
                              plan_decode_attention(fb.req_to_token, fb.req_pool_indices[:nd], fb.seq_lens[:nd],
                                                    self.batch_invariant)
                              if nd else None)
        residual = None
        for layer in self.model.layers:
            x, residual = layer.forward(x, residual, fb, kv, plan)
        x, _ = self.model.norm(x, residual)
        x = x[fb.logits_indices]  # only the rows we sample from or score
        if self.logits_head is not None:
            logits = self.logits_head(x).float()
        else:
            logits = (x @ self.lm_head_weight().t()).float()  # [m, vocab]
        if self.final_softcap:
            logits = torch.tanh(logits / self.final_softcap) * self.final_softcap
        return logits


def build_model(config, shard=None, batch_invariant: bool = False, row_split=None) -> LlamaForCausalLM:
    """Our model for `config`: LlamaForCausalLM for the Llama family, FamilyForCausalLM for the others."""
    cls = LlamaForCausalLM if family_of(config) is None else FamilyForCausalLM
    return cls(config, shard, batch_invariant, row_split)

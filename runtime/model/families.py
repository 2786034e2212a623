"""Which architectures the runtime runs and what each family needs: the features of its decoder, its checkpoint's
tensor names, and the engine features it cannot run (refused with an error naming the combination)."""

from __future__ import annotations

from dataclasses import dataclass, field

LLAMA_ARCHITECTURES = ("LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM")


@dataclass(frozen=True)
class Family:
    """One architecture family's decoder features (read by runtime/model/decoder.py)."""

    name: str
    qk_norm: bool = False  # per-head RMSNorm of q and k before rotary (Qwen3, Gemma 3)
    gemma_norms: bool = False  # RMSNorm scales by (1 + w); pre/post attention and feed-forward norms
    embed_scale: bool = False  # embeddings times sqrt(hidden) (Gemma)
    act: str = "silu"  # gate activation: silu or gelu_tanh (GeGLU)
    moe: bool = False  # the MLP is a top-k mixture of experts (Mixtral, Qwen3-MoE)
    window_all_layers: bool = False  # config.sliding_window (when set) applies to every layer, not per layer_types
    # engine features this family refuses, each with why (the runner and loader check them)
    unsupported: dict[str, str] = field(default_factory=dict)


_NO_NATIVE = "the native CPU decode layer has no {}"

FAMILIES = {
    "Qwen3ForCausalLM": Family("qwen3", qk_norm=True),
    "Gemma2ForCausalLM": Family("gemma2", gemma_norms=True, embed_scale=True, act="gelu_tanh"),
    "Gemma3ForCausalLM": Family("gemma3", qk_norm=True, gemma_norms=True, embed_scale=True, act="gelu_tanh"),
    "Phi3ForCausalLM": Family("phi3", window_all_layers=True),
    "MixtralForCausalLM": Family("mixtral", moe=True, window_all_layers=True),
    "Qwen3MoeForCausalLM": Family("qwen3_moe", qk_norm=True, moe=True, window_all_layers=True),
}
# vision-language models (runtime/model/vlm.py): their decoder is one of the above; what they refuse, and why
VISION_ARCHITECTURES = ("LlavaForConditionalGeneration", "Qwen2VLForConditionalGeneration",
                        "Qwen2_5_VLForConditionalGeneration")
VISION_UNSUPPORTED = {"tp": "the vision encoder runs whole on rank 0's device (no sharded encoder yet)"}
SUPPORTED_ARCHITECTURES = LLAMA_ARCHITECTURES + tuple(FAMILIES) + VISION_ARCHITECTURES


def architecture(config) -> str:
    """The config's architecture name (Llama when the config names none)."""
    arch = (getattr(config, "architectures", None) or ["LlamaForCausalLM"])[0]
    if arch == "Gemma3ForConditionalGeneration" and hasattr(config, "text_config"):
        raise ValueError("Gemma3ForConditionalGeneration (vision + text) is not supported: use a text-only "
                         "Gemma3ForCausalLM checkpoint")
    if arch not in SUPPORTED_ARCHITECTURES:
        raise ValueError(f"unsupported architecture {arch!r}; supported: {SUPPORTED_ARCHITECTURES}")
    return arch


def family_of(config) -> Family | None:
    """The Family of a non-Llama architecture, or None for the Llama family (runtime/model/llama.py as is)."""
    return FAMILIES.get(architecture(config))


def check_feature(config, feature: str, what: str, max_context: int | None = None) -> None:
    """ValueError naming the combination when this model refuses `feature` (tp, cuda_graph, quantization); CUDA
    graphs depend on the model's layers within `max_context` (default: max_position_embeddings)."""
    if architecture(config) in VISION_ARCHITECTURES:
        if feature in VISION_UNSUPPORTED:
            raise ValueError(f"{what} is not supported with {architecture(config)}: {VISION_UNSUPPORTED[feature]}")
        return
    fam = family_of(config)
    why = fam.unsupported.get(feature) if fam is not None else None
    if feature == "cuda_graph" and fam is not None:
        why = graph_blocker(config, max_context)
    if why is not None:
        raise ValueError(f"{what} is not supported with {architecture(config)} ({fam.name}): {why}")


def graph_blocker(config, max_context: int | None = None) -> str | None:
    """Why this model's decode step cannot be captured in a CUDA graph (None: it can). Expert groups are counted on
    the host each step; sliding windows and soft-caps are per-layer constants of the attention kernels, so they
    never block (max_context no longer matters; kept for the callers)."""
    if any(moe_layers(config)):
        return "its experts are grouped on the host each step (runtime/model/moe.py)"
    return None


def determinism_blocker(config, device_type: str = "cpu") -> str | None:
    """Why deterministic inference is refused for this model on `device_type` (None: it is not): experts off CPU.
    On CPU a mixture of experts runs every row through the native per-row call (runtime/model/moe.py); the fused
    Triton kernel groups tokens per expert by the batch. Sliding windows and soft-caps are constants of the native
    attention kernels, which keep their fixed key blocks with them (the batch-invariance matrix covers Gemma 2 and
    3 and both MoE families, docs/determinism.md)."""
    if device_type != "cpu" and any(moe_layers(config)):
        return "its experts are grouped per step by the batch in the fused kernel (runtime/model/moe.py)"
    return None


def fit_quantization(config, requested: str) -> str:
    """The quantization mode to resolve: 'auto' becomes none for a family that cannot quantize; an explicit
    int8/int4 there is refused."""
    fam = family_of(config)
    if requested == "none" or fam is None or "quantization" not in fam.unsupported:
        return requested
    if requested == "auto":
        return "none"
    check_feature(config, "quantization", f"quantization={requested!r}")
    return requested


def layer_windows(config) -> list[int | None]:
    """Each layer's sliding window in tokens (None: global attention)."""
    fam = family_of(config)
    n, window = config.num_hidden_layers, getattr(config, "sliding_window", None)
    if fam is None or not window:
        return [None] * n
    if fam.window_all_layers:
        return [int(window)] * n
    types = getattr(config, "layer_types", None) or ["full_attention"] * n
    return [int(window) if t == "sliding_attention" else None for t in types]


def moe_layers(config) -> list[bool]:
    """Which layers hold a mixture of experts (Qwen3-MoE: decoder_sparse_step and mlp_only_layers)."""
    n = config.num_hidden_layers
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", 0) or 0
    if experts == 0:
        return [False] * n
    step = getattr(config, "decoder_sparse_step", 1) or 1
    dense = set(getattr(config, "mlp_only_layers", None) or [])
    return [i not in dense and (i + 1) % step == 0 for i in range(n)]


def remap_checkpoint(config, state: dict) -> dict:
    """Rename a family's checkpoint tensors onto the decoder's names: Phi-3's fused qkv/gate_up are split,
    Mixtral's block_sparse_moe.experts.N.w1/w3/w2 become mlp.experts.N.gate/up/down_proj."""
    fam = family_of(config)
    if fam is None:
        return state
    out = {}
    for k, v in state.items():
        if fam.name == "phi3" and k.endswith("self_attn.qkv_proj.weight"):
            heads = config.num_attention_heads
            kv = getattr(config, "num_key_value_heads", None) or heads
            d = getattr(config, "head_dim", None) or config.hidden_size // heads
            q, kk, vv = v.split([heads * d, kv * d, kv * d])
            base = k[: -len("qkv_proj.weight")]
            out.update({base + "q_proj.weight": q, base + "k_proj.weight": kk, base + "v_proj.weight": vv})
        elif fam.name == "phi3" and k.endswith("mlp.gate_up_proj.weight"):
            g, u = v.chunk(2)
            base = k[: -len("gate_up_proj.weight")]
            out.update({base + "gate_proj.weight": g, base + "up_proj.weight": u})
        elif fam.name == "mixtral" and ".block_sparse_moe." in k:
            k = k.replace(".block_sparse_moe.", ".mlp.")
            for old, new in ((".w1.", ".gate_proj."), (".w3.", ".up_proj."), (".w2.", ".down_proj.")):
                k = k.replace(old, new)
            out[k] = v
        else:
            out[k] = v
    return out

"""GGUF files of the non-Llama families as llama.cpp writes them (qwen3, qwen3moe, gemma2, gemma3, phi3, and
Mixtral, which llama.cpp stores as `llama` with expert tensors) -> an HF folder: config rebuilt from the GGUF
metadata, tensors renamed to HF's checkpoint names with llama.cpp's conversions undone.

transformers' own GGUF reader misses pieces these families need (expert tensors of a `llama` file, Gemma 2's
soft-caps, Gemma 3's local rope base, Phi-3's LongRoPE factors, Qwen3's head_dim and the experts' width), so the
loader sends these files here and the Llama family's to transformers."""

from __future__ import annotations

import functools
import json
import pathlib
import re

# GGUF architecture -> HF architecture (llama with expert_count > 0 is Mixtral)
GGUF_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3moe": "Qwen3MoeForCausalLM", "gemma2": "Gemma2ForCausalLM",
                      "gemma3": "Gemma3ForCausalLM", "phi3": "Phi3ForCausalLM"}
_CONFIG_CLASSES = {"Qwen3ForCausalLM": "Qwen3Config", "Qwen3MoeForCausalLM": "Qwen3MoeConfig",
                   "Gemma2ForCausalLM": "Gemma2Config", "Gemma3ForCausalLM": "Gemma3TextConfig",
                   "Phi3ForCausalLM": "Phi3Config", "MixtralForCausalLM": "MixtralConfig"}

# llama.cpp tensor name (after blk.N.) -> HF name (after model.layers.N.); per-family differences below
_LAYER_NAMES = {
    "attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}
_GEMMA_NAMES = {"ffn_norm": "pre_feedforward_layernorm", "post_attention_norm": "post_attention_layernorm",
                "post_ffw_norm": "post_feedforward_layernorm"}
_PHI3_NAMES = {"attn_qkv": "self_attn.qkv_proj", "ffn_up": "mlp.gate_up_proj"}  # llama.cpp keeps them fused
_TOP_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
              "output.weight": "lm_head.weight"}
# MoE: router and stacked experts [experts, out, in]; the HF checkpoint stores one tensor per expert
_MOE_NAMES = {"mixtral": ("block_sparse_moe", {"gate": "w1", "up": "w3", "down": "w2"}),
              "qwen3moe": ("mlp", {"gate": "gate_proj", "up": "up_proj", "down": "down_proj"})}
_GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # llama.cpp scales queries by hidden/heads for the 27B models


@functools.lru_cache(maxsize=1)
def readable_tensor_types() -> tuple[str, ...]:
    """The GGUF tensor types the installed `gguf` package dequantizes (probed with one zero block of each):
    F32, F16, BF16, Q4_0..Q8_0, the K-quants Q2_K..Q6_K, the IQ types (not Q8_1/Q8_K, llama.cpp's scratch types)."""
    import gguf
    import numpy as np

    readable = []
    for qtype, (_, type_size) in gguf.GGML_QUANT_SIZES.items():
        try:
            gguf.quants.dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
        except NotImplementedError:
            continue
        readable.append(qtype.name)
    return tuple(readable)


def check_tensor_types(path: str | pathlib.Path) -> None:
    """Raise ValueError naming the first tensor whose type the gguf package cannot dequantize (and its type)."""
    import gguf

    readable = readable_tensor_types()
    for t in gguf.GGUFReader(str(path)).tensors:
        if t.tensor_type.name not in readable:
            version = _gguf_version()
            raise ValueError(f"{pathlib.Path(path).name}: GGUF tensor {t.name!r} is stored as {t.tensor_type.name}, "
                             f"which the installed gguf package ({version}) cannot dequantize; readable types: "
                             f"{', '.join(readable)}")


def _gguf_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("gguf")
    except PackageNotFoundError:
        return "unknown version"


def _metadata(reader) -> dict:
    """Every key of the file except the (large) tokenizer arrays, as Python values."""
    big = ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "tokenizer.ggml.scores", "tokenizer.ggml.token_type")
    return {k: f.contents() for k, f in reader.fields.items() if k not in big}


def gguf_hf_architecture(path: str | pathlib.Path, reader=None) -> str | None:
    """The HF architecture this module converts the file to, or None (the file goes to transformers' reader)."""
    import gguf

    reader = reader or gguf.GGUFReader(str(path))
    arch = reader.fields["general.architecture"].contents()
    if arch == "llama" and f"{arch}.expert_count" in reader.fields and reader.fields[f"{arch}.expert_count"].contents():
        return "MixtralForCausalLM"
    return GGUF_ARCHITECTURES.get(arch)


def _config_fields(meta: dict, arch: str, tensors: dict, hf_arch: str) -> dict:
    """HF config fields from llama.cpp's metadata keys (and the tensors' shapes where the keys say nothing)."""
    def get(key, default=None):
        return meta.get(f"{arch}.{key}", default)

    hidden, heads = int(get("embedding_length")), int(get("attention.head_count"))
    kv = get("attention.head_count_kv", heads)
    kv = int(max(kv) if isinstance(kv, list) else kv)
    head_dim = int(get("attention.key_length", hidden // heads))
    layers = int(get("block_count"))
    ff = get("feed_forward_length")
    f = dict(vocab_size=int(tensors["token_embd.weight"].shape[0]), hidden_size=hidden, num_hidden_layers=layers,
             num_attention_heads=heads, num_key_value_heads=kv, head_dim=head_dim,
             intermediate_size=int(max(ff) if isinstance(ff, list) else ff),
             max_position_embeddings=int(get("context_length", 4096)),
             rms_norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-6)),
             tie_word_embeddings="output.weight" not in tensors)
    for name, key in (("bos_token_id", "tokenizer.ggml.bos_token_id"), ("eos_token_id", "tokenizer.ggml.eos_token_id"),
                      ("pad_token_id", "tokenizer.ggml.padding_token_id")):
        if key in meta:
            f[name] = int(meta[key])
    theta = float(get("rope.freq_base", 10000.0))
    rope = {"rope_type": "default", "rope_theta": theta}
    if get("rope.scaling.type") == "linear":
        rope = {"rope_type": "linear", "rope_theta": theta, "factor": float(get("rope.scaling.factor"))}
    elif get("rope.scaling.type") == "yarn":  # Qwen3's long-context setting
        rope = {"rope_type": "yarn", "rope_theta": theta, "factor": float(get("rope.scaling.factor")),
                "original_max_position_embeddings": int(get("rope.scaling.original_context_length"))}
    window = get("attention.sliding_window")
    if hf_arch in ("Gemma2ForCausalLM", "Gemma3ForCausalLM"):
        del f["tie_word_embeddings"]  # Gemma always ties
        scalar_27b = layers == _GEMMA_27B_LAYERS[arch]
        f["query_pre_attn_scalar"] = hidden // heads if scalar_27b else head_dim
        f["sliding_window"] = int(window or 4096)
        # llama.cpp's layer pattern: Gemma 2 alternates (every 2nd layer global), Gemma 3 every 6th
        pattern = get("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
        if isinstance(pattern, list):
            f["layer_types"] = ["sliding_attention" if s else "full_attention" for s in pattern]
        else:
            f["layer_types"] = ["full_attention" if (i + 1) % int(pattern) == 0 else "sliding_attention"
                                for i in range(layers)]
        if arch == "gemma2":
            f["attn_logit_softcapping"] = get("attn_logit_softcapping")
            f["final_logit_softcapping"] = get("final_logit_softcapping")
            f["rope_parameters"] = rope
        else:
            local = {"rope_type": "default", "rope_theta": float(get("rope.freq_base_swa", 10000.0))}
            f["rope_parameters"] = {"sliding_attention": local, "full_attention": rope}
    elif hf_arch == "Phi3ForCausalLM":
        f["rope_parameters"] = rope
        rot = get("rope.dimension_count")
        if rot is not None and int(rot) != head_dim:
            f["rope_parameters"]["partial_rotary_factor"] = int(rot) / head_dim
        if "rope_factors_long.weight" in tensors:
            orig = int(get("rope.scaling.original_context_length"))
            f["original_max_position_embeddings"] = orig
            f["rope_parameters"].update(
                rope_type="longrope", factor=f["max_position_embeddings"] / orig,
                long_factor=[float(x) for x in tensors["rope_factors_long.weight"].reshape(-1)],
                short_factor=[float(x) for x in tensors["rope_factors_short.weight"].reshape(-1)])
        f["sliding_window"] = int(window) if window else None
    else:  # Qwen3, Qwen3-MoE, Mixtral
        f["rope_parameters"] = rope
        if window:
            f.update(sliding_window=int(window), use_sliding_window=True)
    if hf_arch == "MixtralForCausalLM":
        f.update(num_local_experts=int(get("expert_count")), num_experts_per_tok=int(get("expert_used_count")))
        f.setdefault("sliding_window", None)
    elif hf_arch == "Qwen3MoeForCausalLM":
        # llama.cpp always renormalises the top k for qwen3moe (every released Qwen3-MoE sets norm_topk_prob)
        f.update(num_experts=int(get("expert_count")), num_experts_per_tok=int(get("expert_used_count")),
                 moe_intermediate_size=int(get("expert_feed_forward_length")), norm_topk_prob=True,
                 decoder_sparse_step=1, mlp_only_layers=[])
    return f


def _unpermute(w, heads: int):
    """Undo llama.cpp's q/k row permutation of `llama` files (its rope pairs adjacent dims, HF's halves)."""
    return w.reshape(heads, w.shape[0] // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _torch(w):
    import numpy as np
    import torch

    if isinstance(w, np.ndarray) and w.flags.writeable and not isinstance(w, np.memmap):
        return torch.from_numpy(np.ascontiguousarray(w, dtype=np.float32))  # our own array: no second copy
    return torch.from_numpy(np.array(w, dtype=np.float32))  # a copy: the reader's arrays are read-only maps


def _hf_state(arch: str, hf_arch: str, tensors: dict, config) -> dict:
    """HF checkpoint tensors (torch, float32) from the file's dequantized arrays."""
    out = {}
    for name, w in tensors.items():
        out.update(hf_tensors(arch, hf_arch, name, w, config))
    return out


def hf_tensors(arch: str, hf_arch: str | None, name: str, w, config: dict):
    """(HF name, float32 torch tensor) pairs for one GGUF tensor `name` (dequantized array `w`): one pair, one per
    expert of a stacked expert tensor, or none (rope factors, read into the config). hf_arch None: a Llama-family
    file (llama, mistral, qwen2), whose `llama` q/k rows llama.cpp permuted (undone here, as transformers does)."""
    names = dict(_LAYER_NAMES)
    if arch in ("gemma2", "gemma3"):
        names.update(_GEMMA_NAMES)
    if arch == "phi3":
        names.update(_PHI3_NAMES)
    moe_key = "mixtral" if hf_arch == "MixtralForCausalLM" else arch
    if name.startswith(("rope_factors_", "rope_freqs")):
        return  # LongRoPE factors are read into the config, llama3's rope_freqs too (runtime/model/gguf_rope.py)
    if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
        w = w - 1.0  # llama.cpp stores Gemma's (1 + w) norm scales with the 1 added
    m = re.fullmatch(r"blk\.(\d+)\.(\w+?)(?:\.(\d+))?\.(weight|bias)", name)
    if m is None:
        if name not in _TOP_NAMES:
            raise ValueError(f"GGUF tensor {name!r} has no HF counterpart for {hf_arch or arch}")
        yield _TOP_NAMES[name], _torch(w)
        return
    layer, short, expert, kind = m.group(1), m.group(2), m.group(3), m.group(4)
    prefix = f"model.layers.{layer}."
    em = re.fullmatch(r"ffn_(gate|up|down)_exps", short) or (
        re.fullmatch(r"ffn_(gate|up|down)", short) if expert is not None else None)
    if moe_key in _MOE_NAMES and (em or short == "ffn_gate_inp"):
        block, proj = _MOE_NAMES[moe_key]
        if short == "ffn_gate_inp":
            yield prefix + block + ".gate.weight", _torch(w)
            return
        stacked = w[None] if expert is not None else w  # older Mixtral files: one tensor per expert
        first = int(expert or 0)
        for e in range(stacked.shape[0]):
            yield f"{prefix}{block}.experts.{first + e}.{proj[em.group(1)]}.weight", _torch(stacked[e])
        return
    if short not in names:
        raise ValueError(f"GGUF tensor {name!r} has no HF counterpart for {hf_arch or arch}")
    if (hf_arch == "MixtralForCausalLM" or (hf_arch is None and arch == "llama")) and short in ("attn_q", "attn_k"):
        heads = config["num_attention_heads"]
        w = _unpermute(w, heads if short == "attn_q" else config.get("num_key_value_heads") or heads)
    yield prefix + names[short] + "." + kind, _torch(w)


def _save_tokenizer(path: pathlib.Path, out_dir: pathlib.Path) -> None:
    """The file's tokenizer (built from tokenizer.ggml.*, chat template included) saved as tokenizer.json."""
    from transformers import PreTrainedTokenizerFast
    from transformers.integrations.gguf import convert_gguf_tokenizer, get_gguf_tokenizer

    arch, tok_dict, tok_config = get_gguf_tokenizer(str(path))
    backend, _ = convert_gguf_tokenizer(arch, tok_dict)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, **{k: v for k, v in tok_config.items() if v is not None})
    tok.save_pretrained(out_dir)


def convert_family_gguf(path: str | pathlib.Path, out_dir: str | pathlib.Path, weights: bool = True) -> pathlib.Path:
    """Write config.json, model.safetensors (dequantized; weights=False: none, the loader reads the GGUF itself)
    and the tokenizer of a family GGUF into out_dir."""
    import gguf
    import numpy as np
    import transformers
    from safetensors.torch import save_file

    path, out_dir = pathlib.Path(path), pathlib.Path(out_dir)
    hf_arch = gguf_hf_architecture(path)
    if hf_arch is None:
        raise ValueError(f"{path.name}: not a GGUF of {sorted(GGUF_ARCHITECTURES)} or Mixtral")
    reader = gguf.GGUFReader(str(path))
    meta = _metadata(reader)
    arch = meta["general.architecture"]
    # dequantize every tensor to float32 numpy in HF's [out, in] order (the reader gives GGUF's reversed dims);
    # without weights only the rope factors are read (the config needs their values, the others' shapes)
    tensors = {t.name: gguf.dequantize(t.data, t.tensor_type) if weights or t.name.startswith("rope_factors_")
               else np.broadcast_to(np.float32(0), tuple(int(d) for d in reversed(t.shape))) for t in reader.tensors}
    fields = _config_fields(meta, arch, tensors, hf_arch)
    config = getattr(transformers, _CONFIG_CLASSES[hf_arch])(**fields)
    config.architectures = [hf_arch]
    out_dir.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(out_dir)
    if weights:
        state = _hf_state(arch, hf_arch, tensors, fields)
        save_file({k: v.contiguous() for k, v in state.items()}, str(out_dir / "model.safetensors"),
                  metadata={"format": "pt"})
    _save_tokenizer(path, out_dir)
    (out_dir / "sglpy_source.json").write_text(json.dumps({"gguf": str(path), "architecture": hf_arch}))
    return out_dir

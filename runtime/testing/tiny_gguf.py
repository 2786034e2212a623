"""Test helper: write a tiny HF folder's weights as a float32 GGUF file the way llama.cpp's converter does (its
tensor names from the gguf package's own name map, its metadata keys, Gemma's norms stored as 1 + w, a `llama`
file's q/k rows permuted, experts stacked, Phi-3's LongRoPE factors and Llama 3's rope divisors as tensors), with
the default model's tokenizer cut to the tiny vocabulary, so the loader's GGUF path is tested without a hub."""

from __future__ import annotations

import json
import os
import pathlib

# HF architecture -> llama.cpp architecture name (Mixtral is written as `llama` with experts, as llama.cpp does)
GGUF_ARCH = {"Qwen3ForCausalLM": "qwen3", "Qwen3MoeForCausalLM": "qwen3moe", "Gemma2ForCausalLM": "gemma2",
             "Gemma3ForCausalLM": "gemma3", "Phi3ForCausalLM": "phi3", "MixtralForCausalLM": "llama",
             "LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2"}  # llama/qwen2: transformers reads the metadata


def _add_tokenizer(writer, vocab: int, pad: bool = False) -> None:
    """The default model's BPE tokenizer (its tokenizer.json) cut to the first `vocab` tokens and the merges among
    them, as llama.cpp's gpt2-style tokenizer fields (reading a 49k-token vocabulary back costs transformers
    seconds); pad: a larger vocab is filled up with tokens no merge reaches (real models' vocabulary sizes)."""
    from .tiny_model import tokenizer_source

    tj = json.loads((tokenizer_source() / "tokenizer.json").read_text())
    by_id = sorted((i, t) for t, i in tj["model"]["vocab"].items() if i < vocab)
    tokens = [t for _, t in by_id]
    kept = set(tokens)
    special = {a["id"] for a in tj.get("added_tokens", []) if a.get("special")}
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
    merges = [m for m in merges if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
    if pad and vocab > len(tokens):
        by_id += [(i, f"[unused{i}]") for i in range(len(tokens), vocab)]
        tokens = [t for _, t in by_id]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i, _ in by_id])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)


def _permute(w, heads: int):
    """llama.cpp's q/k row permutation for `llama` files (its rope rotates adjacent pairs)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _rope_fields(cfg: dict) -> dict:
    params = cfg.get("rope_parameters") or {}
    if "full_attention" in params:  # Gemma 3: the global layers' rope is the file's, the local base its own key
        return dict(params["full_attention"], local_theta=params["sliding_attention"]["rope_theta"])
    return dict(params) if params else {"rope_theta": cfg.get("rope_theta", 10000.0)}


def _write_metadata(w, cfg: dict, arch: str, head_dim: int, rope: dict) -> None:
    import gguf

    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_freq_base(float(rope["rope_theta"]))
    w.add_rope_dimension_count(int(head_dim * float(rope.get("partial_rotary_factor", 1.0))))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    if rope.get("rope_type") == "linear":
        w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(float(rope["factor"]))
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(float(rope["factor"]))
        w.add_rope_scaling_orig_ctx_len(int(rope["original_max_position_embeddings"]))
    if "local_theta" in rope:
        w.add_rope_freq_base_swa(float(rope["local_theta"]))
    if rope.get("rope_type") == "longrope":
        w.add_rope_scaling_orig_ctx_len(cfg["original_max_position_embeddings"])
    if cfg.get("sliding_window") and (arch != "qwen3moe" or cfg.get("use_sliding_window")):
        w.add_sliding_window(cfg["sliding_window"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(cfg["attn_logit_softcapping"])
        w.add_final_logit_softcapping(cfg["final_logit_softcapping"])
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    if experts:
        w.add_expert_count(experts)
        w.add_expert_used_count(cfg["num_experts_per_tok"])
    if cfg.get("moe_intermediate_size") and experts:
        w.add_expert_feed_forward_length(cfg["moe_intermediate_size"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)


def _gguf_tensors(state: dict, cfg: dict, arch: str, rope: dict) -> dict:
    """HF tensors -> llama.cpp's names and layouts (numpy float32)."""
    import re

    import gguf
    import numpy as np
    import torch

    enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == arch)
    names = gguf.get_tensor_name_map(enum, cfg["num_hidden_layers"])
    out, experts = {}, {}
    for hf_name, t in state.items():
        t = t.float()
        m = re.fullmatch(r"(model\.layers\.\d+\.(?:mlp|block_sparse_moe)\.experts)\.(\d+)\.(\w+)\.weight", hf_name)
        if m:  # stacked per projection as llama.cpp does: [experts, out, in]
            experts.setdefault(f"{m.group(1)}.{m.group(3)}", {})[int(m.group(2))] = t
            continue
        if arch in ("gemma2", "gemma3") and hf_name.endswith("norm.weight"):
            t = t + 1.0
        if arch == "llama" and (".q_proj." in hf_name or ".k_proj." in hf_name):
            heads = cfg["num_attention_heads"] if ".q_proj." in hf_name else cfg["num_key_value_heads"]
            t = torch.from_numpy(_permute(t.numpy(), heads))
        base, suffix = hf_name.rsplit(".", 1)  # weight, or bias (Qwen2's q/k/v)
        name = names.get_name(base)
        if name is None:
            raise ValueError(f"no llama.cpp name for {hf_name}")
        out[f"{name}.{suffix}"] = t.numpy()
    for key, per in experts.items():
        name = names.get_name(key)
        if name is None:
            raise ValueError(f"no llama.cpp name for {key}")
        out[name + ".weight"] = torch.stack([per[i] for i in range(len(per))]).numpy()
    if rope.get("rope_type") == "llama3":  # llama.cpp keeps Llama 3's scaling only as per-frequency divisors
        from sglpy.runtime.model.gguf_rope import llama3_divisors

        head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
        out["rope_freqs.weight"] = llama3_divisors(rope, head_dim)
    if rope.get("rope_type") == "longrope":
        out["rope_factors_long.weight"] = np.asarray(rope["long_factor"], dtype=np.float32)
        out["rope_factors_short.weight"] = np.asarray(rope["short_factor"], dtype=np.float32)
    return out


def write_family_gguf(hf_folder: str | os.PathLike, out: str | os.PathLike, quantize: str | None = None) -> str:
    """A float32 GGUF of a tiny HF folder (Qwen3, Qwen3-MoE, Gemma 2/3, Phi-3, Mixtral) in llama.cpp's names and
    layouts, with the default tokenizer cut to the folder's vocab_size (build it small, e.g. 512); returns its path.
    quantize="Q8_0" (or another type gguf.quants.quantize writes: F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1): the matrices
    (experts included) stored in that type's blocks, norms and vectors float32.

    What llama.cpp cannot store is the caller's to avoid: Gemma's query_pre_attn_scalar other than head_dim,
    Gemma 3 layer patterns other than every 6th layer global, per-layer windows other than Gemma's."""
    import gguf
    from safetensors.torch import load_file

    folder, out = pathlib.Path(hf_folder), pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    arch = GGUF_ARCH[cfg["architectures"][0]]
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rope = _rope_fields(cfg)
    w = gguf.GGUFWriter(str(out), arch)
    _write_metadata(w, cfg, arch, head_dim, rope)
    _add_tokenizer(w, cfg["vocab_size"])
    qtype = getattr(gguf.GGMLQuantizationType, quantize) if quantize else None
    for name, array in _gguf_tensors(state, cfg, arch, rope).items():
        if qtype is not None and array.ndim >= 2 and array.shape[-1] % gguf.GGML_QUANT_SIZES[qtype][0] == 0:
            w.add_tensor(name, gguf.quants.quantize(array, qtype), raw_dtype=qtype)
        else:
            w.add_tensor(name, array)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)


def write_qwen3_gguf(hf_folder: str | os.PathLike, out: str | os.PathLike) -> str:
    """write_family_gguf for a Qwen3 folder (kept for existing callers)."""
    return write_family_gguf(hf_folder, out)

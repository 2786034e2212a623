"""Test helper: write a tiny HF folder's weights as a float32 GGUF file the way llama.cpp names them (Qwen3),
with the default model's tokenizer cut to the tiny vocabulary, so the loader's GGUF path is tested without a hub."""

from __future__ import annotations

import json
import os
import pathlib

# HF tensor name (per layer: {i}) -> llama.cpp GGUF name, for the qwen3 architecture
QWEN3_TENSORS = {
    "model.embed_tokens.weight": "token_embd.weight",
    "model.norm.weight": "output_norm.weight",
    "lm_head.weight": "output.weight",
    "model.layers.{i}.input_layernorm.weight": "blk.{i}.attn_norm.weight",
    "model.layers.{i}.self_attn.q_proj.weight": "blk.{i}.attn_q.weight",
    "model.layers.{i}.self_attn.k_proj.weight": "blk.{i}.attn_k.weight",
    "model.layers.{i}.self_attn.v_proj.weight": "blk.{i}.attn_v.weight",
    "model.layers.{i}.self_attn.o_proj.weight": "blk.{i}.attn_output.weight",
    "model.layers.{i}.self_attn.q_norm.weight": "blk.{i}.attn_q_norm.weight",
    "model.layers.{i}.self_attn.k_norm.weight": "blk.{i}.attn_k_norm.weight",
    "model.layers.{i}.post_attention_layernorm.weight": "blk.{i}.ffn_norm.weight",
    "model.layers.{i}.mlp.gate_proj.weight": "blk.{i}.ffn_gate.weight",
    "model.layers.{i}.mlp.up_proj.weight": "blk.{i}.ffn_up.weight",
    "model.layers.{i}.mlp.down_proj.weight": "blk.{i}.ffn_down.weight",
}


def _add_tokenizer(writer, vocab: int) -> None:
    """The default model's BPE tokenizer (its tokenizer.json) cut to the first `vocab` tokens and the merges among
    them, as llama.cpp's gpt2-style tokenizer fields (reading a 49k-token vocabulary back costs transformers
    seconds)."""
    from .tiny_model import tokenizer_source

    tj = json.loads((tokenizer_source() / "tokenizer.json").read_text())
    by_id = sorted((i, t) for t, i in tj["model"]["vocab"].items() if i < vocab)
    tokens = [t for _, t in by_id]
    kept = set(tokens)
    special = {a["id"] for a in tj.get("added_tokens", []) if a.get("special")}
    merges = [" ".join(m) if isinstance(m, list) else m for m in tj["model"]["merges"]]
    merges = [m for m in merges if all(p in kept for p in m.split(" ")) and m.replace(" ", "") in kept]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("smollm")
    writer.add_token_list(tokens)
    writer.add_token_types([3 if i in special else 1 for i, _ in by_id])
    writer.add_token_merges(merges)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_pad_token_id(2)
    writer.add_add_bos_token(False)


def write_qwen3_gguf(hf_folder: str | os.PathLike, out: str | os.PathLike) -> str:
    """A float32 GGUF (architecture qwen3) of the tiny Qwen3 folder's weights, with the default tokenizer cut to the
    folder's vocab_size (build it small, e.g. 512); returns its path."""
    import gguf
    from safetensors.torch import load_file

    folder, out = pathlib.Path(hf_folder), pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    cfg = json.loads((folder / "config.json").read_text())
    state = {}
    for f in sorted(folder.glob("*.safetensors")):
        state.update(load_file(f))
    w = gguf.GGUFWriter(str(out), "qwen3")
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(cfg["num_attention_heads"])
    w.add_head_count_kv(cfg["num_key_value_heads"])
    w.add_key_length(cfg["head_dim"])
    w.add_value_length(cfg["head_dim"])
    w.add_rope_freq_base(float(cfg.get("rope_theta") or cfg["rope_parameters"]["rope_theta"]))
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    _add_tokenizer(w, cfg["vocab_size"])
    for hf_name, tensor in state.items():
        parts = hf_name.split(".")
        key = ".".join("{i}" if p.isdigit() and parts[i - 1] == "layers" else p for i, p in enumerate(parts))
        layer = next((p for i, p in enumerate(parts) if p.isdigit() and parts[i - 1] == "layers"), None)
        w.add_tensor(QWEN3_TENSORS[key].format(i=layer), tensor.float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(out)

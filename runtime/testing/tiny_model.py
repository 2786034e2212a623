"""Test helpers: tiny random-weight HF model folders built from a config in code."""

from __future__ import annotations

import os
import pathlib
import shutil

from ..model.loader import resolve_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


def make_tiny_model(path: str | os.PathLike, arch: str = "llama", seed: int = 0, num_layers: int = 2,
                    hidden: int = 64, heads: int = 4, kv_heads: int = 2, max_pos: int = 2048,
                    tie_word_embeddings: bool = True, intermediate: int | None = None,
                    head_dim: int | None = None) -> str:
    """Write a tiny random-weight Llama/Mistral/Qwen2 folder using the default model's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    tok_src = pathlib.Path(resolve_model_path(None))
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}")
    cfg_cls, model_cls = classes[arch]
    extra = {} if head_dim is None else {"head_dim": head_dim}
    config = cfg_cls(vocab_size=49152, hidden_size=hidden, intermediate_size=intermediate or hidden * 2, **extra,
                     num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                     max_position_embeddings=max_pos, tie_word_embeddings=tie_word_embeddings,
                     bos_token_id=1, eos_token_id=2, pad_token_id=2, rms_norm_eps=1e-5)
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    with torch.no_grad():  # larger-than-default weights so logits are not all near-ties
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, 0.08)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tok_src / name).exists():
            shutil.copy(tok_src / name, tmp / name)
    tmp.rename(path)
    return str(path)

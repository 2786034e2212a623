"""Test helpers: tiny random-weight HF model folders built from a config in code (Llama family and the other
families' scaled-down real configs); presets with real models' shapes (llama-1b), tokenizer export for a GPU machine."""

from __future__ import annotations

import os
import pathlib
import shutil

from ..model.loader import resolve_model_path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")


# Real models' shapes (random weights), vocabulary cut to the default tokenizer's 49152 ids. llama-1b is
# Llama-3.2-1B's config (16 layers, 2048 hidden, 8192 MLP, 32/8 heads, head_dim 64, llama3 rope scaling).
CONFIG_PRESETS = {
    "llama-1b": dict(num_layers=16, hidden=2048, heads=32, kv_heads=8, max_pos=131072, tie_word_embeddings=True,
                     extra=dict(intermediate_size=8192, rope_theta=500000.0, rms_norm_eps=1e-5,
                                rope_scaling={"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0,
                                              "high_freq_factor": 4.0, "original_max_position_embeddings": 8192})),
    "smollm2-135m": dict(num_layers=30, hidden=576, heads=9, kv_heads=3, max_pos=8192, tie_word_embeddings=True,
                         extra=dict(intermediate_size=1536, rope_theta=100000.0)),
}

# where make_tiny_model takes its tokenizer files when set (the GPU machine has no default model: docs/gpu.md)
TOKENIZER_ENV = "SGLPY_TOKENIZER_DIR"


def tokenizer_source() -> pathlib.Path:
    """Folder holding the tokenizer files: $SGLPY_TOKENIZER_DIR, else the default model's converted folder."""
    env = os.environ.get(TOKENIZER_ENV)
    return pathlib.Path(env) if env else pathlib.Path(resolve_model_path(None))


def export_tokenizer(dest: str | os.PathLike) -> str:
    """Copy the default model's tokenizer files to dest (~3.5 MB: carried to a GPU machine instead of the model)."""
    dest = pathlib.Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    src = pathlib.Path(resolve_model_path(None))
    for name in TOKENIZER_FILES:
        if (src / name).exists():
            shutil.copy(src / name, dest / name)
    return str(dest)


def make_preset_model(path: str | os.PathLike, preset: str, seed: int = 0, num_layers: int | None = None) -> str:
    """A random-weight folder with a real model's shapes (CONFIG_PRESETS); num_layers overrides the depth."""
    if preset not in CONFIG_PRESETS:
        raise ValueError(f"preset must be one of {sorted(CONFIG_PRESETS)}, got {preset!r}")
    kw = dict(CONFIG_PRESETS[preset])
    if num_layers is not None:
        kw["num_layers"] = num_layers
    return make_tiny_model(path, seed=seed, **kw)


def model_from_spec(spec: str | None) -> str | None:
    """Benchmarks' --model: None (the default model), a folder/.gguf path, or 'preset:NAME[:LAYERS]' (random
    weights with a real model's shapes, built once under the temp folder)."""
    if not spec or not spec.startswith("preset:"):
        return spec
    import tempfile

    _, name, *layers = spec.split(":")
    n = int(layers[0]) if layers else None
    folder = pathlib.Path(tempfile.gettempdir()) / f"sglpy-preset-{name}-{n or 'full'}"
    return make_preset_model(folder, name, num_layers=n)


def make_tiny_model(path: str | os.PathLike, arch: str = "llama", seed: int = 0, num_layers: int = 2,
                    hidden: int = 64, heads: int = 4, kv_heads: int = 2, max_pos: int = 2048,
                    tie_word_embeddings: bool = True, intermediate: int | None = None,
                    head_dim: int | None = None, extra: dict | None = None) -> str:
    """Write a tiny random-weight Llama/Mistral/Qwen2 folder using the default model's tokenizer.

    extra: more config fields (intermediate_size, rope_theta, rope_scaling, ...) over the defaults."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM
    from transformers import Qwen2Config, Qwen2ForCausalLM

    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    tok_src = tokenizer_source()
    classes = {"llama": (LlamaConfig, LlamaForCausalLM), "mistral": (MistralConfig, MistralForCausalLM),
               "qwen2": (Qwen2Config, Qwen2ForCausalLM)}
    if arch not in classes:
        raise ValueError(f"arch must be one of {sorted(classes)}")
    cfg_cls, model_cls = classes[arch]
    fields = dict(vocab_size=49152, hidden_size=hidden, intermediate_size=intermediate or hidden * 2,
                  num_hidden_layers=num_layers, num_attention_heads=heads, num_key_value_heads=kv_heads,
                  max_position_embeddings=max_pos, tie_word_embeddings=tie_word_embeddings,
                  bos_token_id=1, eos_token_id=2, pad_token_id=2, rms_norm_eps=1e-5)
    if head_dim is not None:
        fields["head_dim"] = head_dim
    config = cfg_cls(**{**fields, **(extra or {})})
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    # larger-than-default weights so logits are not all near-ties; 1/sqrt(hidden) keeps wide models' activations sane
    std = min(0.08, hidden ** -0.5)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0.0, std)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True)
    for name in TOKENIZER_FILES:
        if (tok_src / name).exists():
            shutil.copy(tok_src / name, tmp / name)
    tmp.rename(path)
    return str(path)


# Scaled-down real configs of the other families (widths and depths cut, every architectural switch kept):
# Qwen3-0.6B, Gemma-2-2B, Gemma-3-1B (global layers with linear rope scaling as in Gemma-3-4B), Phi-3-mini-128k
# (LongRoPE), Phi-4-mini (partial rotary), Mixtral-8x7B, Qwen3-30B-A3B. Windows are small so that tests cross them.
_LONGROPE_SHORT = [1.0, 1.05, 1.1, 1.2, 1.4, 1.7, 2.0, 2.4]
_LONGROPE_LONG = [1.1, 1.3, 1.8, 2.6, 4.0, 6.5, 9.0, 12.0]
FAMILY_CONFIGS = {
    "qwen3": ("Qwen3", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
                            num_key_value_heads=2, head_dim=32, rope_theta=1000000.0, rms_norm_eps=1e-6,
                            tie_word_embeddings=True, max_position_embeddings=4096)),
    "gemma2": ("Gemma2", dict(hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=4,
                              num_key_value_heads=2, head_dim=32, query_pre_attn_scalar=48, sliding_window=8,
                              attn_logit_softcapping=50.0, final_logit_softcapping=30.0, rms_norm_eps=1e-6,
                              max_position_embeddings=4096)),
    "gemma3": ("Gemma3Text", dict(hidden_size=64, intermediate_size=192, num_hidden_layers=3, num_attention_heads=4,
                                  num_key_value_heads=1, head_dim=32, query_pre_attn_scalar=32, sliding_window=8,
                                  layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                  rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                                   "full_attention": {"rope_type": "linear", "factor": 8.0,
                                                                      "rope_theta": 1000000.0}},
                                  rms_norm_eps=1e-6, max_position_embeddings=4096)),
    "phi3": ("Phi3", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                          num_key_value_heads=4, max_position_embeddings=2048, original_max_position_embeddings=64,
                          rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "factor": 32.0,
                                           "short_factor": _LONGROPE_SHORT, "long_factor": _LONGROPE_LONG},
                          sliding_window=2048, tie_word_embeddings=False)),
    "phi4-mini": ("Phi3", dict(hidden_size=64, intermediate_size=160, num_hidden_layers=2, num_attention_heads=4,
                               num_key_value_heads=2, max_position_embeddings=4096,
                               rope_parameters={"rope_type": "default", "rope_theta": 10000.0,
                                                "partial_rotary_factor": 0.75},
                               tie_word_embeddings=True)),
    "mixtral": ("Mixtral", dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                                num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
                                rope_theta=1000000.0, tie_word_embeddings=False, max_position_embeddings=4096)),
    "qwen3-moe": ("Qwen3Moe", dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32,
                                   num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                                   num_experts=8, num_experts_per_tok=2, norm_topk_prob=True, rms_norm_eps=1e-6,
                                   tie_word_embeddings=False, max_position_embeddings=4096)),
}


def make_family_model(path: str | os.PathLike, family: str, seed: int = 0, max_shard_size: str | None = None,
                      extra: dict | None = None) -> str:
    """A tiny random-weight HF folder of one FAMILY_CONFIGS family with the default model's tokenizer;
    max_shard_size (e.g. '200KB') writes sharded safetensors with an index."""
    import torch
    import transformers

    if family not in FAMILY_CONFIGS:
        raise ValueError(f"family must be one of {sorted(FAMILY_CONFIGS)}, got {family!r}")
    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    prefix, fields = FAMILY_CONFIGS[family]
    cfg_cls = getattr(transformers, prefix + "Config")
    model_cls = getattr(transformers, prefix.removesuffix("Text") + "ForCausalLM")
    config = cfg_cls(**{**dict(vocab_size=49152, bos_token_id=1, eos_token_id=2, pad_token_id=2), **fields,
                        **(extra or {})})
    torch.manual_seed(seed)
    model = model_cls(config).to(torch.float32)
    hidden = config.hidden_size
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, min(0.08, hidden ** -0.5))
            elif "norm" in name:  # non-trivial norm weights, so (1 + w) vs w is tested
                p.normal_(0.0 if prefix.startswith("Gemma") else 1.0, 0.1)
    tmp = path.with_name(path.name + ".tmp")
    model.save_pretrained(tmp, safe_serialization=True, **({"max_shard_size": max_shard_size} if max_shard_size
                                                          else {}))
    tok_src = tokenizer_source()
    for name in TOKENIZER_FILES:
        if (tok_src / name).exists():
            shutil.copy(tok_src / name, tmp / name)
    tmp.rename(path)
    return str(path)


# A ChatML template that opens the thinking section (as DeepSeek-R1 and Qwen3-thinking templates do), closed
# empty when enable_thinking is false (as Qwen3's template does).
THINKING_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.reasoning_content %}<think>\n{{ m.reasoning_content }}"
    "\n</think>\n\n{% endif %}{{ m.content }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and enable_thinking is false %}<think>\n\n</think>\n\n"
    "{% else %}<think>\n{% endif %}{% endif %}")


# THINKING_TEMPLATE plus a tools block in Qwen3's layout (<tools> signatures, calls in <tool_call> tags: the hermes
# format the tool-format detection finds in Qwen3's own template)
QWEN3_TOOLS_TEMPLATE = (
    "{% if reasoning_effort is defined %}<|im_start|>system\nReasoning: {{ reasoning_effort }}<|im_end|>\n{% endif %}"
    "{% if tools %}<|im_start|>system\n# Tools\n\nYou may call one or more functions. Their signatures:\n<tools>"
    "{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n\nReturn each call as a JSON object in "
    "<tool_call></tool_call> tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}"
    "\n</tool_call><|im_end|>\n{% endif %}" + THINKING_TEMPLATE)


def make_reasoning_model(path: str | os.PathLike, seed: int = 0, template: str = THINKING_TEMPLATE) -> str:
    """A tiny random Qwen3 folder whose tokenizer has `<think>` / `</think>` as single (non-special) tokens and
    whose chat template (THINKING_TEMPLATE, or QWEN3_TOOLS_TEMPLATE with tools) opens the thinking section."""
    from transformers import AutoTokenizer

    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    tmp = pathlib.Path(make_family_model(path.with_name(path.name + ".base"), "qwen3", seed=seed,
                                         extra=dict(vocab_size=49160)))
    tok = AutoTokenizer.from_pretrained(tmp)
    tok.add_tokens(["<think>", "</think>"])
    tok.chat_template = template
    for name in TOKENIZER_FILES:
        (tmp / name).unlink(missing_ok=True)
    tok.save_pretrained(tmp)
    tmp.rename(path)
    return str(path)

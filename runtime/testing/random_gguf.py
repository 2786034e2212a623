"""Random-weight GGUF files with real models' configs (Qwen2.5-0.5B, Llama-3.2-1B/3B, Llama-3.1-8B, Qwen3-1.7B),
their matrices written directly as Q4_0 / Q4_1 / Q8_0 blocks of random codes and scales, so an 8B-shaped file is
written in seconds with no float copy (speed does not depend on the values; benchmarks/cpu_scale.py). The default
model's tokenizer stands in, padded to the config's vocabulary with tokens no merge reaches."""

from __future__ import annotations

import os
import pathlib

# name -> (llama.cpp architecture, config); head_dim where it is not hidden / heads
REAL_CONFIGS = {
    "qwen2.5-0.5b": ("qwen2", dict(num_hidden_layers=24, hidden_size=896, num_attention_heads=14, num_key_value_heads=2,
                                   intermediate_size=4864, vocab_size=151936, tie_word_embeddings=True,
                                   rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=32768)),
    "llama-3.2-1b": ("llama", dict(num_hidden_layers=16, hidden_size=2048, num_attention_heads=32, num_key_value_heads=8,
                                   intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                                   rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)),
    "qwen3-1.7b": ("qwen3", dict(num_hidden_layers=28, hidden_size=2048, num_attention_heads=16, num_key_value_heads=8,
                                 head_dim=128, intermediate_size=6144, vocab_size=151936, tie_word_embeddings=True,
                                 rope_theta=1000000.0, rms_norm_eps=1e-6, max_position_embeddings=40960)),
    "llama-3.2-3b": ("llama", dict(num_hidden_layers=28, hidden_size=3072, num_attention_heads=24, num_key_value_heads=8,
                                   intermediate_size=8192, vocab_size=128256, tie_word_embeddings=True,
                                   rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)),
    "llama-3.1-8b": ("llama", dict(num_hidden_layers=32, hidden_size=4096, num_attention_heads=32, num_key_value_heads=8,
                                   intermediate_size=14336, vocab_size=128256, tie_word_embeddings=False,
                                   rope_theta=500000.0, rms_norm_eps=1e-5, max_position_embeddings=131072)),
}
QUANT_TYPES = ("Q4_0", "Q4_1", "Q8_0")
WEIGHT_STD = 0.02  # the dequantized weights' spread (codes uniform over their range)


def _tensor_specs(arch: str, cfg: dict) -> list[tuple[str, tuple[int, ...], bool]]:
    """(llama.cpp name, [out, in] shape, quantized) of every tensor, in llama.cpp's order."""
    h, heads, kv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d = cfg.get("head_dim") or h // heads
    f, v = cfg["intermediate_size"], cfg["vocab_size"]
    specs = [("token_embd.weight", (v, h), True)]
    for i in range(cfg["num_hidden_layers"]):
        b = f"blk.{i}."
        specs += [(b + "attn_norm.weight", (h,), False), (b + "attn_q.weight", (heads * d, h), True),
                  (b + "attn_k.weight", (kv * d, h), True), (b + "attn_v.weight", (kv * d, h), True),
                  (b + "attn_output.weight", (h, heads * d), True), (b + "ffn_norm.weight", (h,), False),
                  (b + "ffn_gate.weight", (f, h), True), (b + "ffn_up.weight", (f, h), True),
                  (b + "ffn_down.weight", (h, f), True)]
        if arch == "qwen2":
            specs += [(b + "attn_q.bias", (heads * d,), False), (b + "attn_k.bias", (kv * d,), False),
                      (b + "attn_v.bias", (kv * d,), False)]
        if arch == "qwen3":
            specs += [(b + "attn_q_norm.weight", (d,), False), (b + "attn_k_norm.weight", (d,), False)]
    specs.append(("output_norm.weight", (h,), False))
    if not cfg["tie_word_embeddings"]:
        specs.append(("output.weight", (v, h), True))
    return specs


def _random_blocks(rng, shape: tuple[int, int], qtype):
    """Random blocks of `qtype` for a [rows, cols] matrix: uniform codes, scales giving WEIGHT_STD."""
    import gguf
    import numpy as np

    block, size = gguf.GGML_QUANT_SIZES[qtype]
    rows, cols = shape
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    levels = 256 if qtype == gguf.GGMLQuantizationType.Q8_0 else 16
    d = np.float16(WEIGHT_STD * np.sqrt(12.0) / levels)
    raw[..., 0:2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    if qtype == gguf.GGMLQuantizationType.Q4_1:  # w = d * q + m with q in 0..15: centre the codes at zero
        raw[..., 2:4] = np.frombuffer(np.float16(-7.5 * float(d)).tobytes(), dtype=np.uint8)
        # llama.cpp's quantizer maps each block's minimum to code 0 and its maximum to 15: every block spans them
        # (what lets a re-quantization find the same grid: runtime/model/quantization.py, on_4bit_grid)
        raw[..., 4] = 0xF0  # input 0 -> code 0, input 16 -> code 15
    return raw.reshape(rows, -1)


def write_random_gguf(name: str, qtype: str, out: str | os.PathLike, seed: int = 0) -> str:
    """Write REAL_CONFIGS[name] as a GGUF with random `qtype` (Q4_0, Q4_1, Q8_0) matrices; returns the path. The
    norms are ones, the biases zeros (float32); one tensor is in memory at a time."""
    import gguf
    import numpy as np

    from .tiny_gguf import _add_tokenizer, _write_metadata

    if name not in REAL_CONFIGS:
        raise ValueError(f"name must be one of {sorted(REAL_CONFIGS)}, got {name!r}")
    if qtype not in QUANT_TYPES:
        raise ValueError(f"qtype must be one of {QUANT_TYPES}, got {qtype!r}")
    arch, cfg = REAL_CONFIGS[name]
    q = getattr(gguf.GGMLQuantizationType, qtype)
    out = pathlib.Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    w = gguf.GGUFWriter(str(tmp), arch)
    w.add_name(name)
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    _write_metadata(w, cfg, arch, head_dim, {"rope_theta": cfg["rope_theta"]})
    _add_tokenizer(w, cfg["vocab_size"], pad=True)
    specs = _tensor_specs(arch, cfg)
    block, size = gguf.GGML_QUANT_SIZES[q]
    for tname, shape, quant in specs:
        if quant:
            w.add_tensor_info(tname, (shape[0], shape[1] // block * size), np.dtype(np.uint8),
                              shape[0] * shape[1] // block * size, raw_dtype=q)
        else:
            w.add_tensor_info(tname, shape, np.dtype(np.float32), 4 * int(np.prod(shape)))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for tname, shape, quant in specs:
        if quant:
            w.write_tensor_data(_random_blocks(rng, shape, q))
        else:
            fill = 0.0 if tname.endswith(".bias") else 1.0
            w.write_tensor_data(np.full(shape, fill, dtype=np.float32))
    w.close()
    tmp.rename(out)
    return str(out)

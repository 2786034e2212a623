"""Llama 3's rope scaling in a GGUF file. llama.cpp's converter keeps it only as the tensor rope_freqs.weight (one
divisor per rotary frequency) and transformers' GGUF reader drops that tensor, so a converted Llama-3.x folder would
rotate with plain rope. Here the divisors become HF's llama3 rope parameters again, checked to reproduce every
divisor, or the file is refused by name."""

from __future__ import annotations

import json
import math
import pathlib

import numpy as np

# Llama 3.x's original context. The divisors fix the scaling curve, not this length: it only sets how the low and
# high frequency factors are stated (the table is the same for any value).
_DEFAULT_ORIGINAL_CONTEXT = 8192
_RTOL = 1e-4  # the file stores the divisors in float32


def _inv_freq(head_dim: int, theta: float) -> np.ndarray:
    return 1.0 / theta ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)


def llama3_divisors(params: dict, head_dim: int) -> np.ndarray:
    """What llama.cpp's converter stores as rope_freqs.weight for HF llama3 rope parameters (float32 [head_dim/2])."""
    factor, low, high = float(params["factor"]), float(params["low_freq_factor"]), float(params["high_freq_factor"])
    orig = float(params["original_max_position_embeddings"])
    wavelen = 2 * math.pi / _inv_freq(head_dim, float(params["rope_theta"]))
    smooth = (orig / wavelen - low) / (high - low)
    out = np.where(wavelen < orig / high, 1.0, np.where(wavelen > orig / low, factor,
                                                        1.0 / ((1 - smooth) / factor + smooth)))
    return out.astype(np.float32)


def llama3_rope_parameters(divisors: np.ndarray, head_dim: int, theta: float,
                           original_context: int | None = None) -> dict | None:
    """HF llama3 rope parameters whose frequencies equal base / `divisors` (None: all divisors 1, plain rope).
    Raises ValueError naming rope_freqs when no llama3 parameters reproduce the divisors."""
    div = np.asarray(divisors, dtype=np.float64).reshape(-1)
    if div.shape[0] != head_dim // 2:
        raise ValueError(f"GGUF tensor rope_freqs.weight has {div.shape[0]} values, the rotary half-dimension is "
                         f"{head_dim // 2}: not Llama 3 rope scaling, which this loader honours only in full")
    if np.allclose(div, 1.0, rtol=0, atol=_RTOL):
        return None
    factor = float(div.max())
    x = _inv_freq(head_dim, theta) / (2 * math.pi)  # 1 / wavelength
    mid = (div > 1 + _RTOL) & (div < factor * (1 - _RTOL))
    orig = int(original_context or _DEFAULT_ORIGINAL_CONTEXT)
    params = None
    if factor > 1 and mid.sum() >= 2:
        # between the bands: 1 / d = (1 - s) / factor + s with s = orig * x / (high - low) - low / (high - low)
        s = (1 / div[mid] - 1 / factor) / (1 - 1 / factor)
        a, b = np.polyfit(x[mid], s, 1)
        if a > 0:
            low = -b * orig / a
            params = {"rope_type": "llama3", "rope_theta": float(theta), "factor": factor,
                      "low_freq_factor": float(low), "high_freq_factor": float(low + orig / a),
                      "original_max_position_embeddings": orig}
    if params is None or params["low_freq_factor"] <= 0 or not np.allclose(
            llama3_divisors(params, head_dim), div, rtol=_RTOL, atol=0):
        raise ValueError("GGUF tensor rope_freqs.weight holds per-frequency rope divisors that no Llama 3 rope "
                         "scaling (factor, low/high frequency factors) reproduces; refusing rather than rotating "
                         "with other frequencies than llama.cpp")
    return params


def honour_rope_freqs(gguf_path: pathlib.Path, folder: pathlib.Path) -> dict | None:
    """Write a `llama` GGUF's rope_freqs as llama3 rope parameters into the converted folder's config.json; returns
    them (None when the file has no such tensor or its divisors are all 1)."""
    import gguf

    reader = gguf.GGUFReader(str(gguf_path))
    tensor = next((t for t in reader.tensors if t.name == "rope_freqs.weight"), None)
    if tensor is None:
        return None
    arch = reader.fields["general.architecture"].contents()
    cfg_path = folder / "config.json"
    cfg = json.loads(cfg_path.read_text())
    head_dim = cfg.get("head_dim") or cfg["hidden_size"] // cfg["num_attention_heads"]
    rot = reader.fields.get(f"{arch}.rope.dimension_count")
    if rot is not None and int(rot.contents()) != head_dim:
        raise ValueError(f"{gguf_path.name}: rope_freqs.weight with partial rotary ({rot.contents()} of {head_dim} "
                         "dims) is not supported")
    old = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    theta = float(old.get("rope_theta", cfg.get("rope_theta", 10000.0)))
    orig = reader.fields.get(f"{arch}.rope.scaling.original_context_length")
    params = llama3_rope_parameters(np.array(tensor.data, dtype=np.float32), head_dim, theta,
                                    int(orig.contents()) if orig is not None else None)
    if params is None:
        return None
    cfg.pop("rope_scaling", None)
    cfg["rope_parameters"] = params
    cfg_path.write_text(json.dumps(cfg, indent=2, sort_keys=True))
    return params

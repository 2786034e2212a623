"""Llama 3's rope scaling read back from a GGUF's rope_freqs tensor (llama.cpp keeps it nowhere else; transformers'
GGUF reader drops it): honoured, checked against transformers, or refused by name."""

from __future__ import annotations

import math
import pathlib

import numpy as np
import pytest
import torch

from sglpy.runtime.model.gguf_rope import llama3_rope_parameters
from sglpy.runtime.testing import make_tiny_model

from test_engine_model import _hf, hf_logits, make_runner, our_logits

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 64}  # a short original context: the scaling moves short prompts


def _llamacpp_divisors(theta: float, head_dim: int, p: dict) -> np.ndarray:
    """llama.cpp's convert_hf_to_gguf (LlamaModel's rope_freqs), written out here independently."""
    out = []
    for i in range(0, head_dim, 2):
        freq = 1.0 / theta ** (i / head_dim)
        wavelen = 2 * math.pi / freq
        if wavelen < p["original_max_position_embeddings"] / p["high_freq_factor"]:
            out.append(1.0)
        elif wavelen > p["original_max_position_embeddings"] / p["low_freq_factor"]:
            out.append(p["factor"])
        else:
            smooth = ((p["original_max_position_embeddings"] / wavelen - p["low_freq_factor"])
                      / (p["high_freq_factor"] - p["low_freq_factor"]))
            out.append(1 / ((1 - smooth) / p["factor"] + smooth))
    return np.array(out, dtype=np.float32)


@pytest.mark.parametrize("theta,head_dim,params", [
    (10000.0, 64, LLAMA3),
    (500000.0, 64, {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                    "original_max_position_embeddings": 8192}),  # Llama-3.2-1B/3B
    (500000.0, 128, {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192}),  # Llama-3.1-8B
])
def test_divisors_give_back_transformers_llama3_frequencies(theta, head_dim, params):
    from transformers import LlamaConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from sglpy.kernels.rotary import _inv_freq

    found = llama3_rope_parameters(_llamacpp_divisors(theta, head_dim, params), head_dim, theta)
    assert found["rope_type"] == "llama3" and found["factor"] == pytest.approx(params["factor"])
    cfg = LlamaConfig(hidden_size=head_dim * 2, num_attention_heads=2, head_dim=head_dim,
                      rope_scaling=dict(params, rope_theta=theta))
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, None)
    got = _inv_freq(head_dim, theta, found)
    assert torch.allclose(got, want.float(), rtol=1e-5, atol=0)
    plain = _inv_freq(head_dim, theta, None)
    assert not torch.allclose(plain, want.float(), rtol=1e-3, atol=0)  # the scaling is not a no-op here


def test_divisors_no_llama3_scaling_makes_are_refused_by_name():
    good = _llamacpp_divisors(10000.0, 64, LLAMA3)
    assert llama3_rope_parameters(np.ones_like(good), 64, 10000.0) is None  # all ones: plain rope
    bad = good.copy()
    bad[1] = 1.5  # a high frequency scaled while its neighbours are not
    with pytest.raises(ValueError, match="rope_freqs"):
        llama3_rope_parameters(bad, 64, 10000.0)
    with pytest.raises(ValueError, match="rope_freqs"):
        llama3_rope_parameters(good[:-2], 64, 10000.0)


def test_llama3_gguf_matches_transformers(tmp_path):
    """A tiny Llama with llama3 rope scaling written as llama.cpp does (the scaling only as rope_freqs.weight):
    the converted folder states the scaling and the engine's logits match the HF model's."""
    from sglpy.runtime.model.loader import convert_gguf
    from sglpy.runtime.testing.tiny_gguf import write_family_gguf

    hf = make_tiny_model(tmp_path / "hf", head_dim=64, extra=dict(vocab_size=512, rope_theta=10000.0,
                                                                  rope_scaling=dict(LLAMA3)))
    gguf_file = pathlib.Path(write_family_gguf(hf, tmp_path / "tiny-llama3.gguf"))
    folder = convert_gguf(gguf_file, tmp_path / "converted", hf_copy=False)
    import json

    rope = json.loads((folder / "config.json").read_text())["rope_parameters"]
    assert rope["rope_type"] == "llama3" and rope["factor"] == pytest.approx(8.0)
    prompts = [[1, 5, 9, 200, 300], list(range(100, 160))]
    for a, b in zip(our_logits(make_runner(str(folder), max_total_tokens=128), prompts),
                    hf_logits(_hf(hf), prompts)):
        assert (a - b).abs().max().item() <= 2e-5

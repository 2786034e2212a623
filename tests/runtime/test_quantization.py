"""Quantize-at-load and the KV cache dtype: config validation, tiny-model logits, constrained outputs per mode."""

from __future__ import annotations

import json

import pytest
import torch

from test_engine_model import make_runner, our_logits
from sglpy.kernels.cpu_native import native_lib
from sglpy.runtime.config import EngineConfig

MODES = [("int8", "auto"), ("int4", "auto"), ("none", "bf16"), ("none", "fp16"), ("int8", "bfloat16"),
         ("int4", "bf16")]
KV_TORCH = {"auto": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16, "fp16": torch.float16}


def test_bad_values_name_the_allowed_ones():
    with pytest.raises(ValueError, match=r"quantization must be one of \('auto', 'none', 'int8', 'int4'\), got 'int3'"):
        EngineConfig(quantization="int3")
    with pytest.raises(ValueError, match=r"kv_cache_dtype must be one of \('auto', .*'fp16'\), got 'fp7'"):
        EngineConfig(kv_cache_dtype="fp7")


def test_serve_flags_map_onto_the_config():
    from sglpy.runtime.server.config import config_from_args

    cfg = config_from_args(["--quantization", "int8", "--kv-cache-dtype", "bf16"])
    assert (cfg.engine.quantization, cfg.engine.kv_cache_dtype) == ("int8", "bf16")
    with pytest.raises(ValueError, match="quantization must be one of"):
        config_from_args(["--quantization", "int3"])
    with pytest.raises(ValueError, match="kv_cache_dtype must be one of"):
        config_from_args(["--kv-cache-dtype", "fp7"])


def test_auto_is_int8_on_cpu_int4_for_weights_on_a_4bit_grid_and_none_elsewhere(tiny_model_path):
    from sglpy.kernels.quant_linear import dequantize_int4, quantize_int4
    from sglpy.runtime.model.quantization import _projections, int4_loses_nothing, resolve_quantization

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert EngineConfig().quantization == "auto"
    model = make_runner(tiny_model_path, max_total_tokens=256).model
    assert not int4_loses_nothing(model)  # random float weights: int4 would lose ~10%
    assert resolve_quantization("auto", cpu, model) == "int8"
    with torch.no_grad():  # what a Q4_1 GGUF's weights are: every group of 32 on a 16-level grid
        for layer in model.model.layers:
            for lin in _projections(layer):
                lin = getattr(lin, "inner", lin)  # quantization none on CPU wraps the float layers (DecodeRowsLinear)
                lin.weight.copy_(dequantize_int4(*quantize_int4(lin.weight, 32), 32))
    assert int4_loses_nothing(model)
    assert resolve_quantization("auto", cpu, model) == "int4"
    assert resolve_quantization("auto", cpu, model, tensor_parallel=True) == "int8"  # ranks see only shards
    assert resolve_quantization("auto", cuda, model) == "none"
    assert resolve_quantization("none", cuda) == "none"
    with pytest.raises(ValueError, match="runs on CPU only"):
        resolve_quantization("int8", cuda)


def test_int8_runs_quantized_layers_and_says_so(tiny_model_path):
    from sglpy.runtime.engine import Engine

    with Engine(tiny_model_path, max_total_tokens=256, device="cpu", quantization="int8") as eng:
        info = eng.get_server_info()
        kinds = {type(m).__name__ for m in eng.runner.model.modules()}
    assert info["quantization"] == "int8" and info["kv_cache_dtype"] == "auto"
    assert "QuantizedLinear" in kinds and "Linear" not in kinds


@pytest.mark.parametrize("quantization,kv_cache_dtype", MODES)
def test_tiny_model_logits_stay_close_to_float32(tiny_model_path, quantization, kv_cache_dtype):
    prompts = [[1, 5, 9, 200, 3000], [7], list(range(100, 137))]
    ref = our_logits(make_runner(tiny_model_path, max_total_tokens=256), prompts)
    runner = make_runner(tiny_model_path, max_total_tokens=256, quantization=quantization)
    if quantization != "none":
        kinds = {type(m).__name__ for m in runner.model.modules()}
        assert "QuantizedLinear" in kinds and "Linear" not in kinds  # every projection, and the lm_head
        emb = runner.model.model.embed_tokens  # lookups read the tied head's int8 rows: no float table is kept
        head = runner.model.logits_head.packed.qweight
        assert emb.qweight.dtype == torch.int8 and emb.qweight.data_ptr() == head.data_ptr()
        ids = torch.tensor([0, 5, 300])
        torch.testing.assert_close(emb(ids), emb.qweight[ids].float() * emb.scales[ids].float()[:, None])
    ours = our_logits(runner, prompts, kv_cache_dtype)
    # Measured mean |error| / logit std here: int8 ~0.015, bf16 KV ~0.002, fp16 KV ~0.0002, int4 ~0.10-0.16
    # (random normal weights sit on no 4-bit grid; the real model's do, see benchmarks/quality_gate.py).
    bound = {"int8": 0.04, "int4": 0.3, "none": 0.01}[quantization]
    for a, b in zip(ours, ref):
        assert a.shape == b.shape
        assert 0 < (a - b).abs().mean().item() < bound * b.std().item()  # close, and not silently unquantized


@pytest.mark.parametrize("quantization,kv_cache_dtype", [("none", "auto")] + MODES)
def test_constrained_outputs_stay_valid(tiny_model_path, quantization, kv_cache_dtype):
    from sglpy.runtime.engine import Engine

    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"]}
    with Engine(tiny_model_path, max_total_tokens=2048, quantization=quantization,
                kv_cache_dtype=kv_cache_dtype, debug_invariants=True) as eng:
        outs = eng.generate(["Person:", "JSON:"], [{"max_new_tokens": 48, "temperature": 0, "json_schema": schema},
                                                   {"max_new_tokens": 24, "temperature": 0.8, "seed": 3,
                                                    "regex": r"(yes|no)-[0-9]{2}"}])
        info = eng.get_server_info()
        # the pool stores what was asked; auto: bf16 for a quantized model with the native kernels, else float32
        compact = quantization != "none" and native_lib() is not None
        expected = torch.bfloat16 if kv_cache_dtype == "auto" and compact else KV_TORCH[kv_cache_dtype]
        assert eng.kv.buffers.k_buffer.dtype == expected
    obj = json.loads(outs[0]["text"])
    assert set(obj) == {"name", "age"} and 0 <= obj["age"] <= 120
    import re

    assert re.fullmatch(r"(yes|no)-[0-9]{2}", outs[1]["text"])
    assert (info["quantization"], info["kv_cache_dtype"]) == (quantization, kv_cache_dtype)


def test_dense_copy_is_bf16_only_where_the_cpu_computes_bf16(monkeypatch):
    """The many-row copy: bf16 needs AMX or AVX512-BF16 and the avx512 kernel level; a forced avx2 level (what a
    CPU without them runs) and a CPU without them get float32, never an emulated bf16 GEMM."""
    from sglpy.kernels.cpu_isa import ISA_ENV
    from sglpy.runtime.model import quantization as q

    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False, raising=False)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: True, raising=False)
    monkeypatch.setattr(q, "native_isa", lambda: "avx512")
    assert q.dense_copy_dtype() == torch.bfloat16
    monkeypatch.setattr(q, "native_isa", lambda: None)  # native kernels off: the CPU's flags decide
    assert q.dense_copy_dtype() == torch.bfloat16
    for level in ("avx2", "baseline"):
        monkeypatch.setattr(q, "native_isa", lambda level=level: level)
        assert q.dense_copy_dtype() == torch.float32
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    monkeypatch.setattr(q, "native_isa", lambda: "avx512")
    assert q.dense_copy_dtype() == torch.float32
    monkeypatch.undo()
    monkeypatch.setenv(ISA_ENV, "avx2")  # end to end: the forced level reaches the choice
    from sglpy.kernels.cpu_native import find_compiler
    if find_compiler() is not None:
        assert q.dense_copy_dtype() == torch.float32

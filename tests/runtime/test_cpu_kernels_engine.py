"""The model on the native CPU kernels vs on the torch references (SGLPY_DISABLE_CPU_KERNELS=1): same logits."""

from __future__ import annotations

import pytest
import torch

from sglpy.kernels.cpu_native import DISABLE_ENV, find_compiler
from sglpy.runtime.config import EngineConfig
from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.testing.runner_kv import runner_kv

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler: only the references run")


PROMPTS = [[1, 5, 9, 200, 3000], [7], list(range(100, 400))]


def decode_logits(path: str, kv_cache_dtype: str, steps: int = 6, quantization: str = "none", fused: bool = True,
                  prompts: list[list[int]] = PROMPTS, deterministic: bool = False) -> list[torch.Tensor]:
    """Logits of `steps` batched decode forwards after a ragged prefill (fixed next tokens, not sampled).
    fused=False keeps the model on the per-op path (no fused decode layers)."""
    runner = ModelRunner(EngineConfig(model=path, device="cpu", quantization=quantization,
                                      kv_cache_dtype=kv_cache_dtype, max_total_tokens=4096,
                                      enable_deterministic_inference=deterministic), path)
    if not fused:
        runner.model.native_layers = None
    kv = runner_kv(runner, 4096, len(prompts) + 1, kv_cache_dtype)
    reqs = [Req(rid=str(i), input_ids=ids, sampling=SamplingParams(max_new_tokens=steps))
            for i, ids in enumerate(prompts)]
    for r in reqs:
        assert kv.assign_row(r) and kv.grow(r, len(r.input_ids))
    runner.forward([BatchEntry(r, 0, len(r.input_ids), sample=True) for r in reqs], 0, kv.buffers)
    out = []
    for step in range(steps):
        entries = []
        for r in reqs:
            t = r.kv_len
            r.output_ids.append(11 + 7 * step)
            assert kv.grow(r, 1)
            entries.append(BatchEntry(r, t, 1, sample=True))
        out.append(runner.forward(entries, len(entries), kv.buffers).logits)
    return out


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bf16", "fp16"])
def test_decode_logits_match_the_torch_path(tiny_model_path, monkeypatch, kv_cache_dtype):
    native = decode_logits(tiny_model_path, kv_cache_dtype)
    monkeypatch.setenv(DISABLE_ENV, "1")
    reference = decode_logits(tiny_model_path, kv_cache_dtype)
    # a 16-bit pool rounds each K/V element once; the two paths' rotary may round a product differently (fused or
    # not), which can move an element by one 16-bit step (2^-8 for bf16) and a logit by ~1e-4
    tol = 1e-4 if kv_cache_dtype == "auto" else 1e-3
    for a, b in zip(native, reference):
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)


def test_engine_reports_the_kernels_it_runs(tiny_model_path, monkeypatch):
    from sglpy.runtime.engine import Engine

    with Engine(tiny_model_path, max_total_tokens=256, device="cpu") as eng:
        assert eng.get_server_info()["cpu_kernels"].startswith("native: ")
        first = eng.generate("Hello there", {"max_new_tokens": 8, "temperature": 0})
    monkeypatch.setenv(DISABLE_ENV, "1")
    with Engine(tiny_model_path, max_total_tokens=256, device="cpu") as eng:
        assert eng.get_server_info()["cpu_kernels"] == f"torch reference: {DISABLE_ENV} is set"
        again = eng.generate("Hello there", {"max_new_tokens": 8, "temperature": 0})
    assert first["meta_info"]["completion_tokens"] == again["meta_info"]["completion_tokens"] == 8


def _count_fused(monkeypatch) -> list[int]:
    import sglpy.runtime.model.llama as llama

    calls = [0]
    real = llama.run_native_layers

    def counted(*a):
        out = real(*a)
        calls[0] += out is not None
        return out

    monkeypatch.setattr(llama, "run_native_layers", counted)
    return calls


@pytest.mark.parametrize("arch", ["llama", "qwen2"])  # qwen2: q/k/v biases
@pytest.mark.parametrize("quantization", ["int8", "int4"])
@pytest.mark.parametrize("kv_cache_dtype", ["auto", "bf16"])
def test_fused_decode_layers_equal_the_per_op_path(tmp_path, monkeypatch, arch, quantization, kv_cache_dtype):
    """One native call per layer runs the same kernels in the same order as the per-op path: equal logits."""
    from sglpy.runtime.testing import make_tiny_model

    path = make_tiny_model(tmp_path / arch, arch=arch, num_layers=3)
    calls = _count_fused(monkeypatch)
    fused = decode_logits(path, kv_cache_dtype, quantization=quantization)
    assert calls[0] == 6  # every decode step took the fused layers
    per_op = decode_logits(path, kv_cache_dtype, quantization=quantization, fused=False)
    assert calls[0] == 6
    for a, b in zip(fused, per_op):
        assert torch.equal(a, b)


@pytest.mark.parametrize("quantization,kv_cache_dtype", [("int8", "auto"), ("int4", "bf16")])
def test_deterministic_fused_decode_layers_equal_the_per_op_path(tmp_path, monkeypatch, quantization, kv_cache_dtype):
    """Deterministic inference keeps the fused layers, with attention as one-token extends: the per-op path's
    kernels (its decode rows run the native GEMV), so a generated token's logits are the same whether its step
    took the fused layers (up to 16 rows) or the per-op path (more rows, extends). The 300-token prompt is past the
    length where decode attention would split by batch."""
    from sglpy.runtime.testing import make_tiny_model

    path = make_tiny_model(tmp_path / "llama", num_layers=3)
    calls = _count_fused(monkeypatch)
    fused = decode_logits(path, kv_cache_dtype, quantization=quantization, deterministic=True)
    assert calls[0] == 6
    per_op = decode_logits(path, kv_cache_dtype, quantization=quantization, fused=False, deterministic=True)
    plain = decode_logits(path, kv_cache_dtype, quantization=quantization, fused=False)
    for a, b, c in zip(fused, per_op, plain):
        assert torch.equal(a, b)
    assert any(not torch.equal(a, c) for a, c in zip(fused, plain))  # the long request: extend != decode kernel


def test_fused_layers_need_native_packing_and_few_rows(tiny_model_path, monkeypatch):
    calls = _count_fused(monkeypatch)
    runner = ModelRunner(EngineConfig(model=tiny_model_path, device="cpu", quantization="none"), tiny_model_path)
    assert runner.model.native_layers is None  # float32 weights: the per-op path (HF-equality mode)
    from sglpy.kernels.quant_linear_cpu import NATIVE_MAX_ROWS

    many = [[3 + i, 40 + i] for i in range(NATIVE_MAX_ROWS + 1)]
    decode_logits(tiny_model_path, "auto", steps=2, quantization="int8", prompts=many)
    assert calls[0] == 0  # more rows than the native GEMV serves: per op (the dense copy)
    decode_logits(tiny_model_path, "auto", steps=2, quantization="int8", prompts=many[:NATIVE_MAX_ROWS])
    assert calls[0] == 2


def test_a_bad_slot_in_a_fused_step_raises_the_per_op_error(tiny_model_path, monkeypatch):
    runner = ModelRunner(EngineConfig(model=tiny_model_path, device="cpu", quantization="int4",
                                      max_total_tokens=256), tiny_model_path)
    assert runner.model.native_layers is not None
    kv = runner_kv(runner, 256, 2, "auto")
    req = Req(rid="r", input_ids=[5, 6, 7], sampling=SamplingParams(max_new_tokens=2))
    assert kv.assign_row(req) and kv.grow(req, 3)
    runner.forward([BatchEntry(req, 0, 3, sample=True)], 0, kv.buffers)
    req.output_ids.append(9)
    assert kv.grow(req, 1)
    req.slots[3] = 10 ** 6  # what a bookkeeping bug would hand the model
    with pytest.raises(ValueError, match=r"out_cache_loc\[0\] = 1000000 is not a slot of the pool"):
        runner.forward([BatchEntry(req, 3, 1, sample=True)], 1, kv.buffers)

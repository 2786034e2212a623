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


def decode_logits(path: str, kv_cache_dtype: str, steps: int = 6) -> list[torch.Tensor]:
    """Logits of `steps` batched decode forwards after a ragged prefill (fixed next tokens, not sampled)."""
    runner = ModelRunner(EngineConfig(model=path, device="cpu", quantization="none", kv_cache_dtype=kv_cache_dtype,
                                      max_total_tokens=1024), path)
    kv = runner_kv(runner, 1024, 4, kv_cache_dtype)
    reqs = [Req(rid=str(i), input_ids=ids, sampling=SamplingParams(max_new_tokens=steps))
            for i, ids in enumerate([[1, 5, 9, 200, 3000], [7], list(range(100, 400))])]
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

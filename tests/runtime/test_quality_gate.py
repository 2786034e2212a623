"""The quality gate (benchmarks/quality_gate.py): its machinery on a tiny model, and every shipped mode on the real one."""

from __future__ import annotations

import importlib.util
import math
import pathlib
import sys

import pytest
import torch

from test_engine_model import make_runner

ROOT = pathlib.Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("quality_gate", ROOT / "benchmarks" / "quality_gate.py")
gate = importlib.util.module_from_spec(_spec)
sys.modules["quality_gate"] = gate  # dataclasses look their module up while being built
_spec.loader.exec_module(gate)

SHIPPED_MODES = ["int8", "int4", "none:bf16", "none:fp16", "int8:bf16", "int4:bf16"]


def test_decode_steps_score_like_one_prefill(tiny_model_path):
    """float32: scoring the tail by decode steps equals scoring it inside the prefill (same model, two paths)."""
    ids = list(range(300, 364))
    runner = make_runner(tiny_model_path, max_total_tokens=256)
    all_prefill = gate.teacher_forced_scores(runner, ids, decode_tokens=0)
    split = gate.teacher_forced_scores(runner, ids, decode_tokens=20)
    assert split.num_decode == 20 and split.nll.shape == (63,)
    torch.testing.assert_close(split.nll, all_prefill.nll, atol=1e-4, rtol=1e-4)


def test_judge_fails_a_mode_outside_either_bound():
    n = 100
    ref = gate.Scores(torch.full((n,), 2.0, dtype=torch.float64), torch.arange(n), 10, 0.0)
    ok = gate.judge("ok", gate.Scores(ref.nll + 0.01, ref.top1.clone(), 10, 0.0), ref)
    assert ok.passed and math.isclose(ok.ppl_increase, math.exp(0.01) - 1) and ok.agreement == 1.0
    worse_ppl = gate.judge("ppl", gate.Scores(ref.nll + 0.03, ref.top1.clone(), 10, 0.0), ref)  # +3.0%
    assert not worse_ppl.passed
    top1 = ref.top1.clone()
    top1[:8] = -1  # 92% agreement, all misses in the prefill part
    low = gate.judge("agree", gate.Scores(ref.nll, top1, 10, 0.0), ref)
    assert not low.passed and math.isclose(low.agreement, 0.92) and low.decode_agreement == 1.0


def test_modes_parse():
    assert gate.parse_mode("int8:bf16") == {"quantization": "int8", "kv_cache_dtype": "bf16"}
    assert gate.parse_mode("none") == {"quantization": "none", "kv_cache_dtype": "auto"}


@pytest.mark.slow
def test_shipped_modes_pass_the_gate_on_the_default_model(default_model_path):
    """Each mode that ships: perplexity within 2% of float32 and top-1 agreement >= 93% (1,024 tokens)."""
    results = gate.run_gate(default_model_path, SHIPPED_MODES, n_tokens=1024, decode_tokens=128)
    table = gate.format_table(results)
    assert [r.mode for r in results] == ["none"] + SHIPPED_MODES, table
    for r in results:
        assert r.passed, table
    assert results[0].agreement == 1.0 and 20 < results[0].perplexity < 40, table


@pytest.mark.slow
def test_auto_runs_int4_on_the_default_model(default_model_path):
    """The embedded model comes from a Q4_1 GGUF: its weights sit on the int4 grid, so auto picks the faster int4."""
    from sglpy.runtime.model.quantization import int4_loses_nothing

    assert int4_loses_nothing(make_runner(default_model_path, max_total_tokens=64).model)
    assert make_runner(default_model_path, max_total_tokens=64, quantization="auto").quantization == "int4"

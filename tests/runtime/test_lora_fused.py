"""LoRA adapters inside the fused native CPU decode layer (int8 / int4 base): a decode step whose rows carry adapters
stays on the fused layers, and gives exactly what the per-op path gives (the same LoRA kernel per projection, the
same base kernels); mixed batches, all seven target modules, ranks 8 / 16 / 64 in one pool. HF transformers + PEFT
on the float weights stays close (the quantized base's error only)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("peft")

from sglpy.kernels.cpu_native import find_compiler  # noqa: E402
from sglpy.runtime.engine import Engine  # noqa: E402
from sglpy.runtime.testing import make_tiny_model  # noqa: E402
from sglpy.runtime.testing.tiny_lora import make_peft_adapter, peft_reference  # noqa: E402

pytestmark = pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler: no fused layers")

ALL = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
ADAPTERS = {"r8": (8, ALL), "r16": (16, ("q_proj", "v_proj", "down_proj")), "r64": (64, ALL)}
PROMPTS = ["The quick brown fox jumps over", "def fibonacci(n):", "Paris is the capital of"]
NAMES = [None, "r8", "r16", "r64", "r8", "r64", None]
GREEDY = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    d = tmp_path_factory.mktemp("lora-fused")
    base = make_tiny_model(d / "base", num_layers=3)
    folders = {n: make_peft_adapter(base, d / n, rank=r, alpha=2.0 * r, targets=t, seed=i + 11)
               for i, (n, (r, t)) in enumerate(ADAPTERS.items())}
    return base, folders


def _run(eng, fused: bool) -> list[dict]:
    model = eng.runner.model
    layers = model.native_layers
    if not fused:
        model.native_layers = None  # the per-op path (the oracle)
    try:
        eng.flush_cache()
        prompts = [PROMPTS[i % 3] for i in range(len(NAMES))]
        return eng.generate(prompts, GREEDY, lora_path=NAMES, return_logprob=True)
    finally:
        model.native_layers = layers


def _hf_close(base, folders, eng, outs):
    """Each row's generated tokens scored by HF + PEFT on the float weights (teacher forced): logprobs within the
    int8 base's error of the engine's, and each token HF + PEFT's greedy choice up to that error."""
    for n, p, out in zip(NAMES[:4], PROMPTS * 2, outs):
        ids = eng.tokenize([p])[0]
        model = peft_reference(base, folders.get(n))
        with torch.no_grad():
            logp = model(torch.tensor([ids + out["output_ids"]])).logits[0].log_softmax(-1)[len(ids) - 1:-1]
        got = torch.tensor([e[0] for e in out["meta_info"]["output_token_logprobs"]])
        ref = logp[torch.arange(len(got)), torch.tensor(out["output_ids"])]
        assert (got - ref).abs().max() < 0.05, n
        assert (logp.max(-1).values - ref).max() < 0.05, n  # greedy, up to the quantization error


@pytest.mark.parametrize("quantization", ["int8", "int4"])
def test_fused_layers_with_adapters_equal_the_per_op_path(adapters, monkeypatch, quantization):
    import sglpy.runtime.model.llama as llama

    base, folders = adapters
    calls = []
    real = llama.run_native_layers

    def counted(structs, ns, x, lora=None):
        calls.append(ns.lora is not None)
        return real(structs, ns, x, lora)

    monkeypatch.setattr(llama, "run_native_layers", counted)
    eng = Engine(base, quantization=quantization, grammar_workers=0, max_lora_rank=64, max_total_tokens=1024,
                 lora_paths=[f"{n}={p}" for n, p in folders.items()])
    try:
        assert eng.runner.model.native_lora is not None
        fused = _run(eng, fused=True)
        assert sum(calls) >= GREEDY["max_new_tokens"] - 1  # the decode steps with adapter rows ran fused
        n_fused = len(calls)
        per_op = _run(eng, fused=False)
        assert len(calls) == n_fused
        for f, p in zip(fused, per_op):
            assert f["output_ids"] == p["output_ids"]
            assert [e[0] for e in f["meta_info"]["output_token_logprobs"]] == \
                [e[0] for e in p["meta_info"]["output_token_logprobs"]]
        by_name = {}
        for n, f in zip(NAMES, fused):
            by_name.setdefault(n, set()).add(tuple(f["output_ids"]))
        assert len(by_name) == 4  # the adapters change the output (else equality proves little)
        if quantization == "int8":
            _hf_close(base, folders, eng, fused)
    finally:
        eng.shutdown()


def test_pool_dtype():
    from sglpy.runtime.lora.manager import pool_dtype

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert pool_dtype("auto", torch.float32, cpu, "int4") == torch.bfloat16  # the fused layers' faster pool
    assert pool_dtype("auto", torch.float32, cpu, "none") == torch.float32  # HF + PEFT equality mode
    assert pool_dtype("float32", torch.float32, cpu, "int8") == torch.float32
    assert pool_dtype("auto", torch.float16, cuda, "none") == torch.float16
    with pytest.raises(ValueError, match="lora_dtype bfloat16 differs from the model's"):
        pool_dtype("bfloat16", torch.float16, cuda, "none")

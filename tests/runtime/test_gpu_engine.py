"""The engine on a CUDA GPU (skipped without one): HF equality, bf16 closeness, graphs, overlap, Triton vs torch.

Run by `make test-gpu` (TRITON_INTERPRET=0: compiled kernels). The model is random-weight with Llama-3.2-1B's
shapes cut to 4 layers (runtime/testing/tiny_model.py, preset llama-1b), built on the machine.
Tolerances: float32 logprobs within 2e-3 of HF float32 and identical greedy tokens; bfloat16 prompt logprobs
within 0.25 nats (max) and 0.05 (mean) of HF float32.
"""

import gc
import math

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a land far", "1, 2, 3,"]
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from sglpy.runtime.testing.tiny_model import make_preset_model

    return make_preset_model(tmp_path_factory.mktemp("gpu-models") / "llama-1b-4l", "llama-1b", num_layers=4)


@pytest.fixture(scope="module")
def hf_model(model_path):
    from transformers import AutoModelForCausalLM

    m = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).cuda().eval()
    yield m
    del m
    _free()


def _free():
    gc.collect()
    torch.cuda.empty_cache()


def _engine(model_path, **kw):
    from sglpy.runtime.engine import Engine

    kw.setdefault("max_total_tokens", 16384)
    kw.setdefault("max_context_len", 4096)
    kw.setdefault("max_running_requests", 32)
    return Engine(model_path, device="cuda", debug_invariants=True, **kw)


def _run(model_path, prompts, sp, **kw):
    eng = _engine(model_path, **kw)
    try:
        outs = eng.generate(prompts, sp, return_logprob=True)
        info = eng.get_server_info()
        assert info["kv_used"] == 0 and info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]
        return outs, eng
    finally:
        eng.shutdown()


@torch.no_grad()
def _hf_greedy(hf, ids: list[int], n: int) -> tuple[list[int], list[float]]:
    """HF greedy continuation and the chosen tokens' logprobs (float32, full recompute each token)."""
    out, lps = [], []
    for _ in range(n):
        logits = hf(torch.tensor([ids + out], device="cuda")).logits[0, -1].float()
        lp = torch.log_softmax(logits, -1)
        t = int(lp.argmax())
        out.append(t)
        lps.append(float(lp[t]))
    return out, lps


def test_greedy_fp32_equals_hf(model_path, hf_model):
    outs, eng = _run(model_path, PROMPTS, GREEDY)
    for p, o in zip(PROMPTS, outs):
        ids = eng.tokenizer(p)["input_ids"]
        want, want_lp = _hf_greedy(hf_model, ids, GREEDY["max_new_tokens"])
        assert o["output_ids"] == want, p
        got_lp = [e[0] for e in o["meta_info"]["output_token_logprobs"]]
        assert got_lp == pytest.approx(want_lp, abs=2e-3), p


@torch.no_grad()
def test_bf16_prompt_logprobs_close_to_hf_fp32(model_path, hf_model):
    eng = _engine(model_path, dtype="bfloat16")
    try:
        diffs = []
        for p in PROMPTS:
            o = eng.generate(p, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
            got = [e[0] for e in o["meta_info"]["input_token_logprobs"]][1:]  # position 0 has no logprob
            ids = eng.tokenizer(p)["input_ids"]
            lp = torch.log_softmax(hf_model(torch.tensor([ids], device="cuda")).logits[0].float(), -1)
            want = [float(lp[i, ids[i + 1]]) for i in range(len(ids) - 1)]
            diffs += [abs(a - b) for a, b in zip(got, want)]
        assert max(diffs) < 0.25 and sum(diffs) / len(diffs) < 0.05, (max(diffs), sum(diffs) / len(diffs))
    finally:
        eng.shutdown()


@pytest.mark.parametrize("n", [1, 3, 17])
def test_cuda_graph_equals_eager(model_path, n):
    prompts = [f"Request {i}: " + "tell me more " * (i % 5) for i in range(n)]
    sps = [dict(GREEDY, max_new_tokens=6 + 3 * (i % 4)) for i in range(n)]
    graph_outs, graph_eng = _run(model_path, prompts, sps)
    assert graph_eng.runner.graphs is not None and graph_eng.runner.graphs.graphs, "no graphs were captured"
    assert graph_eng.runner.graphs.replays > 0
    eager_outs, eager_eng = _run(model_path, prompts, sps, disable_cuda_graph=True)
    assert eager_eng.runner.graphs is None
    assert [o["output_ids"] for o in graph_outs] == [o["output_ids"] for o in eager_outs]
    for g, e in zip(graph_outs, eager_outs):
        assert [x[0] for x in g["meta_info"]["output_token_logprobs"]] == pytest.approx(
            [x[0] for x in e["meta_info"]["output_token_logprobs"]], abs=1e-3)
    _free()


def test_multi_token_graph_steps_equal_eager(model_path):
    """Jumped spans ride captured multi-token steps (runtime/model/extend_graph.py): outputs equal the eager run."""
    rx = r"[0-9] is the answer, and [a-z]{2} is all\."
    prompts = [f"Q{i}:" for i in range(5)]
    sp = {"regex": rx, "max_new_tokens": 40, "temperature": 0}
    graph_outs, graph_eng = _run(model_path, prompts, sp)
    assert graph_eng.runner.extend_graphs is not None and graph_eng.runner.extend_graphs.graphs
    assert graph_eng.runner.extend_graphs.replays > 0
    eager_outs, _ = _run(model_path, prompts, sp, disable_cuda_graph=True)
    assert [o["output_ids"] for o in graph_outs] == [o["output_ids"] for o in eager_outs]
    _free()


def test_overlap_equals_plain_on_cuda(model_path):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
              "required": ["a", "b"]}
    prompts = PROMPTS + ["JSON please:", "Another JSON:"]
    sps = [GREEDY] * 4 + [{"max_new_tokens": 30, "temperature": 0, "json_schema": schema}] * 2
    over, eng = _run(model_path, prompts, sps)
    assert eng.overlap is not None  # on by default on CUDA
    plain, eng2 = _run(model_path, prompts, sps, disable_overlap_schedule=True)
    assert eng2.overlap is None
    assert [o["output_ids"] for o in over] == [o["output_ids"] for o in plain]
    _free()


def test_torch_reference_kernels_equal_triton(model_path, monkeypatch):
    triton_outs, _ = _run(model_path, PROMPTS, GREEDY)
    monkeypatch.setenv("SGLPY_DISABLE_TRITON", "1")
    ref_outs, eng = _run(model_path, PROMPTS, GREEDY)
    assert eng.runner.graphs is None  # graphs need the Triton kernels (the references sync with the host)
    assert [o["output_ids"] for o in triton_outs] == [o["output_ids"] for o in ref_outs]
    _free()


def test_kv_pool_sized_from_free_memory(model_path):
    from sglpy.runtime.memory.sizing import kv_bytes_per_token

    _free()
    eng = _engine(model_path, max_total_tokens=None, mem_fraction_static=0.5)
    try:
        plan = eng.memory_plan
        r = eng.runner
        assert plan is not None and plan.kv_bytes_per_token == kv_bytes_per_token(r.num_layers, r.num_kv_heads,
                                                                                  r.head_dim, 4)
        assert eng.get_server_info()["max_total_num_tokens"] == plan.max_total_tokens
        assert plan.max_total_tokens * plan.kv_bytes_per_token <= plan.free_bytes - plan.reserved_bytes
        assert math.isclose(plan.reserved_bytes, plan.total_bytes * 0.5, rel_tol=1e-6)
        assert eng.generate("hello", GREEDY)["meta_info"]["completion_tokens"] == 16
    finally:
        eng.shutdown()
        del eng
        _free()

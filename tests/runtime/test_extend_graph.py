"""Multi-token CUDA-graph steps run eagerly on CPU: padded slots give the unpadded forward's logits, and the engine
takes jumped spans through them with unchanged outputs."""

import re

import pytest
import torch

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.testing.runner_kv import runner_kv

from test_cuda_graph import _prefill


def _runner(path, graphs: bool, t: int = 4):
    cfg = EngineConfig(model=path, device="cpu", max_running_requests=8, cuda_graph_max_bs=8, quantization="none",
                       disable_cuda_graph=not graphs, cuda_graph_extend_tokens=t)
    runner = ModelRunner(cfg, path)
    kv = runner_kv(runner, 512, 8)
    runner.init_decode_graphs(cfg, kv.buffers, kv.padding)
    return runner, kv


def _step(runner, kv, extra: list[int]):
    """Prefill 3 requests, then one forward where request i extends by 1 + extra[i] tokens."""
    reqs = [Req(rid=str(i), input_ids=list(range(10 + 3 * i, 20 + 5 * i)), sampling=SamplingParams())
            for i in range(len(extra))]
    _prefill(runner, kv, reqs)
    entries = []
    for r, k in zip(reqs, extra):  # k forced tokens after the sampled one (as jump-forward appends them)
        r.output_ids.extend(range(30, 30 + k))
        n = r.kv_len
        kv.grow(r, 1 + k)
        entries.append(BatchEntry(r, n, 1 + k, sample=True))
    entries.sort(key=lambda e: e.extend_len)  # decode entries (one token) first, as the scheduler orders them
    num_decode = sum(e.extend_len == 1 for e in entries)
    return runner.forward(entries, num_decode, kv.buffers)


@pytest.mark.parametrize("extra", [[0, 2, 3], [3, 3, 3], [0, 1, 0]])
def test_padded_multi_token_step_equals_unpadded(tiny_model_path, extra):
    outs = {}
    for graphs in (False, True):
        runner, kv = _runner(tiny_model_path, graphs)
        outs[graphs] = _step(runner, kv, extra)
        if graphs:
            assert runner.extend_graphs.replays == 1
    a, b = outs[True], outs[False]
    assert a.sample_row == b.sample_row and a.logits.shape == b.logits.shape
    torch.testing.assert_close(a.logits, b.logits, atol=1e-5, rtol=1e-5)


def test_longer_extends_and_prompt_logprobs_stay_eager(tiny_model_path):
    runner, kv = _runner(tiny_model_path, True, t=2)
    _step(runner, kv, [0, 2])  # 3 tokens > T = 2: the eager forward
    assert runner.extend_graphs.replays == 0
    with pytest.raises(ValueError, match="cuda_graph_extend_tokens"):
        EngineConfig(cuda_graph_extend_tokens=0)


def test_engine_jumps_through_the_multi_token_path_with_unchanged_outputs(tiny_model_path):
    from sglpy.runtime.engine import Engine

    rx = r"[0-9] is the answer, and [a-z]{2} is all\."
    prompts = [f"Q{i}:" for i in range(5)]
    sp = {"regex": rx, "max_new_tokens": 40, "temperature": 0}
    outs = {}
    # (disable_cuda_graph, disable_overlap_schedule): eager; padded graphs; padded graphs + overlap (future ids)
    for flag, overlap_off in ((True, True), (False, True), (False, False)):
        eng = Engine(tiny_model_path, max_total_tokens=2048, max_running_requests=8, cuda_graph_max_bs=8,
                     disable_cuda_graph=flag, disable_overlap_schedule=overlap_off, debug_invariants=True,
                     quantization="none")
        try:
            res = eng.generate(prompts, [sp] * len(prompts))
            assert all(re.fullmatch(rx, o["text"]) for o in res), [o["text"] for o in res]
            assert all(o["meta_info"]["jump_forward_tokens"] > 0 for o in res)
            outs[flag, overlap_off] = [o["output_ids"] for o in res]
            if not flag:
                assert eng.runner.extend_graphs.replays > 0
            info = eng.get_server_info()
            assert info["kv_used"] == 0 and info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]
        finally:
            eng.shutdown()
    assert outs[True, True] == outs[False, True] == outs[False, False]


def test_long_jumped_spans_ride_the_multi_token_steps_in_pieces(tiny_model_path):
    """A forced span longer than T extends T tokens a step (no sample until it is caught up), never eagerly."""
    from sglpy.runtime.engine import Engine

    rx = r"[0-9] is the answer to everything that was asked today, and [a-z]{2} is all\."
    prompts = [f"Q{i}:" for i in range(4)]
    sp = {"regex": rx, "max_new_tokens": 60, "temperature": 0}
    outs, eager_steps = {}, {}
    # eager; padded multi-token steps with T = 2, plain and overlapped
    for flag, overlap_off in ((True, True), (False, True), (False, False)):
        eng = Engine(tiny_model_path, max_total_tokens=2048, max_running_requests=8, cuda_graph_max_bs=8,
                     disable_cuda_graph=flag, disable_overlap_schedule=overlap_off, debug_invariants=True,
                     quantization="none", cuda_graph_extend_tokens=2)
        try:
            res = eng.generate(prompts, [sp] * len(prompts))
            assert all(re.fullmatch(rx, o["text"]) for o in res), [o["text"] for o in res]
            outs[flag, overlap_off] = [o["output_ids"] for o in res]
            if not flag:
                r = eng.runner
                assert eng.scheduler.span_cap == 2
                eager_steps[overlap_off] = eng.stats["num_steps"] - r.graphs.replays - r.extend_graphs.replays
            else:
                assert eng.scheduler.span_cap is None  # no multi-token steps: a span extends whole
            info = eng.get_server_info()
            assert info["kv_used"] == 0
        finally:
            eng.shutdown()
    assert outs[True, True] == outs[False, True] == outs[False, False]
    # the prompts' prefill alone: every jumped span went through the T = 2 steps
    assert eager_steps == {True: 1, False: 1}, eager_steps

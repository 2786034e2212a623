"""The CUDA-graph decode path run eagerly on CPU: buckets, padding rows, static buffers, future-id resolution."""

import pytest
import torch

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.model.cuda_graph import bucket_for, capture_buckets, resolve_future_ids
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.testing.runner_kv import runner_kv


def test_buckets():
    assert capture_buckets(128, 160) == (1, 2, 4, 8, 16, 24, 32, 40, 48, 56, 64, 72, 80, 88, 96, 104, 112, 120, 128)
    assert capture_buckets(100, 160)[-3:] == (88, 96, 100)  # the scheduler's largest batch always has a bucket
    assert capture_buckets(3, 160) == (1, 2, 3)
    assert capture_buckets(128, 20) == (1, 2, 4, 8, 16, 20)
    assert [bucket_for(b, (1, 2, 4, 8, 16)) for b in (1, 3, 5, 9, 16, 17)] == [1, 4, 8, 16, 16, None]
    with pytest.raises(ValueError):
        capture_buckets(0, 4)


def test_resolve_future_ids():
    fut = torch.tensor([100, 200, 300])
    got = resolve_future_ids(torch.tensor([5, -1, 7, -3, -2]), fut)
    assert got.tolist() == [5, 100, 7, 300, 200]
    with pytest.raises(ValueError, match="placeholders"):
        resolve_future_ids(torch.tensor([-1]), None)


def _prefill(runner, kv, reqs):
    entries = []
    for r in reqs:
        kv.assign_row(r)
        kv.grow(r, len(r.input_ids))
        entries.append(BatchEntry(r, 0, len(r.input_ids), sample=True))
    out = runner.forward(entries, 0, kv.buffers)
    for r, row in zip(reqs, out.sample_row):
        r.output_ids.append(int(out.logits[row].argmax()))


def _decode(runner, kv, reqs):
    for r in reqs:
        kv.grow(r, 1)
    entries = [BatchEntry(r, r.kv_len - 1, 1, sample=True) for r in reqs]
    return runner.forward(entries, len(entries), kv.buffers)


@pytest.mark.parametrize("batch", [1, 3, 5])
def test_padded_decode_equals_unpadded(tiny_model_path, batch):
    """The same requests decoded through padded buckets and through the plain forward: same logits, no KV leak."""
    runs = {}
    for graphs in (False, True):
        # quantization none: int8 kernels need not give identical results across batch shapes
        cfg = EngineConfig(model=tiny_model_path, device="cpu", max_running_requests=8, cuda_graph_max_bs=8,
                           disable_cuda_graph=not graphs, quantization="none")
        runner = ModelRunner(cfg, tiny_model_path)
        kv = runner_kv(runner, 512, 8)
        runner.init_decode_graphs(cfg, kv.buffers, kv.padding)
        assert (runner.graphs is not None) == graphs
        reqs = [Req(rid=str(i), input_ids=list(range(10 + 3 * i, 20 + 5 * i)), sampling=SamplingParams())
                for i in range(batch)]
        _prefill(runner, kv, reqs)
        logits = []
        for _ in range(4):
            out = _decode(runner, kv, reqs)
            assert out.logits.shape[0] == batch and out.sample_row == list(range(batch))
            logits.append(out.logits.clone())
            for r, row in zip(reqs, out.logits.argmax(-1).tolist()):
                r.output_ids.append(row)
        if graphs:
            assert runner.graphs.replays == 4
            pad_slot, _ = kv.padding
            assert pad_slot not in {s for r in reqs for s in r.slots}
        runs[graphs] = (torch.stack(logits), [r.output_ids for r in reqs])
    torch.testing.assert_close(runs[True][0], runs[False][0], atol=1e-5, rtol=1e-5)
    assert runs[True][1] == runs[False][1]


def test_engine_graph_path_on_cpu_equals_eager(tiny_model_path):
    from sglpy.runtime.engine import Engine

    prompts = [f"Item {i}:" + " go" * i for i in range(6)]
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    outs = {}
    for flag in (True, False):
        eng = Engine(tiny_model_path, max_total_tokens=2048, max_running_requests=8, cuda_graph_max_bs=8,
                     disable_cuda_graph=flag, debug_invariants=True, quantization="none")
        try:
            outs[flag] = [o["output_ids"] for o in eng.generate(prompts, sp)]
            if not flag:
                assert eng.runner.graphs.replays > 0  # 6 requests: bucket 8, two padding rows
            info = eng.get_server_info()
            assert info["kv_used"] == 0 and info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]
        finally:
            eng.shutdown()
    assert outs[True] == outs[False]

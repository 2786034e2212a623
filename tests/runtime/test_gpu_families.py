"""The non-Llama families on a CUDA GPU (skipped without one): each tiny family model's float32 logits against HF's
(CPU float32), bf16 greedy tokens against float32's, and the families that take CUDA graphs (all but the experts:
Qwen3, Phi-4-mini, and Gemma 2/3 whose windows and soft-caps are constants of the Triton attention launches)
decoding captured graphs with the same tokens as eager decode.

Run by `make test-gpu` (TRITON_INTERPRET=0). Tolerances: float32 logits within 2e-3 of HF's (TF32 is off; the
Triton attention and torch matmuls reorder sums); bf16: the first 4 greedy tokens equal float32's (the MoE model
only decodes in bf16: its random router's near-ties pick other experts than float32's).
"""

import gc

import pytest
import torch

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.testing.tiny_model import FAMILY_CONFIGS, make_family_model

from test_engine_model import _hf, hf_logits, our_logits

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

PROMPTS = [[1, 5, 9, 200, 3000], [7], list(range(100, 137)), [42, 43]]  # the 37-token one crosses the windows
GREEDY = {"max_new_tokens": 16, "temperature": 0, "ignore_eos": True}


@pytest.fixture(scope="module")
def family_paths(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu-families")
    return {f: make_family_model(root / f, f) for f in sorted(FAMILY_CONFIGS)}


def _free():
    gc.collect()
    torch.cuda.empty_cache()


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_cuda_float32_logits_match_hf(family_paths, family):
    path = family_paths[family]
    runner = ModelRunner(EngineConfig(model=path, device="cuda", dtype="float32", max_total_tokens=512,
                                      max_running_requests=8), path)
    try:
        ours = [t.float().cpu() for t in our_logits(runner, PROMPTS)]
    finally:
        del runner
        _free()
    for a, b in zip(ours, hf_logits(_hf(path), PROMPTS)):
        assert (a - b).abs().max().item() <= 2e-3


def _generate(path, **kw):
    from sglpy.runtime.engine import Engine

    eng = Engine(path, device="cuda", max_total_tokens=4096, max_running_requests=8, cuda_graph_max_bs=8,
                 debug_invariants=True, **kw)
    try:
        outs = eng.generate(input_ids=[[1, 17, 300, 4000], list(range(500, 530)), [9, 9, 9]], sampling_params=GREEDY)
        replays = eng.runner.graphs.replays if eng.runner.graphs is not None else 0
        return [o["output_ids"] for o in outs], replays
    finally:
        eng.shutdown()
        _free()


@pytest.mark.parametrize("family", ["qwen3", "phi4-mini", "gemma2", "gemma3"])
def test_cuda_graphs_equal_eager(family_paths, family):
    eager, none = _generate(family_paths[family], dtype="float32", disable_cuda_graph=True)
    graphs, replays = _generate(family_paths[family], dtype="float32", disable_cuda_graph=False)
    assert none == 0 and replays > 0  # captured and replayed
    assert graphs == eager


@pytest.mark.parametrize("family", ["gemma2", "qwen3-moe"])
def test_cuda_bf16_close_to_float32_eager_for_the_others(family_paths, family):
    """bf16 starts like float32 (Gemma 2 under CUDA graphs; the experts decode eagerly: auto graphs log why)."""
    f32, _ = _generate(family_paths[family], dtype="float32")
    b16, replays = _generate(family_paths[family], dtype="bfloat16")
    assert (replays == 0) == (family == "qwen3-moe")
    assert all(len(b) == GREEDY["max_new_tokens"] for b in b16)
    if family == "qwen3-moe":
        # a bf16 router near-tie on this random model picks other experts (on the H200 even the first greedy
        # token differed from float32's): its float32 logits are checked against HF above; bf16 only decodes here
        return
    assert all(a[:4] == b[:4] for a, b in zip(f32, b16)), (f32, b16)

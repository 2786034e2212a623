"""Our model vs HF transformers on the same weights: logits and greedy generation."""

import pytest
import torch

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams
from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.testing.runner_kv import runner_kv


def our_logits(runner: ModelRunner, prompts: list[list[int]], kv_cache_dtype: str = "auto") -> list[torch.Tensor]:
    """Logits at every position of each prompt, from one ragged extend forward of our model."""
    kv = runner_kv(runner, sum(map(len, prompts)) + 1, len(prompts), kv_cache_dtype)
    entries = []
    for i, ids in enumerate(prompts):
        req = Req(rid=str(i), input_ids=list(ids), sampling=SamplingParams(max_new_tokens=1),
                  logprob=LogprobOptions(return_logprob=True, logprob_start_len=0))
        assert kv.assign_row(req) and kv.grow(req, len(ids))
        entries.append(BatchEntry(req, 0, len(ids), sample=True))
    out = runner.forward(entries, 0, kv.buffers)
    return [out.logits[list(out.input_rows[i]) + [out.sample_row[i]]] for i in range(len(entries))]


def hf_logits(hf_model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """HF transformers logits for each prompt, run one at a time (no padding effects)."""
    outs = []
    with torch.no_grad():
        for ids in prompts:
            outs.append(hf_model(torch.tensor([ids])).logits[0].float())
    return outs


def make_runner(path: str, **kw) -> ModelRunner:
    """A ModelRunner on CPU for a model folder; float32 weights (quantization='none') unless kw says otherwise."""
    kw.setdefault("quantization", "none")  # the CPU default (auto) quantizes; comparisons with HF need exact weights
    return ModelRunner(EngineConfig(model=path, device="cpu", **kw), path)


PROMPT_TEXTS = ["Hello", "The capital of France is", "def fib(n):\n    return",
                "Once upon a time, in a land far, far away, there lived a"]


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()


@pytest.mark.parametrize("arch", ["llama", "qwen2", "mistral"])
def test_tiny_logits_match_hf_ragged_batch(tmp_path, arch):
    from sglpy.runtime.testing import make_tiny_model

    path = make_tiny_model(tmp_path / arch, arch=arch, tie_word_embeddings=(arch == "llama"))
    runner = make_runner(path, max_total_tokens=512, max_running_requests=8)
    prompts = [[1, 5, 9, 200, 3000], [7], list(range(100, 137)), [42, 43]]
    ours = our_logits(runner, prompts)
    theirs = hf_logits(_hf(path), prompts)
    for a, b in zip(ours, theirs):
        assert a.shape == b.shape
        assert (a - b).abs().max().item() <= 1e-3


@pytest.mark.slow
def test_default_model_logits_match_hf(default_model_path):
    runner = make_runner(default_model_path, max_total_tokens=2048, max_running_requests=8)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_path)
    prompts = [tok.encode(t) for t in PROMPT_TEXTS]
    ours = our_logits(runner, prompts)
    theirs = hf_logits(_hf(default_model_path), prompts)
    for a, b in zip(ours, theirs):
        assert (a - b).abs().max().item() <= 1e-3


@pytest.mark.slow
def test_default_model_greedy_matches_hf_generate(default_model_path):
    """20+ prompts submitted from threads at staggered times; greedy tokens equal HF generate()."""
    import threading
    import time

    from sglpy.runtime.engine import Engine

    eng = Engine(default_model_path, max_total_tokens=8192, debug_invariants=True, quantization="none")
    tok = eng.tokenizer
    subjects = ["cats", "the ocean", "Python", "winter", "music", "trains", "the moon", "bread", "chess", "rain",
                "a robot", "gardens", "history", "volcanoes", "friendship", "coffee", "mountains", "books",
                "bicycles", "stars", "the sun", "dogs"]
    prompts = []
    for i, s in enumerate(subjects):
        if i % 2:
            prompts.append(tok.apply_chat_template([{"role": "user", "content": f"Write one sentence about {s}."}],
                                                   tokenize=False, add_generation_prompt=True))
        else:
            prompts.append(f"Here is a short fact about {s}:")
    n_new = [12 + (i * 7) % 20 for i in range(len(prompts))]
    results = [None] * len(prompts)

    def run(i):
        time.sleep(0.05 * (i % 5))  # some arrive while others decode
        results[i] = eng.generate(prompts[i], {"max_new_tokens": n_new[i], "temperature": 0})

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(prompts))]
    [t.start() for t in threads]
    [t.join() for t in threads]
    info = eng.get_server_info()
    eng.shutdown()
    hf = _hf(default_model_path)
    mismatches = []
    for i, p in enumerate(prompts):
        ids = tok.encode(p)
        with torch.no_grad():
            ref = hf.generate(torch.tensor([ids]), attention_mask=torch.ones(1, len(ids), dtype=torch.long),
                              max_new_tokens=n_new[i], do_sample=False)[0, len(ids):].tolist()
        ours = results[i]["output_ids"]
        if ours != ref:
            j = next(k for k in range(min(len(ours), len(ref))) if ours[k] != ref[k])
            with torch.no_grad():
                logits = hf(torch.tensor([ids + ref[:j]])).logits[0, -1]
            gap = (logits[ref[j]] - logits[ours[j]]).abs().item()
            mismatches.append((i, j, gap))
    assert len(mismatches) <= 1, mismatches
    for _, _, gap in mismatches:
        assert gap < 1e-4, f"mismatch is not a near tie: {mismatches}"
    assert info["kv_used"] == 0

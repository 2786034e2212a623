"""The decode step's batched append (OutputProcessor.complete without a fault hook) gives what the per-phase
path gives (the path a fault hook forces), token by token: outputs, text, finish reasons and finish steps."""

import random

import pytest
import torch

from sglpy.runtime.core import Req
from sglpy.runtime.engine.detokenizer import IncrementalDetokenizer
from sglpy.runtime.engine.processor import OutputProcessor, SampleLaunch
from sglpy.runtime.engine.sampler import Sampler
from sglpy.runtime.sampling_params import SamplingParams

EOS = 2


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def _params(rng: random.Random, words: list[int]) -> SamplingParams:
    max_new = rng.choice([None, 3, 12, 40])
    kw = dict(max_new_tokens=max_new, min_new_tokens=min(rng.choice([0, 0, 2, 5]), max_new or 5),
              ignore_eos=rng.random() < 0.3)
    if rng.random() < 0.4:
        kw["stop_token_ids"] = tuple(rng.sample(words, 2))
    if rng.random() < 0.5:
        kw["stop"] = rng.choice([["e"], [" th", "xyz"], ["<never matches>"]])
    if rng.random() < 0.15:
        kw["stop_regex"] = [r"a\s"]
    return SamplingParams(**kw)


def _requests(tokenizer, seed: int, n: int = 24) -> list[Req]:
    rng = random.Random(seed)
    words = tokenizer.encode(" the cat sat on a mat; the end of these words", add_special_tokens=False)
    reqs = []
    for i in range(n):
        r = Req(rid=str(i), input_ids=[5 + i, 9, 11], sampling=_params(rng, words))
        r.detok = IncrementalDetokenizer(tokenizer, r.input_ids)
        reqs.append(r)
    return reqs


def _run(tokenizer, hook: bool, seed: int, max_context: int) -> list[tuple]:
    proc = OutputProcessor(Sampler(0, torch.device("cpu")), {EOS}, max_context)
    if hook:
        proc.iso.hook = lambda phase, req: None  # a no-op fault hook: every token takes the per-phase path
    reqs = _requests(tokenizer, seed)
    words = tokenizer.encode(" the cat sat on a mat; the end of these words", add_special_tokens=False)
    rng = random.Random(seed + 1)
    ended = {}
    for step in range(50):
        live = [r for r in reqs if not r.finished]
        if not live:
            break
        tokens = [rng.choice(words + [EOS]) for _ in live]
        for r in proc.complete(SampleLaunch(live, torch.tensor(tokens), [], None, []), tokens):
            ended[r.rid] = step
    return [(r.output_ids, r.text, r.finish_reason and r.finish_reason.to_json(), ended.get(r.rid)) for r in reqs]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_batched_append_equals_the_per_phase_path(tokenizer, seed):
    assert _run(tokenizer, False, seed, 4096) == _run(tokenizer, True, seed, 4096)
    assert _run(tokenizer, False, seed, 20) == _run(tokenizer, True, seed, 20)  # the context limit ends some


def test_a_failing_detokenizer_ends_its_request_alone(tokenizer):
    proc = OutputProcessor(Sampler(0, torch.device("cpu")), {EOS}, 4096)
    reqs = [Req(rid=str(i), input_ids=[5, 9], sampling=SamplingParams(max_new_tokens=8, stop=["xyz"]))
            for i in range(3)]
    for r in reqs:
        r.detok = IncrementalDetokenizer(tokenizer, r.input_ids)
        r.first_token_time = 0.0

    def broken(ids):
        raise RuntimeError("decode failed")

    reqs[1].detok.catch_up = broken
    tokens = [100, 101, 102]
    finished = proc.complete(SampleLaunch(reqs, torch.tensor(tokens), [], None, []), tokens)
    assert finished == [reqs[1]]
    assert reqs[1].finish_reason.type == "abort" and "detokenize" in reqs[1].finish_reason.message
    assert proc.iso.failures == {"detokenize": 1}
    assert not reqs[0].finished and not reqs[2].finished
    assert reqs[0].output_ids == [100] and reqs[0].text == tokenizer.decode([100])

"""Shared fixtures' helpers for engine tests (imported by conftest fixtures)."""

from __future__ import annotations

import torch

from sglpy.runtime.config import EngineConfig, SamplingParams
from sglpy.runtime.model_runner import BatchEntry, ModelRunner
from sglpy.runtime.request import Req


def our_logits(runner: ModelRunner, prompts: list[list[int]]) -> list[torch.Tensor]:
    """Logits at every position of each prompt, from one ragged extend forward of our model."""
    entries = []
    for i, ids in enumerate(prompts):
        req = Req(rid=str(i), input_ids=list(ids), sampling=SamplingParams(max_new_tokens=1),
                  return_logprob=True, logprob_start_len=0)
        req.row = runner.req_pool.alloc_row()
        alloc = runner.kv.alloc(len(ids))
        assert alloc.ok
        req.slots = alloc.slots
        runner.req_pool.write(req.row, 0, req.slots)
        entries.append(BatchEntry(req, 0, len(ids), sample=True))
    out = runner.forward(entries, num_decode=0)
    result = []
    for i, e in enumerate(entries):
        rows = list(out.input_rows[i]) + [out.sample_row[i]]
        result.append(out.logits[rows])
        runner.kv.free(e.req.slots)
        runner.req_pool.free_row(e.req.row)
    return result


def hf_logits(hf_model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """HF transformers logits for each prompt, run one at a time (no padding effects)."""
    outs = []
    with torch.no_grad():
        for ids in prompts:
            outs.append(hf_model(torch.tensor([ids])).logits[0].float())
    return outs


def make_runner(path: str, **kw) -> ModelRunner:
    """A ModelRunner on CPU for a model folder."""
    return ModelRunner(EngineConfig(model=path, device="cpu", **kw), path)

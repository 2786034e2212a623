"""Validates and normalises Engine.generate() arguments into one RequestSpec per prompt."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any

from ..sampling_params import SamplingParams


@dataclass(frozen=True)
class RequestSpec:
    """A validated request ready to become a Req."""

    rid: str
    input_ids: list[int]
    sampling: SamplingParams
    return_logprob: bool
    logprob_start_len: int
    top_logprobs_num: int
    return_text_in_logprobs: bool
    extra_key: str | None
    guide: Any = None  # compiled grammar guide when the request has a constraint


def _per_item(value, n: int, name: str, is_batch: bool) -> list:
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def normalize_request(engine, prompt, sampling_params, input_ids, return_logprob, logprob_start_len,
                      top_logprobs_num, return_text_in_logprobs, rid, extra_key):
    """Validate generate() arguments; returns (specs, is_batch). Raises ValueError naming the problem."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of prompt (text) or input_ids")
    if prompt is not None:
        is_batch = isinstance(prompt, list)
        prompts = prompt if is_batch else [prompt]
        for p in prompts:
            if not isinstance(p, str):
                raise ValueError(f"prompt must be a string or a list of strings, got {type(p).__name__}")
            if p == "":
                raise ValueError("prompt is empty")
        ids_list = [engine.tokenizer.encode(p) for p in prompts]
    else:
        is_batch = bool(input_ids) and isinstance(input_ids[0], list)
        ids_list = input_ids if is_batch else [input_ids]
        if not isinstance(input_ids, list):
            raise ValueError("input_ids must be a list of ints or a list of lists of ints")
    n = len(ids_list)
    if is_batch and n == 0:
        raise ValueError("empty batch")
    vocab = engine.runner.vocab_size
    sps = _per_item(sampling_params, n, "sampling_params", is_batch)
    lps = _per_item(return_logprob, n, "return_logprob", is_batch)
    starts = _per_item(logprob_start_len, n, "logprob_start_len", is_batch)
    tops = _per_item(top_logprobs_num, n, "top_logprobs_num", is_batch)
    rids = _per_item(rid, n, "rid", is_batch) if rid is not None else [None] * n
    keys = _per_item(extra_key, n, "extra_key", is_batch)
    specs = []
    for i, ids in enumerate(ids_list):
        if not isinstance(ids, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
            raise ValueError("input_ids must be lists of ints")
        if not ids:
            raise ValueError("prompt is empty (no tokens)")
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"token id(s) {bad[:5]} outside the vocabulary [0, {vocab})")
        if len(ids) >= engine.max_context:
            raise ValueError(f"prompt has {len(ids)} tokens; the model's context is {engine.max_context}")
        if len(ids) >= engine.kv.num_slots:
            raise ValueError(f"prompt has {len(ids)} tokens; the KV pool holds {engine.kv.num_slots}")
        sp = SamplingParams.from_dict(sps[i])
        room = engine.max_context - len(ids)
        if sp.max_new_tokens is None:
            sp = dataclasses.replace(sp, max_new_tokens=room)  # None: as many as the context has room for
        if sp.n != 1:
            raise ValueError("n > 1 is handled by the server/frontend: submit the prompt n times")
        start = -1 if starts[i] is None else starts[i]
        top = 0 if tops[i] is None else tops[i]
        if not isinstance(start, int) or start < -1 or start > len(ids):
            raise ValueError(f"logprob_start_len must be -1 or in [0, {len(ids)}], got {start!r}")
        if not isinstance(top, int) or top < 0:
            raise ValueError(f"top_logprobs_num must be a non-negative int, got {top!r}")
        guide = None
        if sp.constraint is not None:
            # compiled in the caller's thread (cached): the step loop never waits on a compile, and a
            # bad constraint raises here as a ValueError naming the problem
            guide = engine.constrained.compile(*sp.constraint)
        specs.append(RequestSpec(rid=str(rids[i]) if rids[i] is not None else uuid.uuid4().hex, input_ids=list(ids),
                                 sampling=sp, return_logprob=bool(lps[i]), logprob_start_len=start,
                                 top_logprobs_num=top, return_text_in_logprobs=bool(return_text_in_logprobs),
                                 extra_key=keys[i], guide=guide))
    return specs, is_batch

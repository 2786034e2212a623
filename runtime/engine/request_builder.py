"""Request building: one GenerateReqInput (parsed by runtime/request.py) -> GenerateReq, tokenized and checked against
the model's limits once, its constraint's compile started."""

from __future__ import annotations

import dataclasses
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Callable

from ..messages import GenerateReq, GenerateReqInput
from ..request import check_token_ids
from .tokenizer_ops import TokenizerOps


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit: the model's vocabulary and context, and the KV pool."""

    vocab_size: int
    context_len: int
    kv_slots: int


def build_request(inp: GenerateReqInput, ops: TokenizerOps, limits: RequestLimits,
                  compile_guide: Callable[[str, object], Future] | None) -> GenerateReq:
    """Tokenize and check one prompt against the limits; compile its constraint. ValueError names the problem.

    compile_guide(kind, value) starts the constraint's compile and returns a Future of its guide (a
    cache hit is already done); None means this engine has no constrained decoding, and a constrained
    request is refused rather than silently unconstrained.
    """
    ids = list(inp.input_ids) if inp.input_ids is not None else ops.encode_prompt(inp.text)
    if not ids:
        raise ValueError("prompt is empty (no tokens)")
    if inp.input_ids is not None:  # the engine's own guard: inputs also arrive from other callers than the parser
        check_token_ids(ids, limits.vocab_size, "input_ids")
    n, context = len(ids), limits.context_len
    if n >= context:
        raise ValueError(f"the prompt has {n} tokens, which does not fit the model's context of {context} tokens")
    if n >= limits.kv_slots:
        raise ValueError(f"the prompt has {n} tokens; the KV pool holds {limits.kv_slots}")
    sp = inp.sampling
    if sp.n != 1:
        raise ValueError("n > 1 is handled by the server/frontend: submit the prompt n times")
    if sp.max_new_tokens is None:
        sp = dataclasses.replace(sp, max_new_tokens=context - n)  # as many as the context has room for
    elif n + sp.max_new_tokens > context:
        raise ValueError(f"the prompt ({n} tokens) plus max_new_tokens ({sp.max_new_tokens}) exceeds the model's "
                         f"context of {context} tokens")
    if inp.logprob.logprob_start_len > n:
        raise ValueError(f"logprob_start_len must be -1 or in [0, {n}], got {inp.logprob.logprob_start_len}")
    guide = None
    if sp.constraint is not None:
        if compile_guide is None:
            raise ValueError("constrained decoding (regex / json_schema / ebnf / choices / structural_tag) is not available in this "
                             "engine")
        # compiled in a worker process: the request is admitted to the scheduler once its guide is ready
        guide = compile_guide(*sp.constraint)
    return GenerateReq(rid=inp.rid, input_ids=ids, sampling=sp, logprob=inp.logprob, extra_key=inp.extra_key,
                       stream=inp.stream, guide=guide, trace=inp.trace, max_thinking_tokens=inp.max_thinking_tokens,
                       lora_path=inp.lora_path)

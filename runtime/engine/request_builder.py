"""Request building: the batch / n-samples expansion every API shares (expand_inputs), offline generate() arguments ->
GenerateReqInput per prompt and sample -> GenerateReq, validated and tokenized once."""

from __future__ import annotations

import dataclasses
import uuid
from dataclasses import dataclass
from typing import Any, Callable

from ..messages import GenerateReq, GenerateReqInput
from ..sampling_params import LogprobOptions, SamplingParams
from .tokenizer_ops import TokenizerOps


@dataclass(frozen=True)
class RequestLimits:
    """What a request must fit: the model's vocabulary and context, and the KV pool."""

    vocab_size: int
    context_len: int
    kv_slots: int


@dataclass(frozen=True)
class Expanded:
    """One engine request of an expanded batch: its input, its prompt's index, and its index among the n samples."""

    inp: GenerateReqInput
    prompt: int
    sample: int


def expand_inputs(prompts: list[dict], sampling: list[SamplingParams], logprob: list[LogprobOptions],
                  extra_key: list[str | None], rid_of: Callable[[int, int, int], str],
                  n: list[int] | None = None, stream: bool = False,
                  make: Callable[..., GenerateReqInput] | None = None) -> list[Expanded]:
    """Batch and n-samples expansion, shared by the offline, native and OpenAI APIs: prompt i asks for n[i]
    samples (default: its sampling's n), each one engine request with n=1, named rid_of(i, j, n[i]).

    make(rid, prompt, sampling, logprob, extra_key) builds each input (the server turns a bad prompt into an
    HTTP 400 there); by default GenerateReqInput(..., stream=stream)."""
    if make is None:
        def make(rid, prompt, sp, lp, key):
            return GenerateReqInput(rid=rid, sampling=sp, logprob=lp, extra_key=key, stream=stream, **prompt)
    out = []
    for i, p in enumerate(prompts):
        sp = sampling[i]
        k = sp.n if n is None else n[i]
        if sp.n != 1:
            sp = dataclasses.replace(sp, n=1)  # n samples are n engine requests
        for j in range(k):
            out.append(Expanded(make(rid_of(i, j, k), p, sp, logprob[i], extra_key[i]), i, j))
    return out


def _per_item(value, n: int, name: str, is_batch: bool) -> list:
    if is_batch and isinstance(value, list):
        if len(value) != n:
            raise ValueError(f"{name} has {len(value)} entries for {n} prompts")
        return value
    return [value] * n


def generate_inputs(prompt=None, sampling_params=None, input_ids=None, return_logprob=False,
                    logprob_start_len=None, top_logprobs_num=None, return_text_in_logprobs=False, rid=None,
                    extra_key=None, stream=False, lora_path=None) -> tuple[list[GenerateReqInput], bool]:
    """Engine.generate()'s arguments (SGLang's offline API) as one GenerateReqInput per prompt and sample, and whether
    the answer is a list (a batch of prompts, or n > 1 samples: rids `rid-j`, as the native API names them)."""
    if (prompt is None) == (input_ids is None):
        raise ValueError("give exactly one of prompt (text) or input_ids")
    if prompt is not None:
        is_batch = isinstance(prompt, list)
        prompts = [{"text": p} for p in (prompt if is_batch else [prompt])]
        if any(not isinstance(p["text"], str) for p in prompts):
            raise ValueError("prompt must be a string or a list of strings")
    else:
        if not isinstance(input_ids, list):
            raise ValueError("input_ids must be a list of ints or a list of lists of ints")
        is_batch = bool(input_ids) and isinstance(input_ids[0], list)
        prompts = [{"input_ids": ids} for ids in (input_ids if is_batch else [input_ids])]
    n = len(prompts)
    if is_batch and n == 0:
        raise ValueError("empty batch")
    if stream and is_batch:
        raise ValueError("stream=True takes a single prompt, not a list")
    sps = _per_item(sampling_params, n, "sampling_params", is_batch)
    lps = _per_item(return_logprob, n, "return_logprob", is_batch)
    starts = _per_item(logprob_start_len, n, "logprob_start_len", is_batch)
    tops = _per_item(top_logprobs_num, n, "top_logprobs_num", is_batch)
    rids = _per_item(rid, n, "rid", is_batch) if rid is not None else [None] * n
    keys = _per_item(extra_key, n, "extra_key", is_batch)
    logprobs = [LogprobOptions(return_logprob=bool(lps[i]), return_text_in_logprobs=bool(return_text_in_logprobs),
                               logprob_start_len=-1 if starts[i] is None else starts[i],
                               top_logprobs_num=0 if tops[i] is None else tops[i]) for i in range(n)]
    samplings = [SamplingParams.from_dict(sp) for sp in sps]

    def rid_of(i: int, j: int, k: int) -> str:
        rid = str(rids[i]) if rids[i] is not None else uuid.uuid4().hex
        return f"{rid}-{j}" if k > 1 else rid

    loras = _per_item(lora_path, n, "lora_path", is_batch)  # an adapter name per prompt (None: the base model)
    inputs = [dataclasses.replace(e.inp, lora_path=loras[e.prompt]) if loras[e.prompt] is not None else e.inp
              for e in expand_inputs(prompts, samplings, logprobs, keys, rid_of, stream=stream)]
    if stream and len(inputs) > 1:
        raise ValueError("stream=True takes a single prompt and n=1")
    return inputs, is_batch or len(inputs) > n


def build_request(inp: GenerateReqInput, ops: TokenizerOps, limits: RequestLimits,
                  compile_guide: Callable[[str, Any], Any] | None) -> GenerateReq:
    """Tokenize and check one prompt against the limits; compile its constraint. ValueError names the problem.

    compile_guide(kind, value) starts the constraint's compile and returns a Future of its guide (a
    cache hit is already done); None means this engine has no constrained decoding, and a constrained
    request is refused rather than silently unconstrained.
    """
    ids = list(inp.input_ids) if inp.input_ids is not None else ops.encode_prompt(inp.text)
    if not ids:
        raise ValueError("prompt is empty (no tokens)")
    bad = [t for t in ids if not 0 <= t < limits.vocab_size]
    if bad:
        raise ValueError(f"token id(s) {bad[:5]} outside the vocabulary [0, {limits.vocab_size})")
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

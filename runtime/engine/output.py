"""Output shaping: a request's ReqOutput after a step (SGLang's text, output_ids, meta_info with logprob triples)."""

from __future__ import annotations

import time

from ..core import Req, TokenLogprob
from ..messages import ReqOutput
from .stops import visible_text


def _triples(recs: list[TokenLogprob], tok, with_text: bool) -> list:
    text = (lambda t: tok.decode([t])) if with_text else (lambda t: None)
    return [[r.logprob, r.token_id, text(r.token_id)] for r in recs]


def sync_text(req: Req) -> None:
    """Detokenize the tokens a request without stop rules left for its next output (processor.py defers them)."""
    s = req.sampling
    if req.detok is not None and not s.stop and not s.stop_regex:
        req.text += req.detok.catch_up(req.output_ids)


def build_output(req: Req, tokenizer) -> ReqOutput:
    """The request's cumulative output so far (SGLang's /generate object), final once it finished."""
    sync_text(req)
    return_text_in_logprobs = req.logprob.return_text_in_logprobs
    meta = {
        "id": req.rid,
        "finish_reason": req.finish_reason.to_json() if req.finish_reason else None,
        "prompt_tokens": len(req.input_ids),
        "completion_tokens": len(req.output_ids),
        "cached_tokens": req.cached_tokens,
        "total_retractions": req.num_preemptions,
        "jump_forward_tokens": req.num_jumped_tokens,
        "e2e_latency": time.perf_counter() - req.created,
        "ttft": None if req.first_token_time is None else req.first_token_time - req.created,
    }
    if req.spec is not None:  # speculative decoding: its verify forwards (SGLang's name)
        meta["spec_verify_ct"] = req.spec.verify_ct
    if req.logprob.return_logprob:
        # one entry per prompt position from the start on (the rule SGLang's frontend select was written for):
        # position 0 has nothing to be scored against, and -1 gives one null entry for the last prompt token
        start = req.input_logprob_start()
        nulls = [TokenLogprob(None, req.input_ids[start])] if start == 0 or req.logprob.logprob_start_len < 0 else []
        inp = nulls + req.input_logprobs
        meta["input_token_logprobs"] = _triples(inp, tokenizer, return_text_in_logprobs)
        meta["output_token_logprobs"] = _triples(req.output_logprobs, tokenizer, return_text_in_logprobs)
        meta["output_token_logprobs_length"] = len(req.output_logprobs)
        if req.logprob.top_logprobs_num > 0:
            def tops(recs):
                return [None if r.logprob is None else
                        [[lp, t, tokenizer.decode([t]) if return_text_in_logprobs else None] for lp, t in r.top]
                        for r in recs]
            meta["input_top_logprobs"] = tops(inp)
            meta["output_top_logprobs"] = tops(req.output_logprobs)
    if req.trace is not None:  # asked for (engine/request_trace.py); the server strips it from API responses
        meta["trace"] = req.trace.to_json(req, tokenizer, req.finished)
    return ReqOutput(req.rid, visible_text(req), list(req.output_ids), meta, req.finished)


def aborted_output(rid: str, prompt_tokens: int, message: str) -> ReqOutput:
    """A final output for a request that ended without a normal one (aborted before it started, or unshapeable)."""
    meta = {"id": rid, "finish_reason": {"type": "abort", "message": message}, "prompt_tokens": prompt_tokens,
            "completion_tokens": 0, "cached_tokens": 0, "e2e_latency": 0.0}
    return ReqOutput(rid, "", [], meta, finished=True)

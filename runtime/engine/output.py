"""After a forward: score prompt tokens, sample, append, check stops, and shape SGLang outputs."""

from __future__ import annotations

import time

import torch

from ..model.runner import BatchEntry, ForwardOutput
from ..core import FinishReason, Req, TokenLogprob
from .sampler import Sampler, token_logprobs


def record_input_logprobs(entries: list[BatchEntry], out: ForwardOutput) -> None:
    """Append prompt-token logprobs computed by this forward to each request."""
    for i, e in enumerate(entries):
        rows = out.input_rows[i]
        r = e.req
        if len(rows):
            lp = torch.log_softmax(out.logits[rows.start:rows.stop], dim=-1)
            first = out.input_first_pos[i]
            ids = r.input_ids[first:first + len(rows)]
            r.input_logprobs.extend(token_logprobs(lp, ids, [r.top_logprobs_num] * len(ids)))
        if r.wants_input_logprobs() and e.prefix_len + e.extend_len >= len(r.input_ids):
            r.input_logprobs_done = True


def check_stop(req: Req, token: int, eos_ids: set[int], max_context: int) -> FinishReason | None:
    """Finish reason triggered by the token just appended (stop strings are checked on text)."""
    s = req.sampling
    if len(req.output_ids) >= s.min_new_tokens:
        if token in s.stop_token_ids:
            return FinishReason("stop", matched=token)
        if token in eos_ids and not s.ignore_eos:
            return FinishReason("stop", matched=token)
    if len(req.output_ids) >= s.max_new_tokens or req.seq_len >= max_context:
        return FinishReason("length", length=len(req.output_ids))
    return None


def append_text(req: Req, delta: str) -> FinishReason | None:
    """Add decoded text; trim and finish on the first stop string found across token boundaries."""
    if not delta:
        return None
    old_len = len(req.text)
    req.text += delta
    s = req.sampling
    if not s.stop or len(req.output_ids) < s.min_new_tokens:
        return None
    longest = max(len(x) for x in s.stop)
    window_start = max(old_len - longest + 1, 0)
    best = None
    for stop in s.stop:
        idx = req.text.find(stop, window_start)
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, stop)
    if best is None:
        return None
    idx, stop = best
    req.text = req.text[: idx + (len(stop) if s.no_stop_trim else 0)]
    return FinishReason("stop", matched=stop)


def visible_text(req: Req) -> str:
    """Text safe to stream: withholds a tail that could still become a stop string."""
    if req.finished or not req.sampling.stop:
        return req.text
    hold = 0
    for stop in req.sampling.stop:
        for k in range(min(len(stop) - 1, len(req.text)), 0, -1):
            if req.text.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return req.text[: len(req.text) - hold] if hold else req.text


def _triples(recs: list[TokenLogprob], tok, with_text: bool) -> list:
    text = (lambda t: tok.decode([t])) if with_text else (lambda t: None)
    return [[r.logprob, r.token_id, text(r.token_id)] for r in recs]


def build_output(req: Req, tokenizer) -> dict:
    """The SGLang /generate response object for a request (cumulative text)."""
    return_text_in_logprobs = req.return_text_in_logprobs
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
    if req.return_logprob:
        inp = list(req.input_logprobs)
        if req.logprob_start_len == 0 and req.input_ids:
            inp.insert(0, TokenLogprob(None, req.input_ids[0]))
        meta["input_token_logprobs"] = _triples(inp, tokenizer, return_text_in_logprobs)
        meta["output_token_logprobs"] = _triples(req.output_logprobs, tokenizer, return_text_in_logprobs)
        if req.top_logprobs_num > 0:
            def tops(recs):
                return [None if r.logprob is None else
                        [[lp, t, tokenizer.decode([t]) if return_text_in_logprobs else None] for lp, t in r.top]
                        for r in recs]
            meta["input_top_logprobs"] = tops(inp)
            meta["output_top_logprobs"] = tops(req.output_logprobs)
    return {"text": visible_text(req), "output_ids": list(req.output_ids), "meta_info": meta}


class OutputProcessor:
    """Applies one forward's results to its requests; returns those that finished."""

    def __init__(self, sampler: Sampler, eos_ids: set[int], max_context: int, constrained=None):
        self.sampler = sampler
        self.eos_ids = eos_ids
        self.max_context = max_context
        self.constrained = constrained  # optional hook: masks and advances grammar guides

    def process(self, entries: list[BatchEntry], out: ForwardOutput) -> list[Req]:
        """Record logprobs, sample next tokens, apply stop rules; returns newly finished requests."""
        record_input_logprobs(entries, out)
        finished = []
        sample_idx = [i for i, e in enumerate(entries) if out.sample_row[i] is not None]
        for e in entries:  # prefill-only (max_new_tokens == 0) requests end when their prompt is done
            r = e.req
            if r.sampling.max_new_tokens == 0 and e.prefix_len + e.extend_len >= r.seq_len:
                r.finish_reason = FinishReason("length", length=0)
                finished.append(r)
        if not sample_idx:
            return finished
        reqs = [entries[i].req for i in sample_idx]
        logits = out.logits[[out.sample_row[i] for i in sample_idx]]  # [n, vocab]
        bitmask = rows = None
        if self.constrained is not None:
            bitmask, rows = self.constrained.masks(reqs, logits.shape[1])
        result = self.sampler.sample(logits, reqs, self.eos_ids, bitmask, rows)
        now = time.perf_counter()
        for r, tok, lp in zip(reqs, result.token_ids, result.logprobs):
            if r.first_token_time is None:
                r.first_token_time = now
            r.output_ids.append(tok)
            if lp is not None:
                r.output_logprobs.append(lp)
            reason = self.constrained.advance(r, tok) if self.constrained is not None else None
            reason = check_stop(r, tok, self.eos_ids, self.max_context) or reason
            stop_delta = r.detok.push([tok])
            if reason is not None:
                stop_delta += r.detok.flush()
            reason = append_text(r, stop_delta) or reason
            if reason is not None:
                r.finish_reason = reason
                finished.append(r)
        return finished

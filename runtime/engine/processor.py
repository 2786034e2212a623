"""After a forward: record prompt logprobs, sample, append tokens, and apply the stop rules."""

from __future__ import annotations

import time

import torch

from ..core import BatchEntry, FinishReason, ForwardOutput, Req
from .sampler import Sampler, token_logprobs
from .stops import append_text, check_token_stop


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
            reason = check_token_stop(r, tok, self.eos_ids, self.max_context) or reason
            stop_delta = r.detok.push([tok])
            if reason is not None:
                stop_delta += r.detok.flush()
            reason = append_text(r, stop_delta) or reason
            if reason is not None:
                r.finish_reason = reason
                finished.append(r)
        return finished

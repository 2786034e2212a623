"""After a forward: record prompt logprobs, sample, append tokens, and apply the stop rules (per request isolated).

A phase that raises for one request aborts that request alone (engine/isolation.py). The batched phases
(grammar masks + sampling, output logprobs) run once for the whole batch; only when that raises are its rows
redone one at a time, from the forward's untouched logits and the same uniforms, to find the culprit.
"""

from __future__ import annotations

import logging
import operator
import time
from dataclasses import dataclass

import torch

from ..core import BatchEntry, FinishReason, ForwardOutput, Req, TokenLogprob
from ..device_io import rows as take_rows
from .isolation import Isolation
from .penalties import restore
from .sampler import Sampler, token_logprobs
from .stops import append_text, check_token_stop

logger = logging.getLogger(__name__)

_return_logprob = operator.attrgetter("logprob.return_logprob")
_finish_reason = operator.attrgetter("finish_reason")


def _unfinished(reqs: list[Req]) -> bool:
    """No request of reqs has finished (one C-level pass)."""
    reasons = list(map(_finish_reason, reqs))
    return reasons.count(None) == len(reasons)


def record_input_logprobs(e: BatchEntry, out: ForwardOutput, i: int) -> None:
    """Append the prompt-token logprobs this forward computed for entry i to its request."""
    rows = out.input_rows[i]
    r = e.req
    if len(rows):
        lp = torch.log_softmax(out.logits[rows.start:rows.stop], dim=-1)  # [rows, vocab]
        first = out.input_first_pos[i]
        ids = r.input_ids[first:first + len(rows)]
        r.input_logprobs.extend(token_logprobs(lp, ids, [r.logprob.top_logprobs_num] * len(ids)))
    if r.wants_input_logprobs() and e.prefix_len + e.extend_len >= len(r.input_ids):
        r.input_logprobs_done = True


@dataclass
class SampleLaunch:
    """One forward's sampling, launched but not read back: the token ids stay on the device until needed."""

    reqs: list[Req]
    tokens: torch.Tensor | list[int | None]  # [n] int64 on the device; a list after a row-by-row retry
    lp_index: list[int]  # positions in reqs of the requests that return logprobs
    lp_logits: torch.Tensor | None  # [len(lp_index), vocab] their rows, copied at launch (pre-penalty)
    failed: list[Req]  # requests that failed while sampling (already finished)

    def host_tokens(self) -> list[int | None]:
        """The sampled ids on the host (a device sync unless the overlap path copied them already)."""
        return self.tokens if isinstance(self.tokens, list) else self.tokens.tolist()


class OutputProcessor:
    """Applies one forward's results to its requests; returns those that finished (failed ones included)."""

    def __init__(self, sampler: Sampler, eos_ids: set[int], max_context: int, constrained=None,
                 isolation: Isolation | None = None):
        self.sampler = sampler
        self.eos_ids = eos_ids
        self.max_context = max_context
        self.constrained = constrained  # optional hook: masks and advances grammar guides
        self.iso = isolation or Isolation()

    def process(self, entries: list[BatchEntry], out: ForwardOutput) -> list[Req]:
        """Record logprobs, sample next tokens, apply stop rules; returns newly finished requests."""
        finished = self.prepare(entries, out)
        launch = self.launch(entries, out)
        return finished + self.complete(launch, launch.host_tokens())

    def prepare(self, entries: list[BatchEntry], out: ForwardOutput) -> list[Req]:
        """Prompt logprobs, and prefill-only requests (max_new_tokens 0) end when their prompt is done."""
        finished: list[Req] = []
        hook = self.iso.hook is not None
        for i, e in enumerate(entries):
            if not hook and not e.req.logprob.return_logprob and not len(out.input_rows[i]):
                continue  # nothing to record (record_input_logprobs would do nothing)
            try:
                self.iso.probe("input logprobs", e.req)
                record_input_logprobs(e, out, i)
            except Exception as exc:  # noqa: BLE001 - isolated: this request alone ends
                self._fail(e.req, "input logprobs", exc, finished)
        for e in entries:
            r = e.req
            if r.sampling.max_new_tokens == 0 and not r.finished and e.prefix_len + e.extend_len >= r.seq_len:
                r.finish_reason = FinishReason("length", length=0)
                finished.append(r)
        return finished

    def launch(self, entries: list[BatchEntry], out: ForwardOutput, valid: list[bool] | None = None) -> SampleLaunch:
        """Sample the rows of unfinished entries (and valid[i], when given) without reading the ids back."""
        sample_row = out.sample_row
        reqs = [e.req for e in entries]
        # a decode step whose rows are all valid (plain, or overlapped with nothing discarded): every row (C loops)
        if (valid is None or all(valid)) and None not in sample_row and _unfinished(reqs):
            rows = list(sample_row)
        else:
            picked = [(sample_row[i], r) for i, r in enumerate(reqs)
                      if sample_row[i] is not None and not r.finished and (valid is None or valid[i])]
            rows, reqs = [p[0] for p in picked], [p[1] for p in picked]
        failed: list[Req] = []
        lp_index = [j for j, r in enumerate(reqs) if r.logprob.return_logprob] if any(map(_return_logprob, reqs)) else []
        # a copy, before sampling changes rows in place; the logits may be a CUDA-graph output that the next
        # replay overwrites
        lp_logits = take_rows(out.logits, [rows[j] for j in lp_index]) if lp_index else None
        tokens = self._sample(reqs, rows, out, failed) if reqs else []
        return SampleLaunch(reqs, tokens, lp_index, lp_logits, failed)

    def complete(self, launch: SampleLaunch, tokens: list[int | None]) -> list[Req]:
        """Append the sampled tokens (logprobs, grammar advance, stops, detokenization); returns finished ones."""
        finished = list(launch.failed)
        lps = self._logprobs(launch, tokens, finished) if launch.lp_index else None
        now = time.perf_counter()
        if self.iso.hook is not None or lps is not None:
            for r, tok, lp in zip(launch.reqs, tokens, lps or [None] * len(tokens)):
                if tok is not None and not r.finished:
                    self._append(r, tok, lp, now, finished)
            return finished
        eos, max_context, append = self.eos_ids, self.max_context, self._append
        for r, tok in zip(launch.reqs, tokens):
            if tok is None or r.finish_reason is not None:
                continue
            s = r.sampling
            out = r.output_ids
            n = len(out) + 1
            # the steady decode state in a few comparisons: a token that changes nothing but output_ids and, with
            # stop strings, the text (no grammar, no streaming, no stop or length rule fires); the rest takes _append
            if (r.grammar is not None or r.stream or r.first_token_time is None
                    or (n >= s.min_new_tokens and (tok in s.stop_token_ids or (tok in eos and not s.ignore_eos)))
                    or (s.max_new_tokens is not None and n >= s.max_new_tokens)
                    or len(r.input_ids) + n >= max_context):
                append(r, tok, None, now, finished)
                continue
            out.append(tok)
            if s.stop or s.stop_regex:
                self._text_stop(r, finished)
        return finished

    def _text_stop(self, r: Req, finished: list[Req]) -> None:
        """_append's text phases for a token no other rule acted on: detokenize it, then the stop strings."""
        phase = "detokenize"
        try:
            delta = r.detok.catch_up(r.output_ids)
            phase = "stop string"
            reason = append_text(r, delta)
        except Exception as exc:  # noqa: BLE001 - isolated: this request alone ends
            self._fail(r, phase, exc, finished)
            return
        if reason is not None:
            r.finish_reason = reason
            finished.append(r)

    def _fail(self, req: Req, phase: str, exc: Exception, finished: list[Req]) -> None:
        self.iso.fail(req, phase, exc)
        finished.append(req)

    def _probe_all(self, phases: tuple[str, ...], reqs: list[Req]) -> None:
        if self.iso.hook is not None:
            for r in reqs:
                for phase in phases:
                    self.iso.probe(phase, r)

    def _sample(self, reqs: list[Req], rows: list[int], out: ForwardOutput,
                finished: list[Req]) -> torch.Tensor | list[int | None]:
        """One token per request: a device tensor when batched; per row (None: failed) only after a failure."""
        uniforms = self.sampler.draw_uniforms(reqs)
        vocab = out.logits.shape[1]
        # a decode batch samples every logits row in order: penalties and masks change the forward's logits in
        # place (recorded in undo), instead of a copy of the whole batch; otherwise the rows are copied
        in_place = (len(rows) == out.logits.shape[0] and rows == list(range(len(rows)))
                    and not any(map(len, out.input_rows)))
        undo: list | None = [] if in_place else None
        try:
            self._probe_all(("grammar mask", "sampling"), reqs)
            logits = out.logits if in_place else take_rows(out.logits, rows)  # [n, vocab]
            bitmask, masked = self.constrained.masks(reqs, vocab) if self.constrained is not None else (None, None)
            return self.sampler.sample_tensor(logits, reqs, self.eos_ids, uniforms, bitmask, masked, undo)
        except Exception:  # noqa: BLE001 - find the culprit below
            logger.warning("batched sampling of %d requests failed; redoing them one by one", len(reqs))
            if undo:
                restore(out.logits, undo)  # the retries start from the forward's logits
        tokens: list[int | None] = []
        for r, row, u in zip(reqs, rows, uniforms):
            phase = "grammar mask"
            try:
                self.iso.probe(phase, r)
                bitmask, masked = (self.constrained.masks([r], vocab) if self.constrained is not None
                                   else (None, None))
                phase = "sampling"
                self.iso.probe(phase, r)
                tokens.append(self.sampler.sample(out.logits[[row]], [r], self.eos_ids, [u], bitmask, masked)[0])
            except Exception as exc:  # noqa: BLE001
                self._fail(r, phase, exc, finished)
                tokens.append(None)
        return tokens

    def _logprobs(self, launch: SampleLaunch, tokens: list[int | None],
                  finished: list[Req]) -> list[TokenLogprob | None]:
        """The sampled token's logprob record for requests that asked (from the forward's logits, pre-penalty)."""
        reqs = launch.reqs
        lps: list[TokenLogprob | None] = [None] * len(reqs)
        want = [(k, j) for k, j in enumerate(launch.lp_index) if tokens[j] is not None]
        if not want:
            return lps
        try:
            self._probe_all(("output logprobs",), [reqs[j] for _, j in want])
            lp = torch.log_softmax(launch.lp_logits[[k for k, _ in want]], dim=-1)  # [n, vocab]
            recs = token_logprobs(lp, [tokens[j] for _, j in want], [reqs[j].logprob.top_logprobs_num for _, j in want])
            for (_, j), rec in zip(want, recs):
                lps[j] = rec
            return lps
        except Exception:  # noqa: BLE001 - find the culprit below
            logger.warning("batched logprobs of %d requests failed; redoing them one by one", len(want))
        for k, j in want:
            r = reqs[j]
            try:
                self.iso.probe("output logprobs", r)
                lp = torch.log_softmax(launch.lp_logits[[k]], dim=-1)  # [1, vocab]
                lps[j] = token_logprobs(lp, [tokens[j]], [r.logprob.top_logprobs_num])[0]
            except Exception as exc:  # noqa: BLE001
                self._fail(r, "output logprobs", exc, finished)
        return lps

    def _append(self, r: Req, tok: int, lp: TokenLogprob | None, now: float, finished: list[Req]) -> None:
        """Append one sampled token, then grammar advance, token stops, detokenization and text stops."""
        probe = self.iso.probe if self.iso.hook is not None else None
        phase = "grammar advance"
        try:
            if r.first_token_time is None:
                r.first_token_time = now
            r.output_ids.append(tok)
            if lp is not None:
                r.output_logprobs.append(lp)
            if probe:
                probe(phase, r)
            reason = self.constrained.advance(r, tok) if self.constrained is not None else None
            phase = "stop check"
            if probe:
                probe(phase, r)
            reason = check_token_stop(r, tok, self.eos_ids, self.max_context) or reason
            phase = "detokenize"
            if probe:
                probe(phase, r)
            s = r.sampling
            # text nobody reads before the finish waits for it (one decode for the chunk; detokenizer.py)
            now_text = reason is not None or r.stream or s.stop or s.stop_regex
            delta = r.detok.catch_up(r.output_ids) if now_text else ""
            if reason is not None:
                delta += r.detok.flush()
            phase = "stop string"
            if probe:
                probe(phase, r)
            reason = append_text(r, delta) or reason
        except Exception as exc:  # noqa: BLE001 - isolated: this request alone ends
            self._fail(r, phase, exc, finished)
            return
        if reason is not None:
            r.finish_reason = reason
            finished.append(r)

"""Speculative decoding's verification: a request's draft checked against the target's logits of one forward, the
accepted tokens appended through the normal sampling path, the rejected tokens' KV slots freed.

The forward ran [last token, d_0 .. d_{k-1}] as one extend per request (model/forward_batch.py: logits rows
sample_row + j, j = 0..k), so row j is the target's next-token logits given the sequence and d_0 .. d_{j-1}.
Verification runs rounds j = 0, 1, ..: each round samples row j of every request still going, with the ordinary
sampler (penalties, logit bias, min_new_tokens, grammar mask, temperature and truncation, the request's own
generator when seeded) and appends the token with the ordinary rules (logprobs, grammar advance, stop tokens and
strings, max_new_tokens, detokenization). A request goes on to round j + 1 only while the sampled token equals d_j
and it has not finished. So:
- greedy: the accepted tokens are the longest draft prefix the target agrees with, plus the target's own next
  token, exactly the tokens plain decoding would produce;
- sampling: for a deterministic (n-gram) draft this is the standard rejection scheme: d_j is accepted with
  probability p(d_j) under the processed distribution, and on rejection the token drawn is distributed as p with
  d_j removed, renormalised (a draw from p conditioned on not being d_j); every token is a draw from the same
  conditional distribution as without speculation, and a seeded request consumes one draw per token as before;
- sampling with a draft model (STANDALONE; the request's SpecState.q holds the draft's distributions q): round j
  judges d_j against p, the target's processed distribution of row j (penalties, grammar mask, temperature,
  truncation: probs.processed_probs), accepting it with probability min(1, p/q) and otherwise drawing from
  max(0, p - q) (probs.judge); the judged token is appended through the same complete() path (logprobs from
  the target's row). A round past the draft samples the target's own token with the ordinary sampler.
After the rounds, the KV of the accepted draft tokens stays (it is exactly the KV of the appended tokens); the
slots of the rejected ones go back to the pool (KVManager.rollback). They were never published to the radix cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable

import torch

from sglpy.kernels import apply_token_bitmask

from ...core import BatchEntry, ForwardOutput, Req
from ...device_io import rows as take_rows
from ...memory.kv_manager import KVManager
from ..penalties import Penalties
from ..processor import OutputProcessor, SampleLaunch
from ..sampler import Sampler
from .probs import judge, processed_probs

if TYPE_CHECKING:
    from .drafter import Drafter


def drop_draft(req: Req, kv: KVManager) -> None:
    """Free the slots taken for a draft that will not be verified (the step failed): KV covers the sequence only."""
    if req.kv_len > req.seq_len:
        kv.rollback(req, req.seq_len)


def _forced(req: Req) -> bool:
    """The request's guide forces a string now: jump-forward appends it after this step, not the draft."""
    g = req.grammar
    return g is not None and bool(g.guide.forced_string(g.state))


@dataclass(frozen=True)
class Verifier:
    """Checks the drafted entries of a forward. Its parts are passed in: the output processor's ordinary sampling
    path (launch, complete), and for a draft model's p/q judge the sampler's draws, the penalties and the grammar
    masks (masks(reqs, vocab) -> (bitmask, rows) or (None, None); None without constrained decoding)."""

    processor: OutputProcessor
    sampler: Sampler
    penalties: Penalties
    masks: Callable | None
    eos_ids: set[int]
    kv: KVManager

    def verify(self, entries: list[BatchEntry], out: ForwardOutput, drafter: Drafter) -> list[Req]:
        """Sample, accept and append the drafted entries' tokens (rounds above), free rejected KV; returns finished.

        A constrained request also stops where its guide forces a string (with jump-forward on), so the forced span
        is appended by jump-forward as without speculation (its canonical tokens, not the draft's)."""
        processor, kv = self.processor, self.kv
        spec = [(i, e) for i, e in enumerate(entries) if e.draft and out.sample_row[i] is not None]
        finished: list[Req] = []
        accepted = {id(e): 0 for _, e in spec}
        active = [(i, e) for i, e in spec if not e.req.finished]
        try:
            j = 0
            while active:
                sub = [e for _, e in active]
                # row j of each: the logits after the sequence and d_0 .. d_{j-1}
                judged = [(i, e) for i, e in active if e.req.spec.q is not None and j < len(e.draft)]
                got: dict[int, int | None] = {}
                if judged:  # a draft model's sampled tokens: the p/q rejection scheme
                    launch, tokens = self._judge_round(judged, j, out)
                    finished += processor.complete(launch, tokens)
                    got.update({id(r): t for r, t in zip(launch.reqs, tokens)})
                    sub = [e for i, e in active if id(e.req) not in got]
                if sub:
                    rows = [out.sample_row[i] + j for i, e in active if id(e.req) not in got]
                    view = ForwardOutput(out.logits, [range(0)] * len(sub), [1] * len(sub), rows)
                    launch = processor.launch(sub, view)
                    tokens = launch.host_tokens()
                    finished += processor.complete(launch, tokens)
                    got.update({id(r): t for r, t in zip(launch.reqs, tokens)})
                going = []
                for i, e in active:
                    t = got.get(id(e.req))
                    if j < len(e.draft) and t == e.draft[j]:
                        accepted[id(e)] += 1
                        if not e.req.finished and not (drafter.jump_forward and _forced(e.req)):
                            going.append((i, e))
                active = going
                j += 1
        finally:  # also when a round failed: the step's requests are aborted with KV that covers their sequence
            for _, e in spec:
                r = e.req
                r.spec.q = None
                if r.kv_len > r.seq_len - 1:  # positions up to seq_len - 2 hold the appended tokens' KV
                    kv.rollback(r, r.seq_len - 1)
                drafter.record(r, len(e.draft), accepted[id(e)])
        return finished

    def _judge_round(self, judged: list[tuple[int, BatchEntry]], j: int, out: ForwardOutput
                     ) -> tuple[SampleLaunch, list[int]]:
        """Round j for requests with a draft model's q: p of row j (processed as the sampler would), d_j accepted
        with probability min(1, p/q), else a token from max(0, p - q). Returns the launch to complete and its
        tokens."""
        reqs = [e.req for _, e in judged]
        rows = [out.sample_row[i] + j for i, _ in judged]
        logits = take_rows(out.logits, rows).float()  # [n, vocab] a copy: penalties and masks change it
        vocab = logits.shape[1]
        self.penalties.apply(logits, reqs, self.eos_ids)
        if self.masks is not None:
            bitmask, masked = self.masks(reqs, vocab)
            if bitmask is not None:
                apply_token_bitmask(logits, bitmask.to(logits.device), masked.to(logits.device))
        p = processed_probs(logits, reqs)  # [n, vocab]
        tokens = []
        for k, (_, e) in enumerate(judged):
            r = e.req
            draw = lambda: self.sampler.draw_uniforms([r])[0]  # noqa: E731 - the request's own draws when seeded
            tokens.append(judge(p[k], r.spec.q[j].to(p.device), e.draft[j], draw(), draw).token)
        lp_index = [k for k, r in enumerate(reqs) if r.logprob.return_logprob]
        lp_logits = take_rows(out.logits, [rows[k] for k in lp_index]) if lp_index else None
        return SampleLaunch(reqs, tokens, lp_index, lp_logits, []), tokens

"""NGRAM speculative decoding's drafts (prompt lookup): the request's last tokens matched against its own prompt and
output, the tokens that followed the match proposed; the draft length adapts to the request's recent acceptance.

A draft is only a guess: engine/spec/verify.py checks it against the target model in the same forward as the step's
decode, so a wrong draft costs compute, never a different output. What the drafter owns:
- the match: the longest suffix (speculative_ngram_max_match_window_size tokens down to ..._min_...) of prompt +
  output that occurred before, its most recent occurrence first; the tokens after it are the draft;
- the cut: a constrained request's draft stops before the first token its grammar guide forbids, and after a
  token from which the guide forces a string (jump-forward appends that, undrafted); every draft stops before EOS;
- the length: k tokens at most (speculative_num_draft_tokens), one more after a draft accepted whole, accepted + 1
  after a partial one; a draft with nothing accepted pauses drafting for that request (1, 2, 4, .. 16 steps) so
  free writing, where matches rarely continue, falls back to plain decode steps;
- the batch policy: no drafts when more than NGRAM_MAX_DRAFT_BATCH requests decode (a verify forward runs every
  drafted token through the whole model: on a compute-bound CPU a big batch already uses the cores; measured:
  8 requests drafting ran 0.93-0.95x, docs/speculative.md);
  in a batch of b >= 2 a request drafts only while its recent acceptance (accepted over drafted tokens, averaged)
  is at least min_rate(b): a draft row costs ROW_COST of a one-row step whatever the batch, while the token it
  may save costs the batch's step over b, so the break-even acceptance rises with b (one request alone keeps the
  pause rule only). A request held back regains confidence a little each step and so probes again now and then.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ...core import Req

MAX_DRAFT_BATCH = 8  # decode batch size above which no request drafts (STANDALONE, its cost gate decides below)
NGRAM_MAX_DRAFT_BATCH = 4  # NGRAM's: 8 requests drafting ran 0.93-0.95x, 4 0.99-1.18x (docs/speculative.md)
MAX_VERIFY_ROWS = 16  # most decode rows (drafts included) of a drafting step: the CPU's fused decode layer's limit
MAX_CANDIDATES = 64  # most recent occurrences of the last token tried per draft (bounds the host time per step)
MAX_PAUSE = 16  # longest pause (steps) after drafts that were rejected whole
# a verify row's cost over a one-row decode step, host work included: the forward alone adds 0.15-0.2 per row
# (benchmarks/spec_verify_cost.py, int4 default model, 1 thread); 0.35 fits the batches of 2-8 measured end to end
ROW_COST = 0.35
RATE_DECAY = 0.5  # weight of the newest verify in a request's acceptance average
RATE_RECOVERY = 0.05  # share of the gap to 1 a held-back request's average regains per step (probing)


def min_rate(batch: int) -> float:
    """Acceptance a request needs to draft in a decode batch of this size: ROW_COST * b / (1 + ROW_COST * (b - 1)),
    the cost of a draft row over the cost per request of the batch's step (0 for one request: the pause rule)."""
    return 0.0 if batch <= 1 else ROW_COST * batch / (1 + ROW_COST * (batch - 1))


@dataclass
class SpecState:
    """One request's speculation state (Req.spec): its token index, draft length, pause and counters."""

    k: int  # tokens to draft next time
    positions: dict[int, list[int]] = field(default_factory=dict)  # token id -> its positions in all_ids (indexed)
    indexed: int = 0  # all_ids[:indexed] are in positions
    pause: int = 0  # steps left without drafting
    misses: int = 0  # verify steps in a row with nothing accepted
    verify_ct: int = 0  # verify forwards (SGLang's meta_info spec_verify_ct)
    drafted: int = 0  # draft tokens proposed and verified
    accepted: int = 0  # draft tokens the target agreed with
    rate: float = 1.0  # recent acceptance (accepted over drafted tokens, averaged with RATE_DECAY); starts hopeful
    q: Any = None  # STANDALONE, sampled request: the draft's distributions of its draft tokens, [k, vocab]
    shadow: Any = None  # STANDALONE: the draft model's Req mirroring this request (its draft KV)
    generator: Any = None  # STANDALONE, seeded request: the draft's own draws (reruns draft the same tokens)


class NgramDrafter:
    """Proposes prompt-lookup drafts and adapts each request's draft length to its acceptance."""

    def __init__(self, num_draft_tokens: int, min_window: int, max_window: int, eos_ids: set[int],
                 max_batch: int = NGRAM_MAX_DRAFT_BATCH, jump_forward: bool = False):
        self.max_k, self.min_window, self.max_window = num_draft_tokens, min_window, max_window
        self.jump_forward = jump_forward  # a draft stops where the guide forces a string (jump-forward appends it)
        self.eos_ids = frozenset(eos_ids)
        self.max_batch = max_batch
        self.stats = {"spec_verify_steps": 0, "spec_draft_tokens": 0, "spec_accepted_tokens": 0}

    def budget(self, batch_size: int) -> int:
        """Draft tokens a decode batch of this size may add in all (the batch policy; 0: no drafts)."""
        return MAX_VERIFY_ROWS - batch_size if batch_size <= self.max_batch else 0

    def propose(self, req: Req, limit: int) -> tuple[int, ...]:
        """Up to min(k, limit) tokens guessed to follow req's sequence; () when there is no match or it pauses."""
        st = req.spec
        if st is None:
            st = req.spec = SpecState(self.max_k)
        if st.pause > 0:
            st.pause -= 1
            return ()
        k = min(st.k, limit)
        if k <= 0 or req.sampling.max_new_tokens == 0:
            return ()
        ids = req.all_ids
        start = self._match(st, ids)
        if start < 0:
            return ()
        # a match reaching the end repeats with period n - start: the draft follows the repetition
        draft = [ids[start + j] if start + j < len(ids) else ids[start + (j % (len(ids) - start))] for j in range(k)]
        for j, t in enumerate(draft):  # the target may still end here; a draft never guesses the end
            if t in self.eos_ids or t in req.sampling.stop_token_ids:
                draft = draft[:j]
                break
        g = req.grammar
        if g is not None and draft:  # cut at the first token the guide forbids (verification would reject it)
            state = g.state
            for j, t in enumerate(draft):
                try:
                    state = g.guide.advance(state, t)
                except ValueError:
                    draft = draft[:j]
                    break
                if self.jump_forward and g.guide.forced_string(state):
                    draft = draft[:j + 1]
                    break
        return tuple(draft)

    def propose_batch(self, reqs: list[Req], limits: list[int], budget: int) -> list[tuple[int, ...]]:
        """Drafts for reqs in order, each within its limit and what is left of the step's budget of draft tokens."""
        out = []
        need = min_rate(len(reqs))
        for r, lim in zip(reqs, limits):
            st = r.spec
            if need and st is not None and st.rate < need:  # not worth a row in this batch: regain, probe later
                st.rate += RATE_RECOVERY * (1.0 - st.rate)
                out.append(())
                continue
            d = self.propose(r, min(lim, budget)) if budget > 0 else ()
            budget -= len(d)
            out.append(d)
        return out

    def release(self, req: Req) -> None:
        """The request left (nothing to free for prompt lookup)."""

    def flush(self) -> None:
        """The engine's cache was flushed (nothing cached here)."""

    def info(self) -> dict:
        """Counters for get_server_info."""
        return dict(self.stats)

    def _match(self, st: SpecState, ids: list[int]) -> int:
        """Where the tokens after the longest earlier match of ids' suffix start, or -1 (shorter than min_window)."""
        n = len(ids)
        if n - 1 < st.indexed:  # outputs were rewritten shorter (jump-forward re-tokenization): index again
            st.positions, st.indexed = {}, 0
        pos = st.positions
        for i in range(st.indexed, n - 1):  # every token but the last: a match needs a token after it
            pos.setdefault(ids[i], []).append(i)
        st.indexed = max(st.indexed, n - 1)
        cands = pos.get(ids[-1])
        if not cands:
            return -1
        best_len, best = 0, -1
        top = self.max_window
        for p in reversed(cands[-MAX_CANDIDATES:]):
            if ids[p] != ids[-1]:  # stale after a rewrite
                continue
            m = 1
            while m < top and p - m >= 0 and ids[p - m] == ids[n - 1 - m]:
                m += 1
            if m > best_len:
                best_len, best = m, p + 1
                if m >= top:
                    break
        return best if best_len >= self.min_window else -1

    def record(self, req: Req, drafted: int, accepted: int) -> None:
        """Adapt req's draft length after a verify: longer after a whole accept, shorter (or a pause) otherwise."""
        st = req.spec
        st.verify_ct += 1
        st.drafted += drafted
        st.accepted += accepted
        self.stats["spec_verify_steps"] += 1
        self.stats["spec_draft_tokens"] += drafted
        self.stats["spec_accepted_tokens"] += accepted
        if drafted:
            st.rate += RATE_DECAY * (accepted / drafted - st.rate)
        if accepted >= drafted:
            st.k = min(st.k + 1, self.max_k)
            st.misses = 0
        elif accepted > 0:
            st.k = max(accepted + 1, 1)
            st.misses = 0
        else:
            st.k = 1
            st.misses += 1
            st.pause = min(1 << (st.misses - 1), MAX_PAUSE)

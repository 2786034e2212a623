"""Speculative decoding's draft phase and the `Drafter` protocol its drafters implement.

The step (engine/step.py) reads schedule -> draft -> forward -> sample or verify -> resolve. The draft phase takes
the scheduled batch: each decode entry whose request gets a draft (from the drafter, within the batch policy's
budget and the request's limits) becomes one entry extending [last token + draft], its draft's KV slots taken from
free slots only (never by evicting cached KV or preempting). Drafted entries follow the one-token decode entries
(the forward runs both as decode rows) and precede the extends; they are verified after the forward
(spec/verify.py). The scheduler knows nothing of drafts.
"""

from __future__ import annotations

from typing import Protocol

from ...config import EngineConfig
from ...core import BatchEntry, Req, ScheduledBatch
from ...memory.kv_manager import KVManager
from .ngram import NgramDrafter


class Drafter(Protocol):
    """What the step and the verifier need of a drafter (NGRAM's NgramDrafter, STANDALONE's StandaloneDrafter)."""

    jump_forward: bool  # drafts stop where a grammar forces a string: jump-forward appends it
    stats: dict  # spec_verify_steps, spec_draft_tokens, spec_accepted_tokens (and the drafter's own)

    def budget(self, batch_size: int) -> int:
        """Draft tokens a decode batch of this size may add in all (0: no drafts this step)."""

    def propose_batch(self, reqs: list[Req], limits: list[int], budget: int) -> list[tuple[int, ...]]:
        """One draft per request (() for none), each within its limit and the step's budget."""

    def record(self, req: Req, drafted: int, accepted: int) -> None:
        """A verify's result: adapt the request's draft length and count it."""

    def release(self, req: Req) -> None:
        """The request left: free what the drafter holds for it."""

    def flush(self) -> None:
        """The engine's cache was flushed."""

    def info(self) -> dict:
        """Counters for get_server_info."""


def draft(batch: ScheduledBatch, drafter: Drafter, kv: KVManager, max_context: int) -> ScheduledBatch:
    """The draft phase: the batch with its drafted decode entries as [last token + draft] extends (see above)."""
    decode = batch.entries[:batch.num_decode]
    budget = drafter.budget(len(decode)) if decode else 0
    if budget <= 0:
        return batch
    cands = [e for e in decode if not e.req.wants_input_logprobs()]
    drafts = drafter.propose_batch([e.req for e in cands], [draft_limit(e.req, max_context) for e in cands], budget)
    drafted = [BatchEntry(e.req, e.prefix_len, 1 + len(d), sample=True, draft=d) for e, d in zip(cands, drafts)
               if d and kv.free_slots() >= len(d) and kv.grow(e.req, len(d))]
    if not drafted:
        return batch
    spec = {id(e.req) for e in drafted}
    plain = [e for e in decode if id(e.req) not in spec]
    return ScheduledBatch(plain + drafted + batch.entries[batch.num_decode:], len(plain), batch.aborted)


def draft_limit(req: Req, max_context: int) -> int:
    """Most draft tokens req can use: the accepted ones plus the target's own token stay within max_new_tokens
    and the context."""
    left = max_context - req.seq_len - 1
    m = req.sampling.max_new_tokens
    if m is not None:
        left = min(left, m - len(req.output_ids) - 1)
    return left


def check_speculation(cfg: EngineConfig) -> None:
    """Refuse speculative settings this engine does not honour, by name (ValueError)."""
    alg = cfg.speculative_algorithm
    if alg is None:
        return
    if cfg.tp_size > 1:
        raise ValueError(f"speculative_algorithm {alg} is not supported with tensor parallelism "
                         f"(tp_size={cfg.tp_size}); unset one of them")
    if cfg.disable_overlap_schedule is False:
        raise ValueError(f"speculative_algorithm {alg} runs the plain step order: it cannot be combined with "
                         "disable_overlap_schedule=False (leave it unset or true)")
    if alg == "STANDALONE":
        from ...model.loader import resolve_model_path

        resolve_model_path(cfg.speculative_draft_model_path)  # a missing draft is named before the target loads


def make_drafter(cfg: EngineConfig, eos_ids: set[int], tokenizer=None, vocab_size: int = 0, max_context: int = 0,
                 pool_tokens: int = 0) -> Drafter | None:
    """The configured drafter (after check_speculation), or None without speculation. STANDALONE loads the draft
    model (its vocabulary checked against the target's tokenizer and vocab_size) with a pool of pool_tokens."""
    if cfg.speculative_algorithm is None:
        return None
    if cfg.speculative_algorithm == "STANDALONE":
        from .draft_model import StandaloneDrafter

        return StandaloneDrafter(cfg, tokenizer, vocab_size, max_context, pool_tokens, eos_ids)
    return NgramDrafter(cfg.speculative_num_draft_tokens, cfg.speculative_ngram_min_match_window_size,
                        cfg.speculative_ngram_max_match_window_size, eos_ids,
                        jump_forward=not cfg.disable_jump_forward)

"""Constrained decoding in the engine: grammar masks for the sampler, guide advance, jump-forward.

Rules (docs/runtime.md, "Constrained decoding and jump-forward"):
- EOS is allowed only in accepting guide states; a request ends when EOS is sampled in an accepting
  state or when the guide accepts and nothing more can follow (finish_reason stop, matched None).
- The constraint wins over min_new_tokens: a complete match may end before min_new_tokens.
- Stop strings still apply to constrained requests (the output is then a prefix of a match).
- Jump-forward appends the guide's forced string without a model step, as the tokenizer's own
  (canonical) tokens; output tokens the re-tokenization replaces are rolled back and their KV freed.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from sglpy.grammar import Guide, TokenizerInfo
from sglpy.kernels.trie_walk import native_trie_walker
from .detokenizer import IncrementalDetokenizer
from .grammar_service import GrammarService
from .isolation import Isolation
from .reasoning_guide import ThinkingGuide, ThinkTokens, bounded_thinking_guide
from .stops import append_text
from ..core import FinishReason, Req, TokenLogprob
from ..memory.kv_manager import KVManager
from ..images import text_ids

logger = logging.getLogger(__name__)


@dataclass
class GuideState:
    """A request's compiled guide and its current state."""

    guide: Guide
    state: Any


def jump_min_tokens(cfg, graphs_captured: bool) -> int:
    """The configured shortest jump, or auto: 1 for eager decode or where multi-token steps are captured too
    (cuda_graph_extend_tokens > 1: a jumped span rides the next step's graph), else JUMP_MIN_TOKENS_GRAPHS."""
    if cfg.jump_forward_min_tokens is not None:
        return cfg.jump_forward_min_tokens
    from ..config import JUMP_MIN_TOKENS_GRAPHS

    return JUMP_MIN_TOKENS_GRAPHS if graphs_captured and cfg.cuda_graph_extend_tokens < 2 else 1


class ConstrainedDecoding:
    """Owns the compile service for one tokenizer; called by the engine around each forward."""

    def __init__(self, tokenizer, vocab_size: int, eos_ids: set[int], jump_forward: bool = True,
                 isolation: Isolation | None = None, workers: int = 2, timeout_s: float = 5.0,
                 max_states: int = 20_000, think: ThinkTokens | None = None, min_jump_tokens: int = 1):
        self.tokenizer = tokenizer
        # masks are computed on each state's first visit, here, by the native trie walk (numpy where it cannot load)
        self.info = info = TokenizerInfo.from_hf(tokenizer, vocab_size=vocab_size, eos_token_ids=sorted(eos_ids),
                                                 walker=native_trie_walker())
        # compiles run in worker processes (engine/grammar_service.py): never on the step loop's GIL
        self.service = GrammarService(info, workers=workers, timeout_s=timeout_s, max_states=max_states)
        # the engine side's tables (jump-forward's sorted tokens, ~1-2 s at 49k tokens) are built in the
        # background so the first constrained request does not pay for them
        threading.Thread(target=self._warmup, name="sglpy-grammar-warmup", daemon=True).start()
        self.jump_forward_enabled = jump_forward
        self.min_jump_tokens = min_jump_tokens  # shorter jumps are left to decode (jump_min_tokens)
        self.think = think  # the reasoning model's thinking tokens (constraints start after </think>); else None
        self.iso = isolation or Isolation()
        self.words = (vocab_size + 31) // 32
        # seconds spent on grammar work inside the step loop (benchmarks report it as a share of step time)
        self.stats = {"jumps": 0, "jumped_tokens": 0, "rollbacks": 0, "mask_s": 0.0, "advance_s": 0.0,
                      "jump_s": 0.0}

    def _warmup(self) -> None:
        info = self.info
        if info.walker.ready():  # loads (or builds, once per machine) the native library before the first mask
            _ = info.flat_trie, info.string_rest, info.string_tokens, info.packed_bytes
        else:  # the numpy walk's tables
            _ = info.trie, info.string_tokens, info.string_rest_levels
        _ = info.sorted_tokens, info.longest_token, info.first_byte_masks

    def compile(self, kind: str, value: Any) -> Future:
        """Start (or join, or fetch from the LRU cache) the compile; the Future's error is a GrammarError."""
        return self.service.compile(kind, value)

    def close(self) -> None:
        """Stop the compile workers."""
        self.service.close()

    # ------------------------------------------------------------------ sampler hooks
    def masks(self, reqs: list[Req], vocab: int) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Packed allowed-token bitmask rows for the constrained requests among reqs, and their row indices."""
        rows = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if not rows:
            return None, None
        t = time.perf_counter()
        bm = np.stack([reqs[i].grammar.guide.allowed(reqs[i].grammar.state) for i in rows])  # [k, words]
        out = torch.from_numpy(bm.astype(np.int32, copy=False)), torch.tensor(rows, dtype=torch.int64)
        dt = time.perf_counter() - t
        self.stats["mask_s"] += dt
        for i in rows:  # traced requests get an equal share of the batch's mask time
            if reqs[i].trace is not None:
                reqs[i].trace.grammar_s += dt / len(rows)
        return out

    def advance(self, req: Req, token: int) -> FinishReason | None:
        """Advance the request's guide over the sampled token; a finish reason when the match is complete."""
        g = req.grammar
        if g is None:
            return None
        if token in self.info.eos_token_ids:
            return FinishReason("stop", matched=token)  # only sampleable in accepting states
        t = time.perf_counter()
        g.state = g.guide.advance(g.state, token)
        done = g.guide.is_final(g.state) and not g.guide.can_continue(g.state)
        dt = time.perf_counter() - t
        self.stats["advance_s"] += dt
        if req.trace is not None:
            req.trace.grammar_s += dt
        return FinishReason("stop", matched=None) if done else None

    def attach(self, req: Req, guide: Guide, max_thinking_tokens: int | None = None) -> None:
        """Give a new request its guide state; a forced opening becomes output tokens before the first forward."""
        prompt = text_ids(req.input_ids[-16:])  # a prompt's image tokens have no text
        if self.think is not None and self.think.starts_thinking(self.tokenizer.decode(prompt)):
            # a reasoning model: the constraint starts after </think> (the request's own thinking bound first)
            guide = ThinkingGuide(guide, self.think.bounded(max_thinking_tokens))
        req.grammar = GuideState(guide, guide.initial_state)
        self._initial_jump(req)

    def attach_thinking_bound(self, req: Req, max_thinking_tokens: int | None) -> None:
        """Give an unconstrained request on a reasoning model its bounded-thinking guide when one applies."""
        if self.think is None:
            return
        prompt = self.tokenizer.decode(text_ids(req.input_ids[-16:]))
        guide = bounded_thinking_guide(self.think, self.info, prompt, max_thinking_tokens)
        if guide is not None:
            req.grammar = GuideState(guide, guide.initial_state)

    # ------------------------------------------------------------------ jump-forward
    def _initial_jump(self, req: Req) -> None:
        """Before the first forward: a forced opening (e.g. '{"') becomes output tokens prefilled with the prompt."""
        g = req.grammar
        if not self.jump_forward_enabled or g is None or req.sampling.max_new_tokens == 0:
            return
        forced = g.guide.forced_string(g.state)
        if not forced:
            return
        res = g.guide.jump_tokens(g.state, [], forced, tokenizer=self.tokenizer)
        if res.new_token_ids and len(res.new_token_ids) < req.sampling.max_new_tokens:
            req.output_ids.extend(res.new_token_ids)
            if req.logprob.return_logprob:
                req.output_logprobs.extend(TokenLogprob(None, t) for t in res.new_token_ids)
            req.num_jumped_tokens += len(res.new_token_ids)
            if req.trace is not None:
                req.trace.jumped(0, len(res.new_token_ids))
            g.state = res.new_state
            self._retext(req)

    def jump_forward(self, reqs: list[Req], kv: KVManager) -> list[Req]:
        """Append forced strings to running constrained requests; returns those that finished by it."""
        finished = []
        if not self.jump_forward_enabled:
            return finished
        t = time.perf_counter()
        self._jump_all(reqs, kv, finished)
        self.stats["jump_s"] += time.perf_counter() - t
        return finished

    def _jump_all(self, reqs: list[Req], kv: KVManager, finished: list[Req]) -> None:
        for req in reqs:
            g = req.grammar
            # pending 1: the sampled token's KV comes next step; 0: overlap scheduling already computed it
            if g is None or req.finished or req.pending > 1:
                continue
            try:
                self.iso.probe("jump-forward", req)
                t = time.perf_counter()
                reason = self._jump_one(req, g, kv)
                if req.trace is not None:
                    req.trace.grammar_s += time.perf_counter() - t
            except Exception as e:  # noqa: BLE001 - isolated: this request alone ends
                self.iso.fail(req, "jump-forward", e)
                finished.append(req)
                continue
            if reason is not None:
                req.finish_reason = reason
                finished.append(req)

    def _jump_one(self, req: Req, g: GuideState, kv: KVManager) -> FinishReason | None:
        """Jump one request over its forced string; a finish reason when that completes it.

        Every intermediate state keeps kv consistent (slots cover a prefix of all_ids), so a failure
        part-way leaves a request that can be aborted and released normally.
        """
        forced = g.guide.forced_string(g.state)
        if not forced:
            return None
        res = g.guide.jump_tokens(g.state, req.output_ids, forced, tokenizer=self.tokenizer)
        if not res.new_token_ids and res.rollback == 0:
            return None
        if len(res.new_token_ids) < self.min_jump_tokens and not self._jump_ends(req, g, res):
            return None  # too short to pay for its extend: the masked decode steps produce these tokens
        keep = len(req.output_ids) - res.rollback
        new_kv = min(req.kv_len, len(req.input_ids) + keep)
        if not kv.rollback(req, new_kv):
            return None  # the tokens to replace are owned by the radix cache: skip this jump
        if res.rollback:
            self.stats["rollbacks"] += 1
        del req.output_ids[keep:]
        del req.output_logprobs[keep:]
        req.output_ids.extend(res.new_token_ids)
        if req.logprob.return_logprob:
            req.output_logprobs.extend(TokenLogprob(None, t) for t in res.new_token_ids)
        req.num_jumped_tokens += len(res.new_token_ids)
        if req.trace is not None:
            req.trace.jumped(keep, len(res.new_token_ids))
        self.stats["jumps"] += 1
        self.stats["jumped_tokens"] += len(res.new_token_ids)
        g.state = res.new_state
        reason = self._retext(req) if res.rollback else self._text_after_append(req)
        if reason is None and g.guide.is_final(g.state) and not g.guide.can_continue(g.state):
            reason = FinishReason("stop", matched=None)
        if reason is None and len(req.output_ids) >= req.sampling.max_new_tokens:
            reason = FinishReason("length", length=len(req.output_ids))
        return reason

    def _jump_ends(self, req: Req, g: GuideState, res) -> bool:
        """Whether applying this jump finishes the request (its jumped tokens then need no forward at all)."""
        if len(req.output_ids) - res.rollback + len(res.new_token_ids) >= req.sampling.max_new_tokens:
            return True
        return g.guide.is_final(res.new_state) and not g.guide.can_continue(res.new_state)

    def _text_after_append(self, req: Req) -> FinishReason | None:
        """Tokens were only appended: detokenize them like sampled ones (now if the text is read, else later)."""
        s = req.sampling
        if req.detok is None or req.detok.broken:
            return self._retext(req)
        if not (req.stream or s.stop or s.stop_regex):
            return None  # nobody reads the text before the next output: output.sync_text catches up then
        return append_text(req, req.detok.catch_up(req.output_ids))

    def _retext(self, req: Req) -> FinishReason | None:
        """Rebuild the detokenizer over the changed outputs; stop strings see only the new text."""
        s = req.sampling
        req.detok = IncrementalDetokenizer(self.tokenizer, req.input_ids, s.skip_special_tokens,
                                           s.spaces_between_special_tokens)
        full = req.detok.push(list(req.output_ids))
        if full.startswith(req.text):
            return append_text(req, full[len(req.text):])
        req.text = ""  # bytes are unchanged by re-tokenization, so this is only a safety net
        return append_text(req, full)

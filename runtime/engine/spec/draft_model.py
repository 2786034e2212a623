"""STANDALONE speculative decoding's drafts: a smaller (or more quantized) model with the target's vocabulary guesses
the next k tokens of each drafting request; engine/spec/verify.py checks them in one target forward.

What the draft model owns:
- its own ModelRunner (speculative_draft_model_path, speculative_draft_model_quantization), KV pool, request rows
  and radix cache (runtime/memory: the target's classes), loaded at start, after its vocabulary is checked equal
  to the target's (a mismatch is refused by name);
- one shadow Req per target request (req.spec.shadow): the ids whose draft KV is in the draft pool. Each drafting
  step first syncs it with the target's sequence: the draft KV past the longest common prefix is rolled back
  (rejected draft tokens, jump-forward rewrites), and the tokens the target appended since (the accepted draft
  tokens and the target's own token) are extended in the draft's first forward of the step;
- the k draft forwards, batched across requests: the first extends what is pending, the next k - 1 decode one
  token each. A token is drawn from q, the draft's distribution under the request's grammar mask (the guide
  advanced over the draft so far), temperature and truncation, with the end tokens masked (a draft never guesses
  the end); greedy requests take q's argmax. A sampled request keeps q for the p/q acceptance (spec/probs.py);
- the cuts: a draft stops where the guide forbids every token, and after a token from which the guide forces a
  string (jump-forward appends that, undrafted);
- release: when the target request leaves, its shadow's KV goes to the draft radix cache (no leak in either pool).
The draft length adapts as NGRAM's does (ngram.NgramDrafter.record), and the same batch policy applies.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from sglpy.kernels import apply_token_bitmask

from ...config import EngineConfig
from ...core import BatchEntry, Req
from ...memory.kv_manager import KVManager
from ...memory.kv_pool import KVPool, ReqToTokenPool, kv_cache_torch_dtype
from ...memory.radix_cache import RadixCache
from .gate import CostGate
from .ngram import MAX_DRAFT_BATCH, NgramDrafter, SpecState
from .probs import processed_probs
from ..truncation import inverse_cdf

logger = logging.getLogger(__name__)

SHORT_EXTEND = 8  # a shadow's pending tokens up to this many run as decode rows (accepted tokens + the target's)


def check_draft_vocab(target_tokenizer, target_vocab: int, draft_path: str) -> None:
    """Refuse a draft model whose tokenizer or logits width differs from the target's (ValueError, by name)."""
    from transformers import AutoConfig, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(draft_path)
    if tok.get_vocab() != target_tokenizer.get_vocab():
        raise ValueError(f"speculative_draft_model_path {draft_path}: the draft model's tokenizer differs from the "
                         f"target's ({len(tok.get_vocab())} vs {len(target_tokenizer.get_vocab())} tokens, or other "
                         "ids); STANDALONE needs the same vocabulary")
    v = AutoConfig.from_pretrained(draft_path).vocab_size
    if v != target_vocab:
        raise ValueError(f"speculative_draft_model_path {draft_path}: the draft model's vocab_size {v} differs "
                         f"from the target's {target_vocab}; STANDALONE needs the same vocabulary")


@dataclass
class _Drafting:
    """One request drafting this step: its index in the batch, the tokens to draft, its shadow's pending extend
    and the shadow's KV length before it (restored if the draft forward fails)."""

    index: int
    req: Req
    k: int
    ext: int
    base: int
    tokens: list[int] = field(default_factory=list)
    qs: list[torch.Tensor] = field(default_factory=list)  # q's rows of the sampled draft tokens, [vocab] each
    state: Any = None  # the grammar guide's state after the draft so far


class StandaloneDrafter(NgramDrafter):
    """Drafts with a draft model (its own runner, KV pool and radix cache); adapts k per request as NGRAM does."""

    def __init__(self, cfg: EngineConfig, target_tokenizer, target_vocab: int, max_context: int, pool_tokens: int,
                 eos_ids: set[int]):
        from ...model.loader import resolve_model_path
        from ...model.runner import ModelRunner

        k = cfg.speculative_num_steps or cfg.speculative_num_draft_tokens
        super().__init__(k, 1, 1, eos_ids, max_batch=MAX_DRAFT_BATCH, jump_forward=not cfg.disable_jump_forward)
        path = resolve_model_path(cfg.speculative_draft_model_path)
        check_draft_vocab(target_tokenizer, target_vocab, path)
        dcfg = dataclasses.replace(cfg, model=path, quantization=cfg.speculative_draft_model_quantization or "auto",
                                   speculative_algorithm=None, speculative_draft_model_path=None,
                                   speculative_num_steps=None, speculative_draft_model_quantization=None,
                                   max_context_len=max_context, max_total_tokens=pool_tokens, disable_cuda_graph=True,
                                   enable_lora=False, lora_paths=None)  # the draft guesses for the base model
        self.runner = r = ModelRunner(dcfg, path)
        kv_dtype = kv_cache_torch_dtype(cfg.kv_cache_dtype, r.dtype)
        self.kv = KVManager(KVPool(r.num_layers, pool_tokens, r.num_kv_heads, r.head_dim, kv_dtype, r.device),
                            ReqToTokenPool(cfg.max_running_requests, max_context, r.device),
                            RadixCache(disable=cfg.disable_radix_cache))
        self.generator = torch.Generator(device="cpu").manual_seed(cfg.seed + 1)  # the draft's own draws
        self.stats.update({"spec_draft_forwards": 0})
        self.quantization = r.quantization
        # drafting only while it is measured faster (None: always). On CPU the gate's clock is the loop thread's CPU
        # time: on a shared machine wall time also counts the moments other processes held the core, which made
        # one mode look faster by whatever ran beside it (the loop thread computes every forward with 1 thread, and
        # takes part in every parallel region with more); on CUDA the thread waits for the device: wall time
        self.gate: CostGate | None = CostGate(clock=time.thread_time if r.device.type == "cpu" else time.perf_counter)

    # ------------------------------------------------------------------ drafting
    def propose_batch(self, reqs: list[Req], limits: list[int], budget: int) -> list[tuple[int, ...]]:
        """Draft for every request at once (k draft forwards); () for those that pause or cannot draft."""
        if self.gate is not None and not self.gate.decide(reqs, sum(len(r.output_ids) for r in reqs)):
            return [()] * len(reqs)  # plain steps are the faster ones here (engine/spec/gate.py)
        want: list[_Drafting] = []
        for i, (r, lim) in enumerate(zip(reqs, limits)):
            st = r.spec
            if st is None:
                st = r.spec = SpecState(self.max_k)
            st.q = None
            if st.pause > 0:
                st.pause -= 1
                continue
            k = min(st.k, lim, budget)
            g = r.grammar
            if k <= 0 or r.sampling.max_new_tokens == 0 or (g is not None and g.guide.forced_string(g.state)):
                continue
            ext = self._sync(r)
            if ext:
                want.append(_Drafting(i, r, k, ext, st.shadow.kv_len - ext, state=g.state if g is not None else None))
                budget -= k
        drafts: list[tuple[int, ...]] = [()] * len(reqs)
        if not want:
            if self.gate is not None:
                self.gate.drafted(False)
            return drafts
        try:
            self._run(want)
        except Exception:  # noqa: BLE001 - a failed draft costs the drafts, never the requests
            logger.exception("draft model forward failed; no drafts this step")
            for d in want:
                d.req.spec.q = None
                self.kv.rollback(d.req.spec.shadow, d.base)  # the slots taken since hold no trusted KV
                self._drop(d.req)
            return drafts
        for d in want:
            drafts[d.index] = tuple(d.tokens)
            d.req.spec.q = torch.stack(d.qs) if d.qs and not d.req.sampling.greedy else None  # [k, vocab]
        if self.gate is not None:
            self.gate.drafted(any(drafts))
        return drafts

    def _sync(self, r: Req) -> int:
        """Bring r's shadow to r's sequence (roll back past the common prefix, take slots for what is pending);
        the number of tokens to extend, 0 when the draft pool or its rows are short (no draft this step)."""
        st, kv = r.spec, self.kv
        sh = st.shadow
        if sh is not None:
            n = len(sh.input_ids)
            known = sh.kv_len - n  # output tokens with draft KV
            out = r.output_ids
            if sh.output_ids[:known] != out[:known]:
                known = next(j for j in range(known) if j >= len(out) or sh.output_ids[j] != out[j])
            if n + known < sh.kv_len and not kv.rollback(sh, n + known):
                self._drop(r)
                sh = None
            else:
                sh.output_ids = list(out)
        if sh is None:
            if not kv.has_free_row():
                return 0
            sh = st.shadow = Req(rid=r.rid, input_ids=r.input_ids, sampling=r.sampling, extra_key=r.extra_key)
            sh.output_ids = list(r.output_ids)
            kv.match_prefix(sh, sh.all_ids[:sh.seq_len - 1])
            kv.assign_row(sh)
        ext = sh.pending
        return ext if kv.grow(sh, ext) else 0

    def _run(self, want: list[_Drafting]) -> None:
        """The draft forwards of one step: the pending extend, then one-token decode steps, batched."""
        # one-token entries first, then short ones as decode rows of their request (the drafted-entry layout of
        # model/forward_batch.py: the fused decode layer on CPU), then prompts
        going = sorted(want, key=lambda d: (d.ext > 1) + (d.ext > SHORT_EXTEND))
        entries = [self._entry(d.req.spec.shadow, d.base, d.ext) for d in going]
        while entries:
            out = self.runner.forward(entries, sum(1 for e in entries if e.extend_len == 1), self.kv.buffers)
            self.stats["spec_draft_forwards"] += 1
            last = [row + (len(e.draft) if e.draft else 0) for row, e in zip(out.sample_row, entries)]
            rows = torch.tensor(last, dtype=torch.int64, device=out.logits.device)
            toks, q_rows = self._pick(out.logits[rows].float(), going)  # [n, vocab] copied: changed in place
            nxt = []
            for d, t, q in zip(going, toks, q_rows):
                if t is None:  # the guide allows nothing but the end here
                    continue
                g = d.req.grammar
                if g is not None:
                    try:
                        d.state = g.guide.advance(d.state, t)
                    except ValueError:
                        continue
                d.tokens.append(t)
                d.req.spec.shadow.output_ids.append(t)
                if q is not None:
                    d.qs.append(q)
                forced = g is not None and self.jump_forward and g.guide.forced_string(d.state)
                if len(d.tokens) < d.k and not forced:
                    nxt.append(d)
            going, entries = [], []
            for d in nxt:
                sh = d.req.spec.shadow
                if self.kv.grow(sh, 1):  # else the draft pool is short: this draft stops here
                    going.append(d)
                    entries.append(BatchEntry(sh, sh.kv_len - 1, 1, sample=True))

    @staticmethod
    def _entry(sh: Req, base: int, ext: int) -> BatchEntry:
        """The forward entry extending sh by ext tokens from base: up to SHORT_EXTEND run as decode rows."""
        if 1 < ext <= SHORT_EXTEND:
            return BatchEntry(sh, base, ext, sample=True, draft=tuple(sh.all_ids[base + 1:base + ext]))
        return BatchEntry(sh, base, ext, sample=True)

    def _pick(self, logits: torch.Tensor, going: list[_Drafting]) -> tuple[list[int | None], list]:
        """One draft token per row of logits [n, vocab] (None: nothing allowed), and q's row for sampled ones."""
        n, vocab = logits.shape
        reqs = [d.req for d in going]
        for i, r in enumerate(reqs):  # a draft never guesses the end (q is what it draws from, ends excluded)
            ends = [t for t in self.eos_ids | set(r.sampling.stop_token_ids) if 0 <= t < vocab]
            if ends:
                logits[i, ends] = float("-inf")
        masked = [i for i, r in enumerate(reqs) if r.grammar is not None]
        if masked:
            import numpy as np

            bm = np.stack([reqs[i].grammar.guide.allowed(going[i].state) for i in masked]).astype(np.int32, copy=False)
            apply_token_bitmask(logits, torch.from_numpy(bm).to(logits.device),
                                torch.tensor(masked, dtype=torch.int64, device=logits.device))
        ok = torch.isfinite(logits).any(dim=-1).tolist()
        toks: list[int | None] = logits.argmax(dim=-1).tolist()
        q_rows: list = [None] * n
        sampled = [i for i, r in enumerate(reqs) if ok[i] and not r.sampling.greedy]
        if sampled:
            q = processed_probs(logits[sampled], [reqs[i] for i in sampled])  # [s, vocab]
            u = torch.tensor([self._uniform(reqs[i]) for i in sampled], dtype=torch.float32, device=q.device)
            for pos, (i, t) in enumerate(zip(sampled, inverse_cdf(q, u).tolist())):
                toks[i], q_rows[i] = t, q[pos]
        return [t if ok[i] else None for i, t in enumerate(toks)], q_rows

    def _uniform(self, r: Req) -> float:
        """A uniform for r's draft token: from its own generator when seeded (reruns are reproducible)."""
        if r.sampling.seed is None:
            return float(torch.rand(1, generator=self.generator))
        st = r.spec
        if st.generator is None:
            st.generator = torch.Generator(device="cpu").manual_seed(r.sampling.seed + 0x5EC)
        return float(torch.rand(1, generator=st.generator))

    # ------------------------------------------------------------------ lifetime
    def _drop(self, r: Req) -> None:
        sh = r.spec.shadow
        r.spec.shadow = None
        sh.output_ids = sh.output_ids[:max(sh.kv_len - len(sh.input_ids), 0)]
        self.kv.release(sh)

    def release(self, r: Req) -> None:
        """The target request left: its shadow's KV (synced to the ids it holds) goes to the draft cache."""
        if r.spec is not None and getattr(r.spec, "shadow", None) is not None:
            self._drop(r)

    def flush(self) -> None:
        """Empty the draft radix cache (the engine's flush_cache; no request holds draft KV then)."""
        self.kv.flush()

    def info(self) -> dict:
        """Counters plus the draft pool's slot counts (kv_used 0 once idle: nothing leaked)."""
        s = self.kv.stats()
        gate = self.gate.stats if self.gate is not None else {}
        return {**self.stats, **gate, "draft_kv_total": s.total, "draft_kv_free": s.free, "draft_kv_evictable": s.evictable,
                "draft_kv_used": s.used, "draft_quantization": self.quantization}

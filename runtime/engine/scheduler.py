"""Continuous batching: admits waiting requests, grows their KV (asking the KV manager), and preempts."""

from __future__ import annotations

import logging
import time

from ..config import EngineConfig
from ..memory.kv_manager import KVManager
from ..core import BatchEntry, FinishReason, Req, ReqStatus, ScheduledBatch
from .schedule_policy import order_waiting, split_in_batch_sharing

logger = logging.getLogger(__name__)

NEW_TOKEN_RATIO = 0.25  # share of running requests' remaining output budget kept free at admission
RESERVE_CAP = 256  # per-request cap on that reserve


class RunningSet:
    """The running requests in arrival order: O(1) membership, append and removal (a dict keyed by identity).

    Requests are admitted mostly in arrival order; one admitted out of order (a preempted request, an lpm pick)
    marks the order stale, and the next `ordered()` sorts once instead of every step."""

    def __init__(self):
        self._reqs: dict[Req, None] = {}
        self._sorted = True

    def append(self, req: Req) -> None:
        """Add a request (it is scheduled in arrival order with the others)."""
        if self._sorted and self._reqs and req.arrival < next(reversed(self._reqs)).arrival:
            self._sorted = False
        self._reqs[req] = None

    def remove(self, req: Req) -> None:
        """Drop a request (KeyError when it is not running)."""
        del self._reqs[req]

    def ordered(self) -> list[Req]:
        """The running requests, oldest first (a snapshot: the set may change while it is walked)."""
        if not self._sorted:
            self._reqs = dict.fromkeys(sorted(self._reqs, key=lambda r: r.arrival))
            self._sorted = True
        return list(self._reqs)

    def newest(self) -> Req:
        """The most recently arrived running request (the preemption victim)."""
        if self._sorted:
            return next(reversed(self._reqs))
        return max(self._reqs, key=lambda r: r.arrival)

    def __contains__(self, req: Req) -> bool:
        return req in self._reqs

    def __iter__(self):
        return iter(self._reqs)

    def __len__(self) -> int:
        return len(self._reqs)

    def __bool__(self) -> bool:
        return bool(self._reqs)


class Scheduler:
    """Owns the waiting queue and the running set; asks the KV manager for every slot a request needs."""

    def __init__(self, cfg: EngineConfig, kv: KVManager, max_context: int, span_cap: int | None = None):
        self.cfg = cfg
        self.kv = kv
        self.max_context = max_context
        self.waiting: list[Req] = []
        self.running = RunningSet()
        self.total_retractions = 0
        # the most generated tokens (a jump-forward span) a running request extends by in one step: the multi-token
        # graph step's T when the runner has one (None: no cap), so a long span rides captured steps in pieces
        # instead of taking the whole batch through an eager forward (the H100 spent 0.52 of 0.64 s there)
        self.span_cap = span_cap

    # -------------------------------------------------------------- queue ops
    def add(self, req: Req) -> None:
        """Queue a new request."""
        req.status = ReqStatus.WAITING
        self.waiting.append(req)

    def has_work(self) -> bool:
        """Anything waiting or running."""
        return bool(self.waiting or self.running)

    def remove(self, req: Req) -> None:
        """Drop a finished/aborted request: its KV goes to the cache (or the free list)."""
        if req in self.running:
            self.running.remove(req)
            self.kv.release(req)
        elif req.status is ReqStatus.WAITING and req in self.waiting:
            self.waiting.remove(req)
            self.kv.release(req)
        req.status = ReqStatus.FINISHED

    # -------------------------------------------------------------- KV (asked of the KV manager)
    def _match(self, req: Req) -> None:
        """Reuse the longest cached prefix; always recompute the last token (its logits are needed)."""
        limit = req.seq_len - 1
        if req.wants_input_logprobs():  # the logits from position logprob_start_len - 1 on are needed
            limit = min(limit, max(req.logprob.logprob_start_len - 1, 0))
        matched = self.kv.match_prefix(req, req.all_ids[:limit])
        if req.num_preemptions == 0:
            req.cached_tokens = matched

    def cache_unfinished(self, req: Req, upto: int | None = None) -> None:
        """After a prefill chunk: publish the request's KV (all_ids[:upto]) so waiting requests can share it."""
        self.kv.cache_unfinished(req, upto)

    def preempt(self, req: Req) -> None:
        """Return a running request to the front of the queue; its KV stays reusable in the cache."""
        self.running.remove(req)
        self.kv.release(req)
        req.num_preemptions += 1
        self.total_retractions += 1
        req.status = ReqStatus.WAITING
        self.waiting.insert(0, req)
        logger.info("preempted %s (kv pool short), %d running", req.rid, len(self.running))

    # -------------------------------------------------------------- scheduling
    def schedule(self) -> ScheduledBatch | None:
        """Pick this step's work: every decodable running request plus prefill chunks within budget."""
        aborted: list[Req] = []
        ordered = self.running.ordered()
        decode = self._schedule_decode(ordered, aborted)
        # every running request decodes one token: the steady state, where no request is mid-extend
        mid_extend = len(decode) < len(ordered)
        extend = self._schedule_extend(aborted, mid_extend)
        entries = decode + extend
        if not entries and not aborted:
            return None
        return ScheduledBatch(entries, len(decode), aborted)

    def _schedule_decode(self, ordered: list[Req], aborted: list[Req]) -> list[BatchEntry]:
        # r.pending == 1, inlined: this runs over every running request every step
        decode = [r for r in ordered if len(r.input_ids) + len(r.output_ids) - len(r.slots) == 1]
        if self.cfg.enable_deterministic_inference:  # a prompt's last token left by chunking stays an extend row
            decode = [r for r in decode if len(r.slots) >= len(r.input_ids)]
        if not decode:
            return []
        if self.kv.grow_each(decode):  # the steady state: every request's next slot in one call
            return [BatchEntry(r, len(r.slots) - 1, 1, sample=True) for r in decode]
        entries = []
        # short of free slots: one by one, oldest first; the victim is always the newest running request, which
        # is scheduled last, so a preempted request never holds a slot allocated this step (its KV would be unwritten)
        for req in decode:
            if req not in self.running:  # preempted below to make room
                continue
            while not self.kv.grow(req, 1):
                victim = self.running.newest()
                if victim is req and len(self.running) == 1:
                    req.finish_reason = FinishReason("abort", message="KV pool too small for this request")
                    self.remove(req)
                    aborted.append(req)
                    break
                self.preempt(victim)
                if victim is req:
                    break
            else:
                entries.append(BatchEntry(req, req.kv_len - 1, 1, sample=True))
        return entries

    def _schedule_extend(self, aborted: list[Req], mid_extend: bool = True) -> list[BatchEntry]:
        budget = self.cfg.max_prefill_tokens
        entries = []
        # running requests mid-prefill (chunked) or after a jump-forward come first
        # deterministic inference: also a prompt's last token after chunking. As a decode row it would take the
        # decode attention kernel, whose split reduction (CUDA) can differ in the last bit from the extend kernel
        # that the same token takes when its prompt is prefilled whole
        det = self.cfg.enable_deterministic_inference
        extending = self.running.ordered() if mid_extend else ()  # none mid-extend: no pass over the running
        for req in [r for r in extending
                    if r.pending > 1 or (det and r.pending == 1 and r.kv_len < len(r.input_ids))]:
            if budget <= 0:
                break
            n = min(req.pending, self.cfg.chunked_prefill_size, budget)
            if self.span_cap is not None and req.kv_len >= len(req.input_ids):  # generated tokens, not a prompt
                n = min(n, self.span_cap)
            if not self.kv.grow(req, n):
                break
            entries.append(self._entry(req, n))
            budget -= n
        if budget <= 0 or not self.waiting:
            return entries
        reserve = sum(min(max(r.sampling.max_new_tokens - len(r.output_ids), 0), RESERVE_CAP)
                      for r in self.running) * NEW_TOKEN_RATIO
        ordered = order_waiting(self.cfg.schedule_policy, self.waiting, self.kv.cache)
        left: set[int] = set()  # ids of the requests that leave the queue (one rebuild, not a remove each)
        # LoRA: the running requests' adapters, at most max_loras_per_batch (every step runs them all at once)
        adapters = {r.lora.uid for r in self.running if r.lora is not None} if self.cfg.lora_enabled else set()
        # requests sharing an uncached prefix with one ahead of them wait a round and then hit the cache
        for req in split_in_batch_sharing(ordered, self.kv.cache).first:
            if budget <= 0 or not self.kv.has_free_row():
                break
            if req.seq_len >= self.kv.num_slots:
                req.finish_reason = FinishReason("abort", message=f"request needs {req.seq_len + 1} KV slots, "
                                                                  f"pool has {self.kv.num_slots}")
                left.add(id(req))
                req.status = ReqStatus.FINISHED
                aborted.append(req)
                continue
            if req.lora is not None and req.lora.uid not in adapters:
                if len(adapters) >= self.cfg.max_loras_per_batch:
                    continue  # waits until a running adapter's requests finish
            peek = self.kv.peek_prefix_len(req.all_ids[: req.seq_len - 1], req.extra_key)
            need = min(req.seq_len - peek, self.cfg.chunked_prefill_size, budget)
            if self.kv.available() - need < reserve and self.running:
                break
            self._match(req)
            n = min(req.pending, self.cfg.chunked_prefill_size, budget)
            if not self.kv.assign_row(req) or not self.kv.grow(req, n):
                self.kv.release(req)
                break
            left.add(id(req))
            if req.lora is not None:
                adapters.add(req.lora.uid)
            self.running.append(req)
            req.status = ReqStatus.RUNNING
            entries.append(self._entry(req, n))
            budget -= n
            reserve += min(req.sampling.max_new_tokens, RESERVE_CAP) * NEW_TOKEN_RATIO
        if left:
            self.waiting = [r for r in self.waiting if id(r) not in left]
        return entries

    @staticmethod
    def _entry(req: Req, n: int) -> BatchEntry:
        prefix = req.kv_len - n
        reaches_end = prefix + n == req.seq_len
        if req.trace is not None:
            req.trace.chunks.append([time.time(), prefix, n])
        return BatchEntry(req, prefix, n, sample=reaches_end and req.sampling.max_new_tokens > 0)

    # -------------------------------------------------------------- accounting
    def check_invariants(self) -> None:
        """KV accounting over the running requests (debug / tests): see KVManager.check_invariants."""
        self.kv.check_invariants(self.running)

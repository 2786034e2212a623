"""Overlap scheduling: while the device runs step n, the CPU finishes step n-1 and prepares step n+1.

One engine step, overlapped (engine.step when the overlap is on):
  1. schedule batch n; a request whose step n-1 token is not read back yet carries a placeholder id
     -1 - j in output_ids (the j-th id of step n-1's sampling), so the scheduler sees it one token longer,
     as it will be;
  2. launch forward n; placeholder input ids are resolved on the device from step n-1's token tensor;
  3. resolve step n-1 while forward n runs: wait for its ids (copied to pinned host memory with a
     non-blocking copy and an event), append them through the normal path (logprobs, grammar advance, stop
     rules, detokenization, jump-forward), retire finished requests, publish prompt KV, emit outputs;
  4. launch step n's sampling (penalties and grammar masks, which need step n-1's tokens, are computed now)
     and start copying its ids back; append the placeholders.
A request that finished at step n-1 was still decoded at step n: that row is discarded (its sampled id is
never appended) and its KV, which holds the real last token, goes to the cache with the rest. A request that
jump-forward changed in step 3 has its row discarded too and extends the jumped tokens next step.
On CPU the same control flow runs with synchronous tensors (tests compare it with the plain step).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from ..core import FinishReason, ForwardOutput, Req, ScheduledBatch
from .processor import SampleLaunch

if TYPE_CHECKING:
    from ..memory.kv_manager import KVManager
    from .engine import Engine

logger = logging.getLogger(__name__)


def placeholder(j: int) -> int:
    """The output id standing for the j-th id of the in-flight sampling."""
    return -1 - j


def drop_placeholder(req: Req, kv: KVManager) -> None:
    """Remove a trailing unresolved id (the request ends before it is read back) and any KV slot taken for it."""
    if req.output_ids and req.output_ids[-1] < 0:
        if req.kv_len >= req.seq_len:
            kv.rollback(req, req.seq_len - 1)
        req.output_ids.pop()


class HostTokens:
    """Sampled ids on their way to the host: a pinned buffer, a non-blocking copy and an event (CUDA)."""

    def __init__(self, tokens: torch.Tensor, pinned: torch.Tensor | None):
        self.n = int(tokens.shape[0])
        self.event = None
        if tokens.is_cuda:
            self.buf = pinned[: self.n]  # pinned: a true async copy, the loop does not wait here
            self.buf.copy_(tokens, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.buf = tokens

    def wait(self) -> list[int]:
        """The ids on the host (waits for the copy, not for later work on the stream)."""
        if self.event is not None:
            self.event.synchronize()
        return self.buf.tolist()


@dataclass
class InflightStep:
    """A forward launched but not resolved: its batch, logits, and the sampling launched on them."""

    batch: ScheduledBatch
    out: ForwardOutput
    jumped: list[int]  # each entry's num_jumped_tokens at launch: a jump-forward since invalidates the row
    launch: SampleLaunch | None = None
    host: HostTokens | None = None
    future: torch.Tensor | None = None  # [len(launch.reqs)] int64 on the device: what placeholders stand for


class OverlapStepper:
    """Runs engine steps in the overlapped order above; holds at most one step in flight."""

    def __init__(self, engine: Engine):
        self.eng = engine
        self.inflight: InflightStep | None = None
        dev = engine.runner.device
        n = engine.config.max_running_requests + 1
        # two pinned buffers, alternating: step n's copy must not overwrite step n-1's before it is read
        self._pinned = ([torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(2)]
                        if dev.type == "cuda" else None)
        self._flip = 0

    @property
    def busy(self) -> bool:
        """A step is in flight (it must be resolved even when no request is waiting or running)."""
        return self.inflight is not None

    def step(self) -> bool:
        """One overlapped step (schedule n, launch n, resolve n-1, sample n); False when there was nothing to do."""
        eng = self.eng
        t0 = time.perf_counter()
        prev = self.inflight
        batch = eng.scheduler.schedule()
        if batch is None and prev is None:
            return False
        finished: list[Req] = list(batch.aborted) if batch is not None else []
        cur = None
        if batch is not None and batch.entries:
            try:
                out = eng.runner.forward(batch.entries, batch.num_decode, eng.kv.buffers,
                                         prev.future if prev is not None else None)
                cur = InflightStep(batch, out, [e.req.num_jumped_tokens for e in batch.entries])
            except Exception as e:  # noqa: BLE001 - one bad batch must not kill the engine
                logger.exception("forward failed; aborting its requests")
                self._abort(batch.entries, e, finished)
        streaming: list[Req] = []
        self.inflight = None
        if prev is not None:
            try:
                streaming = self._resolve(prev, finished)
            except Exception as e:  # noqa: BLE001
                logger.exception("resolving a step failed; aborting its requests")
                self._abort(prev.batch.entries, e, finished)
        outputs = eng._retire(finished)
        self._emit_streaming(outputs, streaming)
        if cur is not None:
            try:
                self._launch(cur)
                # nothing left to resolve when every row was discarded and every request has ended
                if cur.launch.reqs or any(not e.req.finished for e in cur.batch.entries):
                    self.inflight = cur
            except Exception as e:  # noqa: BLE001
                logger.exception("sampling failed; aborting its requests")
                aborted: list[Req] = []
                self._abort(cur.batch.entries, e, aborted)
                eng._emit(eng._retire(aborted))
            eng.stats["num_steps"] += 1
            eng.stats["step_s"] += time.perf_counter() - t0
        if eng.config.debug_invariants:
            eng.scheduler.check_invariants()
        return True

    def _emit_streaming(self, outputs: list[Req], streaming: list[Req]) -> None:
        self.eng._emit(outputs + [r for r in streaming if not r.finished])

    def _abort(self, entries, exc: Exception, finished: list[Req]) -> None:
        for entry in entries:
            r = entry.req
            if not r.finished:
                drop_placeholder(r, self.eng.kv)
                r.finish_reason = FinishReason("abort", message=f"internal error: {exc}")
                finished.append(r)

    def _resolve(self, prev: InflightStep, finished: list[Req]) -> list[Req]:
        """Read step n-1's ids back and apply them; returns its streaming requests (emitted after retiring)."""
        eng = self.eng
        entries = prev.batch.entries
        launch = prev.launch
        tokens = prev.host.wait() if prev.host is not None else []
        if launch is not None:
            for j, r in enumerate(launch.reqs):
                if r.output_ids and r.output_ids[-1] == placeholder(j):
                    r.output_ids.pop()  # the real id is appended by complete(), through the normal path
        finished += eng.processor.prepare(entries, prev.out)
        if launch is not None:
            finished += eng.processor.complete(launch, tokens)
        # jump-forward right after a sampled token, as the plain step does (a request whose row was discarded
        # has just jumped, and its jumped tokens are being extended now: it waits for its next token)
        finished += eng.constrained.jump_forward(launch.reqs if launch is not None else [], eng.kv)
        for e in entries[prev.batch.num_decode:]:
            r = e.req
            # publish the KV this entry computed (as the plain step does), not the slot taken since for the next
            # token; never a key holding an unresolved id
            end = e.prefix_len + e.extend_len
            if not r.finished and e.prefix_len < len(r.input_ids) and min(r.all_ids[:end], default=0) >= 0:
                eng.scheduler.cache_unfinished(r, end)
        return [e.req for e in entries if e.req.stream and e.prefix_len + e.extend_len >= len(e.req.input_ids)]

    def _launch(self, cur: InflightStep) -> None:
        """Sample step n's valid rows on the device, start the copy back, append the placeholders."""
        eng = self.eng
        entries = cur.batch.entries
        valid = [not e.req.finished and e.req.seq_len == e.prefix_len + e.extend_len
                 and e.req.num_jumped_tokens == cur.jumped[i] for i, e in enumerate(entries)]
        launch = eng.processor.launch(entries, cur.out, valid)
        cur.launch = launch
        if not launch.reqs:
            return
        if isinstance(launch.tokens, list):  # a row-by-row retry after a failure: None rows failed
            ids = launch.tokens
            future = torch.tensor([t if t is not None else 0 for t in ids], dtype=torch.int64,
                                  device=eng.runner.device)
        else:
            ids, future = None, launch.tokens
        pinned = None
        if self._pinned is not None:
            pinned, self._flip = self._pinned[self._flip], 1 - self._flip
        cur.future = future
        cur.host = HostTokens(future, pinned)
        for j, r in enumerate(launch.reqs):
            if not r.finished and (ids is None or ids[j] is not None):
                r.output_ids.append(placeholder(j))

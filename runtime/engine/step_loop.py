"""The runtime Engine's step loop (its loop thread only): inbox messages, schedule -> forward -> process -> emit.

A mixin of runtime/engine/engine.py's Engine, which builds the state it reads (scheduler, runner, kv,
processor, constrained, isolation, stats) and starts the thread that runs `_loop`.
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass, field

from ..core import FinishReason, OutputSink, Req, ReqStatus
from ..messages import AbortReq, FlushCacheReq, GetServerInfoReq, ReqOutput, ShutdownReq, StepOutputs
from ..model.parallel import TPGroupError
from .output import aborted_output, build_output
from .overlap import drop_placeholder

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class SubmitMsg:
    """Inbox item: a built request and where its outputs go."""

    req: Req


@dataclass
class Progress:
    """Step-loop liveness, written by the loop thread only."""

    steps: int = 0
    last: float = field(default_factory=time.monotonic)  # when the loop last finished a step or woke from idle
    idle: bool = True  # blocked waiting for a message with nothing to do


@dataclass(frozen=True)
class CallMsg:
    """Inbox item: a call answered on the loop thread through `reply`."""

    request: FlushCacheReq | GetServerInfoReq
    reply: Future


class StepLoop:
    """The loop thread's half of the Engine: messages in, one scheduling round per step, outputs out."""

    # ------------------------------------------------------------------ the loop (engine thread only)
    def _has_work(self) -> bool:
        return self.scheduler.has_work() or (self.overlap is not None and self.overlap.busy)

    def _loop(self) -> None:
        prog = self._progress
        while True:
            block = not self._has_work()
            prog.idle = block
            try:
                msg = self._inbox.get(block=block)
            except queue.Empty:
                msg = None
            if block:
                prog.idle, prog.last = False, time.monotonic()  # waiting for work is not a stall
            while msg is not None:
                if isinstance(msg, ShutdownReq):
                    self._abort_all("engine shut down")
                    self._stopped = True
                    return
                self._handle(msg)
                try:
                    msg = self._inbox.get_nowait()
                except queue.Empty:
                    msg = None
            try:
                stepped = self._has_work() and self.step()
            except TPGroupError as e:  # a rank is gone: nothing can run any more; fail loudly, never hang
                self.failure = str(e)
                logger.error("%s; the engine stops", e)
                self._abort_all(f"engine failed: {e}")
                self._stopped = True
                return
            if stepped:
                prog.steps += 1
                prog.last = time.monotonic()

    def _handle(self, msg) -> None:
        if isinstance(msg, SubmitMsg):
            self._reqs[msg.req.rid] = msg.req
            self.stats["num_requests"] += 1
            self.scheduler.add(msg.req)
        elif isinstance(msg, AbortReq):
            req = self._reqs.get(msg.rid)
            if req is not None and not req.finished:
                req.finish_reason = FinishReason("abort", message="aborted by the client")
                self._emit(self._retire([req]))
        elif isinstance(msg, CallMsg):
            try:
                msg.reply.set_result(self._answer(msg.request))
            except Exception as e:  # noqa: BLE001 - delivered to the caller
                msg.reply.set_exception(e)
        else:
            raise TypeError(f"unexpected inbox message {type(msg).__name__}")

    def _answer(self, request: FlushCacheReq | GetServerInfoReq):
        return self._flush() if isinstance(request, FlushCacheReq) else self._info()

    def step(self) -> bool:
        """One scheduling round: schedule -> forward -> process -> emit; False when nothing could be scheduled."""
        if self.overlap is not None:
            return self.overlap.step()
        t0 = time.perf_counter()
        batch = self.scheduler.schedule()
        if batch is None:
            return False
        finished = list(batch.aborted)
        if batch.entries:
            try:
                out = self.runner.forward(batch.entries, batch.num_decode, self.kv.buffers)
                finished += self.processor.process(batch.entries, out)
                finished += self.constrained.jump_forward([e.req for e in batch.entries], self.kv)
            except TPGroupError:
                raise  # the group is broken: the loop ends (see _loop)
            except Exception as e:  # noqa: BLE001 - one bad batch must not kill the engine
                logger.exception("step failed; aborting its requests")
                for entry in batch.entries:
                    if not entry.req.finished:
                        entry.req.finish_reason = FinishReason("abort", message=f"internal error: {e}")
                        finished.append(entry.req)
            self.stats["num_steps"] += 1
            self.stats["step_s"] += time.perf_counter() - t0
        outputs = self._retire(finished)
        for e in batch.entries[batch.num_decode:]:
            # publish prompt KV for sharing; output KV stays request-owned so jump-forward can roll it back
            if not e.req.finished and e.prefix_len < len(e.req.input_ids):
                self.scheduler.cache_unfinished(e.req)
        outputs += [e.req for e in batch.entries if e.req.stream and not e.req.finished
                    and e.prefix_len + e.extend_len >= len(e.req.input_ids)]
        self._emit(outputs)
        if self.config.debug_invariants:
            self.scheduler.check_invariants()
        return True

    def _retire(self, reqs: list[Req]) -> list[Req]:
        """Finished requests leave the scheduler (their KV goes to the cache) and are counted."""
        for r in reqs:
            drop_placeholder(r, self.kv)  # overlap: an id still in flight is not part of the output
            self.scheduler.remove(r)
            self._reqs.pop(r.rid, None)
            if r.finish_reason.type == "abort":
                self.stats["num_aborted"] += 1
            self.stats["prompt_tokens"] += len(r.input_ids)
            self.stats["generation_tokens"] += len(r.output_ids)
            self.stats["cached_tokens"] += r.cached_tokens
        return reqs

    def _emit(self, reqs: list[Req]) -> None:
        """One StepOutputs per sink with the outputs of `reqs` (final ones included)."""
        by_sink: dict[int, tuple[OutputSink, list]] = {}
        for r in reqs:
            if r.sink is not None:
                by_sink.setdefault(id(r.sink), (r.sink, []))[1].append(self._output(r))
        for sink, outs in by_sink.values():
            try:
                sink(StepOutputs(outs))
            except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
                logger.exception("output sink failed for %d request(s)", len(outs))

    def _output(self, r: Req) -> ReqOutput:
        """The request's output; if shaping it fails, it ends (alone) with a final abort output."""
        try:
            self.isolation.probe("output", r)
            return build_output(r, self.tokenizer)
        except Exception as e:  # noqa: BLE001 - isolated: this request alone ends
            self.isolation.fail(r, "output", e)
            if r.status is not ReqStatus.FINISHED:
                self._retire([r])
            return aborted_output(r.rid, len(r.input_ids), r.finish_reason.message)

    def _abort_all(self, message: str) -> None:
        reqs = list(self.scheduler.waiting) + list(self.scheduler.running)
        for r in reqs:
            r.finish_reason = FinishReason("abort", message=message)
        self._emit(self._retire(reqs))

    def _flush(self) -> bool:
        if self._has_work():
            return False
        self.kv.flush()
        return True

    def _info(self) -> dict:
        kv = self.kv.stats()
        info = {k: getattr(self.config, k) for k in self.config.__dataclass_fields__}
        info.update({
            "quantization": self.runner.quantization,  # the mode that runs ('auto' resolved)
            "cpu_kernels": self.runner.cpu_kernels,  # 'native: ...' or 'torch reference: <why>'; None off CPU
            "model_path": self.model_path,
            "max_total_num_tokens": kv.total,
            "max_context_len": self.max_context,
            "kv_free": kv.free,
            "kv_evictable": kv.evictable,
            "kv_protected": kv.protected,
            "kv_used": kv.used,
            "num_running_reqs": len(self.scheduler.running),
            "num_waiting_reqs": len(self.scheduler.waiting),
            "total_retractions": self.scheduler.total_retractions,
            "kv_pool_plan": self.memory_plan.describe() if self.memory_plan is not None else None,
            "cuda_graph_batch_sizes": list(self.runner.graphs.buckets) if self.runner.graphs is not None else [],
            "overlap_schedule": self.overlap is not None,
            "time": time.time(),
        })
        info.update(self.stats)
        info["grammar"] = {**self.constrained.stats, **self.constrained.service.stats}
        info["isolated_failures"] = dict(self.isolation.failures)
        info["tp_rank_pids"] = self.runner.rank_pids()  # this node's ranks 1..; operators (and tests) watch them
        return info

"""One engine step from typed parts (schedule, draft, launch, resolve, retire/emit), run plain or overlapped.

    plain:       schedule n -> draft n -> forward n -> sample or verify n -> resolve n -> retire/emit
    overlapped:  schedule n -> forward n -> resolve n-1 -> retire/emit -> sample n (its ids stay on the device)

The draft phase (speculative decoding, engine/spec/) runs in the plain order only: drafting step n needs step
n-1's tokens on the host, which is what the overlapped order defers (docs/speculative.md, "Limits").

`Stepper.step` is the one step function for both orders. Overlapped, a request whose step n-1 token is not read
back yet carries a placeholder id in output_ids (engine/overlap.py), forward n resolves it on the device, and the
step's sampling (penalties and grammar masks need step n-1's tokens) runs after step n-1 is resolved. A request
that finished at step n-1 was still decoded at step n: that row is discarded (its sampled id is never appended)
and its KV, which holds the real last token, goes to the cache with the rest; a request that jump-forward changed
since has its row discarded too and extends the jumped tokens next step. On CPU the overlapped order runs with
synchronous tensors (tests compare it with the plain order).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import torch

from ..core import FinishReason, ForwardOutput, OutputSink, Req, ReqStatus, ScheduledBatch
from ..messages import ReqOutput
from ..model.parallel import TPGroupError
from .delivery import deliver
from .output import aborted_output, build_output
from .overlap import HostTokens, PinnedIds, drop_placeholder
from .processor import SampleLaunch
from .spec.drafter import Drafter, draft
from .spec.verify import Verifier, drop_draft

logger = logging.getLogger(__name__)


@dataclass
class Launched:
    """A forward launched, and then its sampling: what resolving the step needs."""

    batch: ScheduledBatch
    out: ForwardOutput
    jumped: list[int]  # each entry's num_jumped_tokens at launch: a jump-forward since invalidates the row
    prepared: bool = False  # prompt logprobs recorded (plain: before sampling; overlapped: when resolved)
    launch: SampleLaunch | None = None
    host: HostTokens | None = None  # overlapped: the ids on their way to the host
    future: torch.Tensor | None = None  # [len(launch.reqs)] int64 on the device: what placeholders stand for


@dataclass
class Resolved:
    """Steps' results applied: requests that finished, streaming requests with an output, the steps resolved."""

    finished: list[Req] = field(default_factory=list)
    streaming: list[Req] = field(default_factory=list)
    steps: list[Launched] = field(default_factory=list)  # their prompt KV is published once the finished retire


class Stepper:
    """Runs engine steps (plain or overlapped) and owns the per-request bookkeeping of retiring and emitting."""

    def __init__(self, *, scheduler, runner, kv, processor, constrained, isolation, tokenizer, stats: dict,
                 reqs: dict[str, Req], overlap: bool, max_running_requests: int, debug_invariants: bool,
                 max_context: int = 0, drafter: Drafter | None = None, verifier: Verifier | None = None):
        if drafter is not None and (overlap or verifier is None):
            raise ValueError("drafting runs in the plain step order, with a verifier")
        self.scheduler, self.runner, self.kv = scheduler, runner, kv
        self.drafter, self.verifier, self.max_context = drafter, verifier, max_context
        self.processor, self.constrained, self.isolation = processor, constrained, isolation
        self.tokenizer, self.stats, self.reqs = tokenizer, stats, reqs
        self.overlap = overlap
        self.debug_invariants = debug_invariants
        self.inflight: Launched | None = None  # overlapped: the step launched but not resolved
        self._pinned = PinnedIds(runner.device, max_running_requests + 1) if overlap else None

    @property
    def busy(self) -> bool:
        """A step is in flight (it must be resolved even when no request is waiting or running)."""
        return self.inflight is not None

    def has_work(self) -> bool:
        """Requests waiting or running, or a step to resolve."""
        return self.scheduler.has_work() or self.inflight is not None

    # ------------------------------------------------------------------ the step
    def step(self) -> bool:
        """One step in this stepper's order; False when there was nothing to do."""
        t0 = time.perf_counter()
        prev, self.inflight = self.inflight, None
        batch = self.scheduler.schedule()
        if batch is None and prev is None:
            return False
        if batch is not None and self.drafter is not None:
            batch = draft(batch, self.drafter, self.kv, self.max_context)
        res = Resolved(list(batch.aborted) if batch is not None else [])
        cur = self.launch_forward(batch, prev, res.finished) if batch is not None and batch.entries else None
        if prev is not None:
            self.resolve(prev, res)
        if cur is not None and not self.overlap:
            if self.launch_sampling(cur, res.finished):
                self.resolve(cur, res)
            cur = None
        self.retire_emit(res)
        if cur is not None and self.launch_sampling(cur, []):
            # nothing left to resolve when every row was discarded and every request has ended
            if cur.launch.reqs or any(not e.req.finished for e in cur.batch.entries):
                self.inflight = cur
        if batch is not None and batch.entries:
            self.stats["num_steps"] += 1
            self.stats["step_s"] += time.perf_counter() - t0
        if self.debug_invariants:
            self.scheduler.check_invariants()
        return True

    # ------------------------------------------------------------------ its parts
    def launch_forward(self, batch: ScheduledBatch, prev: Launched | None, finished: list[Req]) -> Launched | None:
        """Start the batch's forward (placeholder ids resolve from prev's sampled ids); None when it failed."""
        try:
            out = self.runner.forward(batch.entries, batch.num_decode, self.kv.buffers,
                                      prev.future if prev is not None else None)
        except TPGroupError:
            raise  # the group is broken: the loop ends
        except Exception as e:  # noqa: BLE001 - one bad batch must not kill the engine
            logger.exception("forward failed; aborting its requests")
            self._abort(batch.entries, e, finished)
            return None
        # overlapped only: a jump-forward between launch and sampling discards the row (launch_sampling)
        return Launched(batch, out, [e.req.num_jumped_tokens for e in batch.entries] if self.overlap else [])

    def launch_sampling(self, cur: Launched, finished: list[Req]) -> bool:
        """Sample the step's valid rows; overlapped, start the copy back and append placeholders. False: failed.

        Plain, prompt logprobs are recorded first (as the step always did); overlapped, when it is resolved."""
        entries = cur.batch.entries
        try:
            if not self.overlap:
                finished += self.processor.prepare(entries, cur.out)
                cur.prepared = True
                valid = None  # plain: nothing changed a request since its forward (finished rows are skipped)
                if any(e.draft for e in entries[cur.batch.num_decode:]):  # drafted rows: verified when resolved
                    valid = [not e.draft for e in entries]
            else:  # a request that finished or jumped since its forward was launched has its row discarded
                # (Req.finished and Req.seq_len inlined: this runs over every row every step)
                valid = [(r := e.req).finish_reason is None
                         and len(r.input_ids) + len(r.output_ids) == e.prefix_len + e.extend_len
                         and r.num_jumped_tokens == jumped for e, jumped in zip(entries, cur.jumped)]
            cur.launch = launch = self.processor.launch(entries, cur.out, valid)
            if self.overlap and launch.reqs:
                self._start_readback(cur)
            return True
        except TPGroupError:
            raise
        except Exception as e:  # noqa: BLE001
            logger.exception("sampling failed; aborting its requests")
            aborted: list[Req] = []
            self._abort(entries, e, aborted)
            if self.overlap:  # after this step's retire/emit: they end now
                self.retire_emit(Resolved(aborted))
            else:
                finished += aborted
            return False

    def _start_readback(self, cur: Launched) -> None:
        launch = cur.launch
        if isinstance(launch.tokens, list):  # a row-by-row retry after a failure: None rows failed
            ids = launch.tokens
            future = torch.tensor([t if t is not None else 0 for t in ids], dtype=torch.int64,
                                  device=self.runner.device)
        else:
            ids, future = None, launch.tokens
        cur.future = future
        cur.host = HostTokens(future, self._pinned.next() if self._pinned is not None else None)
        for j, r in enumerate(launch.reqs):  # row j's placeholder id is -1 - j (engine/overlap.py)
            if r.finish_reason is None and (ids is None or ids[j] is not None):
                r.output_ids.append(-1 - j)

    def resolve(self, s: Launched, res: Resolved) -> None:
        """Apply a step's sampled ids: logprobs, grammar advance, stop rules, detokenization, jump-forward."""
        entries = s.batch.entries
        try:
            launch = s.launch
            if s.host is not None:
                tokens = s.host.wait()
                for j, r in enumerate(launch.reqs):
                    out = r.output_ids
                    if out and out[-1] == -1 - j:
                        out.pop()  # the real id is appended by complete(), through the normal path
            else:
                tokens = launch.host_tokens() if launch is not None else []
            if not s.prepared:
                res.finished += self.processor.prepare(entries, s.out)
            if launch is not None:
                res.finished += self.processor.complete(launch, tokens)
            if self.drafter is not None and any(e.draft for e in entries[s.batch.num_decode:]):
                res.finished += self.verifier.verify(entries, s.out, self.drafter)
            # jump-forward right after a sampled token. Overlapped, only over the rows just appended: a request
            # whose row was discarded has just jumped, and its jumped tokens are being extended now
            jump = launch.reqs if self.overlap and launch is not None else [e.req for e in entries]
            res.finished += self.constrained.jump_forward(jump, self.kv)
        except TPGroupError:
            raise
        except Exception as e:  # noqa: BLE001
            logger.exception("resolving a step failed; aborting its requests")
            self._abort(entries, e, res.finished)
        res.steps.append(s)
        res.streaming += [e.req for e in entries
                          if e.req.stream and e.prefix_len + e.extend_len >= len(e.req.input_ids)]

    def _publish(self, s: Launched) -> None:
        """Publish the prompt KV this step's extend entries computed, so waiting requests can share it.

        Only the KV the entry computed (overlapped, a slot is already taken for the next token), never a key
        holding an unresolved id; output KV stays request-owned so jump-forward can roll it back."""
        for e in s.batch.entries[s.batch.num_decode:]:
            r = e.req
            end = e.prefix_len + e.extend_len
            if not r.finished and e.prefix_len < len(r.input_ids) and min(r.all_ids[:end], default=0) >= 0:
                self.scheduler.cache_unfinished(r, end)

    def _abort(self, entries, exc: Exception, finished: list[Req]) -> None:
        for entry in entries:
            r = entry.req
            if entry.draft:
                drop_draft(r, self.kv)
            if not r.finished:
                drop_placeholder(r, self.kv)
                r.finish_reason = FinishReason("abort", message=f"internal error: {exc}")
                finished.append(r)

    # ------------------------------------------------------------------ retire / emit
    def retire_emit(self, res: Resolved) -> None:
        """Finished requests leave, the resolved steps' prompt KV is published, then one StepOutputs per sink
        (finals, and streaming requests' progress)."""
        done = self.retire(res.finished)
        for s in res.steps:
            self._publish(s)
        self.emit(done + [r for r in res.streaming if not r.finished])

    def retire(self, reqs: list[Req]) -> list[Req]:
        """Finished requests leave the scheduler (their KV goes to the cache) and are counted."""
        stats = self.stats
        for r in reqs:
            drop_placeholder(r, self.kv)  # overlapped: an id still in flight is not part of the output
            self.scheduler.remove(r)
            if r.spec is not None and self.drafter is not None:
                self.drafter.release(r)  # a draft model's KV for the request goes to its cache
            self.reqs.pop(r.rid, None)
            if r.finish_reason.type == "abort":
                stats["num_aborted"] += 1
            stats["prompt_tokens"] += len(r.input_ids)
            stats["generation_tokens"] += len(r.output_ids)
            stats["cached_tokens"] += r.cached_tokens
        return reqs

    def emit(self, reqs: list[Req]) -> None:
        """One StepOutputs per sink with the outputs of `reqs` (final ones included)."""
        by_sink: dict[int, tuple[OutputSink, list]] = {}
        for r in reqs:
            if r.sink is not None:
                by_sink.setdefault(id(r.sink), (r.sink, []))[1].append(self._output(r))
        for sink, outs in by_sink.values():
            deliver(sink, outs)

    def _output(self, r: Req) -> ReqOutput:
        """The request's output; if shaping it fails, it ends (alone) with a final abort output."""
        try:
            self.isolation.probe("output", r)
            return build_output(r, self.tokenizer)
        except Exception as e:  # noqa: BLE001 - isolated: this request alone ends
            self.isolation.fail(r, "output", e)
            if r.status is not ReqStatus.FINISHED:
                self.retire([r])
            return aborted_output(r.rid, len(r.input_ids), r.finish_reason.message)


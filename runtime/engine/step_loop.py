"""The Engine's loop (its loop thread only): inbox messages in, admission, one step at a time, outputs out.

The Engine (engine/engine.py) builds the parts on the loop thread and holds an `EngineLoop`; the loop reads
nothing of the Engine but what it is given here.
"""

from __future__ import annotations

import logging
import queue
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable

from ..core import FinishReason, Req
from ..messages import AbortReq, FlushCacheReq, GetServerInfoReq, ShutdownReq
from ..model.parallel import TPGroupError
from .admission import Admission, GuideReady, SubmitMsg
from .step import Resolved, Stepper

logger = logging.getLogger(__name__)


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


class EngineLoop:
    """Messages in, admission, one scheduling round per step (Stepper), outputs out."""

    def __init__(self, stepper: Stepper, admission: Admission, inbox: queue.Queue,
                 answer: Callable[[FlushCacheReq | GetServerInfoReq], object]):
        self.stepper, self.admission, self.inbox, self._answer = stepper, admission, inbox, answer
        self.progress = Progress()
        self.failure: str | None = None  # why the loop stopped serving (a tensor-parallel rank failed)

    def has_work(self) -> bool:
        """Requests waiting or running, a step in flight, or a request waiting for its compile."""
        return self.stepper.has_work() or self.admission.busy

    def admit(self, req: Req) -> None:
        """A request with its guide enters the scheduler (Admission calls this on the loop thread)."""
        self.stepper.reqs[req.rid] = req
        self.stepper.stats["num_requests"] += 1
        self.stepper.scheduler.add(req)

    def run(self) -> str | None:
        """Serve until shutdown (None) or a broken tensor-parallel group (its message)."""
        prog = self.progress
        while True:
            # a request waiting only for its compile is woken by the inbox (GuideReady): block
            block = not self.stepper.has_work()
            prog.idle = block
            try:
                msg = self.inbox.get(block=block)
            except queue.Empty:
                msg = None
            if block:
                prog.idle, prog.last = False, time.monotonic()  # waiting for work is not a stall
            while msg is not None:
                if isinstance(msg, ShutdownReq):
                    self.abort_all("engine shut down")
                    return None
                self.handle(msg)
                try:
                    msg = self.inbox.get_nowait()
                except queue.Empty:
                    msg = None
            try:
                stepped = self.stepper.has_work() and self.stepper.step()
            except TPGroupError as e:  # a rank is gone: nothing can run any more; fail loudly, never hang
                self.failure = str(e)
                logger.error("%s; the engine stops", e)
                self.abort_all(f"engine failed: {e}")
                return self.failure
            if stepped:
                prog.steps += 1
                prog.last = time.monotonic()

    def handle(self, msg) -> None:
        """One inbox message (loop thread)."""
        if isinstance(msg, SubmitMsg):
            self.admission.submit(msg)
        elif isinstance(msg, GuideReady):
            self.admission.ready(msg.rid)
        elif isinstance(msg, AbortReq):
            if self.admission.abort(msg.rid):
                return
            req = self.stepper.reqs.get(msg.rid)
            if req is not None and not req.finished:
                req.finish_reason = FinishReason("abort", message="aborted by the client")
                self.stepper.retire_emit(Resolved([req]))
        elif isinstance(msg, CallMsg):
            try:
                msg.reply.set_result(self._answer(msg.request))
            except Exception as e:  # noqa: BLE001 - delivered to the caller
                msg.reply.set_exception(e)
        else:
            raise TypeError(f"unexpected inbox message {type(msg).__name__}")

    def abort_all(self, message: str) -> None:
        """End every request: compiling, waiting and running."""
        self.admission.abort_all(message)
        sched = self.stepper.scheduler
        reqs = list(sched.waiting) + list(sched.running)
        for r in reqs:
            r.finish_reason = FinishReason("abort", message=message)
        self.stepper.retire_emit(Resolved(reqs))

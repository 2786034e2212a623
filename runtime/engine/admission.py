"""Admission: a submitted request enters the scheduler once its constraint compile is done, on the loop thread.

`Engine.submit` never waits: it queues the built request, and the loop admits it here when its guide is ready
(at once when it has none or the compile is done; otherwise when the compile's Future completes, which wakes the
loop through the inbox). Aborting a request while it compiles is handled here alone: `cancel` (any thread) stops
the compile of a request built but not admitted yet, and a request whose compile was cancelled or failed ends
with one final abort output instead of entering the scheduler (a failed one is reported to the submitter's
on_error instead, where it gave one: the server answers 400).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from dataclasses import dataclass
from typing import Callable

from ..core import OutputSink, Req
from ..messages import GenerateReq
from .delivery import deliver
from .output import aborted_output

logger = logging.getLogger(__name__)

CANCELLED = "aborted by the client while its constraint compiled"


@dataclass(frozen=True)
class SubmitMsg:
    """Inbox item: a built request (its guide may still be compiling) and where its outputs go.

    on_error, when given, is told of a failed compile (a GrammarError: the request's own constraint) instead of
    the sink getting a final abort output, so that a server can answer 400 as for any other bad input."""

    req: GenerateReq
    sink: OutputSink
    on_error: Callable[[Exception], None] | None = None


class BuildWindow:
    """Requests between their arrival and their submit (built off the receiving thread, e.g. the engine process's
    pool): an abort that arrives meanwhile is kept here and ends the request at submit instead of being lost."""

    def __init__(self):
        self._lock = threading.Lock()
        self._open: dict[str, bool] = {}  # rid -> aborted while building

    @property
    def building(self) -> bool:
        """Some request is still being built."""
        return bool(self._open)

    def open(self, rid: str) -> None:
        """`rid` arrived; its build starts (call before handing it to the building thread)."""
        with self._lock:
            self._open[rid] = False

    def abort(self, rid: str) -> bool:
        """Mark `rid` aborted if it is still being built (True); False when it was submitted (or is unknown)."""
        with self._lock:
            if rid not in self._open:
                return False
            self._open[rid] = True
            return True

    def close(self, rid: str, submit: Callable[[], None] | None = None) -> bool:
        """`rid` is built (or failed): run `submit` unless it was aborted meanwhile; True when it was aborted.

        submit runs under the window's lock, so an abort arriving now queues behind the submitted request."""
        with self._lock:
            aborted = self._open.pop(rid, False)
            if not aborted and submit is not None:
                submit()
        return aborted


@dataclass(frozen=True)
class GuideReady:
    """Inbox item: the constraint compile of a submitted request finished (done, failed or cancelled)."""

    rid: str


class Admission:
    """Requests waiting for their guide; they reach the scheduler through `admit` on the loop thread only."""

    def __init__(self, make_req: Callable[[GenerateReq, OutputSink, object], Req], admit: Callable[[Req], None],
                 wake: Callable[[object], None]):
        self._make_req, self._admit, self._wake = make_req, admit, wake
        self._compiling: dict[str, concurrent.futures.Future] = {}  # built, compiling, any thread may cancel
        self._lock = threading.Lock()
        self.pending: dict[str, SubmitMsg] = {}  # submitted, compiling (loop thread only)

    # ------------------------------------------------------------------ any thread
    def track(self, req: GenerateReq) -> None:
        """A request was built and its compile runs: `cancel(rid)` stops it until it is done."""
        fut = req.guide
        if fut is None or fut.done():
            return
        with self._lock:
            self._compiling[req.rid] = fut
        fut.add_done_callback(lambda f, rid=req.rid: self._untrack(rid, f))

    def _untrack(self, rid: str, fut) -> None:
        with self._lock:
            if self._compiling.get(rid) is fut:
                del self._compiling[rid]

    def cancel(self, rid: str) -> None:
        """Stop the compile of `rid` if it still runs (its request then ends with an abort output)."""
        with self._lock:
            fut = self._compiling.pop(rid, None)
        if fut is not None:
            fut.cancel()

    def cancel_all(self) -> None:
        """Stop every compile still running (shutdown)."""
        with self._lock:
            futs, self._compiling = list(self._compiling.values()), {}
        for f in futs:
            f.cancel()

    # ------------------------------------------------------------------ loop thread
    @property
    def busy(self) -> bool:
        """Some submitted request still waits for its compile."""
        return bool(self.pending)

    def submit(self, msg: SubmitMsg) -> None:
        """Admit now when the guide is ready; otherwise when its compile completes (GuideReady)."""
        fut = msg.req.guide
        if fut is None or fut.done():
            self._finish(msg)
            return
        self.pending[msg.req.rid] = msg
        fut.add_done_callback(lambda f, rid=msg.req.rid: self._wake(GuideReady(rid)))

    def ready(self, rid: str) -> None:
        """A compile completed: admit its request (unless it was aborted meanwhile)."""
        msg = self.pending.pop(rid, None)
        if msg is not None:
            self._finish(msg)

    def abort(self, rid: str, message: str = CANCELLED) -> bool:
        """End a request still waiting for its compile (the compile stops); False when `rid` is not waiting."""
        msg = self.pending.pop(rid, None)
        if msg is None:
            return False
        msg.req.guide.cancel()
        self._final(msg, message)
        return True

    def abort_all(self, message: str) -> None:
        """End every request still waiting for its compile."""
        for rid in list(self.pending):
            self.abort(rid, message)

    def _finish(self, msg: SubmitMsg) -> None:
        fut = msg.req.guide
        guide = None
        if fut is not None:
            try:
                guide = fut.result()
            except concurrent.futures.CancelledError:
                self._final(msg, CANCELLED)
                return
            except Exception as e:  # noqa: BLE001 - the request's own constraint failed: it alone ends
                self._fail(msg, e)
                return
        try:
            req = self._make_req(msg.req, msg.sink, guide)
        except ValueError as e:  # it names what is gone since it was built (a LoRA adapter unloaded meanwhile)
            self._fail(msg, e)
            return
        self._admit(req)

    def _fail(self, msg: SubmitMsg, e: Exception) -> None:
        """End a request that cannot be admitted: through on_error when given, else one final abort output."""
        if msg.on_error is None:
            self._final(msg, str(e))
            return
        try:
            msg.on_error(e)
        except Exception:  # noqa: BLE001 - a broken consumer must not stop the loop
            logger.exception("reporting the failure of %s failed", msg.req.rid)

    @staticmethod
    def _final(msg: SubmitMsg, message: str) -> None:
        deliver(msg.sink, [aborted_output(msg.req.rid, len(msg.req.input_ids), message)])

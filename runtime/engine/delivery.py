"""In-process output delivery: sinks that hand the engine's per-step outputs to blocking, streaming and asyncio callers.

The engine calls a sink from its step-loop thread once per step with that step's outputs for it
(StepOutputs); these sinks move them to the caller's thread (a Future, a queue, or an event loop).
"""

from __future__ import annotations

import asyncio
import logging
import queue
from concurrent.futures import Future
from typing import Callable

from ..messages import ReqOutput, StepOutputs

logger = logging.getLogger(__name__)


def deliver(sink: Callable[[StepOutputs], None], outs: list[ReqOutput]) -> None:
    """Hand one step's outputs to a sink (engine loop thread); a broken consumer must not stop the loop."""
    try:
        sink(StepOutputs(outs))
    except Exception:  # noqa: BLE001
        logger.exception("output sink failed for %d request(s)", len(outs))


class BatchWaiter:
    """Sink for non-streaming requests: collects each request's final output; `futures[i]` resolves to it."""

    def __init__(self, rids: list[str]):
        self.futures: dict[str, Future] = {rid: Future() for rid in rids}

    def __call__(self, step: StepOutputs) -> None:
        for out in step.outputs:
            fut = self.futures.get(out.rid)
            if out.finished and fut is not None and not fut.done():
                fut.set_result(out.to_json())

    def fail(self, rid: str) -> Callable[[Exception], None]:
        """submit's on_error for `rid`: its result raises the error (a failed constraint compile)."""
        return lambda e: self.futures[rid].set_exception(e)

    def results(self, rids: list[str]) -> list[dict]:
        """Block until every request finished; outputs in the order of `rids` (a failed one raises)."""
        return [self.futures[rid].result() for rid in rids]


class StreamQueue:
    """Sink for one streaming request read from a plain thread."""

    def __init__(self):
        self.queue: queue.Queue[ReqOutput | Exception] = queue.Queue()

    def __call__(self, step: StepOutputs) -> None:
        for out in step.outputs:
            self.queue.put(out)

    def fail(self, e: Exception) -> None:
        """submit's on_error: the reader's next get raises `e`."""
        self.queue.put(e)

    def get(self) -> ReqOutput:
        """The next output (blocks); raises the request's error."""
        out = self.queue.get()
        if isinstance(out, Exception):
            raise out
        return out


class AsyncSink:
    """Sink for asyncio callers: outputs reach the event loop's queue (thread-safe hand-off)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.queue: asyncio.Queue[ReqOutput | Exception] = asyncio.Queue()

    def __call__(self, step: StepOutputs) -> None:
        self.loop.call_soon_threadsafe(self._put_all, step.outputs)

    def fail(self, e: Exception) -> None:
        """submit's on_error: the reader's next get raises `e`."""
        self.loop.call_soon_threadsafe(self.queue.put_nowait, e)

    async def get(self) -> ReqOutput:
        """The next output; raises the request's error."""
        out = await self.queue.get()
        if isinstance(out, Exception):
            raise out
        return out

    def _put_all(self, outputs: list[ReqOutput]) -> None:
        for out in outputs:
            self.queue.put_nowait(out)

"""Per-request failure isolation in the step loop: a phase that raises for one request aborts that request alone.

Every per-request phase after a forward (input logprobs, grammar mask, sampling, output logprobs, grammar
advance, stop checks, detokenization, stop strings / stop_regex, jump-forward, output shaping) catches its
exceptions per request and calls `Isolation.fail`; batched phases (mask + sampling, logprobs) are tried
for the whole batch first and, only if that raises, redone row by row so the culprit is found and the
rest of the batch goes on.
`hook(phase, req)`, when set, is called at each phase for each request: tests inject a fault for one rid.
"""

from __future__ import annotations

import logging
from typing import Callable

from ..core import FinishReason, Req

logger = logging.getLogger(__name__)

FaultHook = Callable[[str, Req], None]

PHASES = ("input logprobs", "grammar mask", "sampling", "output logprobs", "grammar advance", "stop check",
          "detokenize", "stop string", "jump-forward", "output")


class Isolation:
    """Turns an exception in one request's phase into that request's abort; counts failures per phase."""

    def __init__(self):
        self.hook: FaultHook | None = None
        self.failures: dict[str, int] = {}

    def probe(self, phase: str, req: Req) -> None:
        """Call the fault hook (tests); a no-op in production."""
        if self.hook is not None:
            self.hook(phase, req)

    def fail(self, req: Req, phase: str, exc: BaseException) -> None:
        """Abort `req` alone with an error naming the phase (logged with the traceback)."""
        logger.error("request %s failed in %s (%s: %s); aborting it alone", req.rid, phase, type(exc).__name__, exc,
                     exc_info=(type(exc), exc, exc.__traceback__))
        self.failures[phase] = self.failures.get(phase, 0) + 1
        req.finish_reason = FinishReason("abort", message=f"internal error in {phase}: {type(exc).__name__}: {exc}")

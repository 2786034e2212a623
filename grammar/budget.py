"""CompileBudget: the time / state / cancellation limits one compile runs under, checked inside hot loops."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from .errors import BudgetExceeded, CompileCancelled

_CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
# One compile's budget, the same on every path (GrammarCompiler, the engine's compile workers and its thread
# mode, so one constraint gets one answer): seconds of the compiling thread's CPU time, so a loaded box does
# not refuse a compile that merely got little CPU. The engine bounds wall time separately (grammar_service.py).
COMPILE_TIME_S = 5.0
COMPILE_CLOCK = "cpu"


@dataclass
class CompileBudget:
    """Limits for one compile. `check(what)` raises once the deadline passed or `cancel.is_set()`.

    time_s: seconds from creation (None = no deadline) on `clock`: "wall" (perf_counter) or "cpu" (this thread's
    CPU time, so a loaded box does not refuse a compile that got little CPU; whoever runs it must bound its wall
    time, as the engine's compile workers do); max_states: cap on any one automaton;
    cancel: any object with `is_set()` (threading.Event, multiprocessing.Event) to stop the compile early;
    native: the native automata kernel the constructions use (sglpy.kernels.automata.NativeAutomata: subset
    construction, trim, minimisation) or None (the Python constructions, the reference).
    """

    time_s: float | None = COMPILE_TIME_S
    max_states: int = 20_000
    cancel: Any = None
    clock: str = COMPILE_CLOCK
    native: Any = None
    started: float = -1.0  # set from `clock` at creation

    def __post_init__(self):
        if self.clock not in _CLOCKS:
            raise ValueError(f"clock must be one of {sorted(_CLOCKS)}, got {self.clock!r}")
        if self.started < 0:
            self.started = self.now()
        if self.time_s is not None and not self.time_s > 0:
            raise ValueError(f"time_s must be > 0 or None, got {self.time_s!r}")
        if self.max_states < 2:
            raise ValueError(f"max_states must be >= 2, got {self.max_states}")
        if self.cancel is not None and not callable(getattr(self.cancel, "is_set", None)):
            raise ValueError("cancel must have an is_set() method (threading.Event or similar)")

    def now(self) -> float:
        """The current reading of this budget's clock (compare with `deadline`)."""
        return _CLOCKS[self.clock]()

    @property
    def deadline(self) -> float | None:
        return None if self.time_s is None else self.started + self.time_s

    def check(self, what: str) -> None:
        """Raise CompileCancelled / GrammarError naming `what` if cancelled or past the deadline."""
        if self.cancel is not None and self.cancel.is_set():
            raise CompileCancelled(f"compile cancelled while building {what}")
        if self.time_s is not None and self.now() - self.started > self.time_s:
            raise BudgetExceeded(f"compile time budget ({self.time_s:g} s) exceeded while building {what}")


"""Load shedding by expected wait: a generation the engine cannot start finishing in time is refused at once
(503 + Retry-After), instead of joining a backlog that keeps every client waiting for minutes.

Continuous batching runs every admitted generation together, so on a slow machine each one waits for the whole
batch: 64 closed-loop clients on 2 busy cores each waited 70-120 s. Little's law gives the wait a new generation
would see: with N generations in flight and X finished per second of busy engine time (measured over the last
WINDOW_S seconds), it is about (N + n) / X. Past `max_wait` (--max-queue-wait) the gate refuses, with a
Retry-After of about one completion interval (1 / X, 1-30 s). While the window holds no completion, the rate is
not known and everything is admitted (a burst after an idle spell) until the engine has been busy max_wait
seconds since its last completion; then it admits only FLOOR generations (they are always admitted, so a
server running only long generations still takes new ones) until something finishes. The rate follows the load: admitting more
raises X while batching pays, so the admitted count settles where the expected wait is max_wait.
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Callable

WINDOW_S = 30.0  # completions and busy time counted over this many recent seconds
FLOOR = 8  # generations always admitted, whatever the measured rate


class BacklogGate:
    """Counts busy time and completions; `refusal` says why a new generation would wait too long (or None)."""

    def __init__(self, max_wait: float, clock: Callable[[], float] = time.monotonic):
        self.max_wait = max_wait  # 0: never refuse
        self._clock = clock
        self._buckets: collections.deque = collections.deque()  # [second, busy seconds, completions]
        self._at: float | None = None  # the last update
        self._inflight = 0  # in flight since the last update
        self._busy_since_done = 0.0  # busy seconds since the last completion (not windowed)

    def _advance(self, inflight: int) -> float:
        now = self._clock()
        second = math.floor(now)
        if not self._buckets or self._buckets[-1][0] != second:
            self._buckets.append([second, 0.0, 0])
        if self._at is not None and self._inflight > 0:
            self._buckets[-1][1] += now - self._at
            self._busy_since_done += now - self._at
        while self._buckets and self._buckets[0][0] < now - WINDOW_S:
            self._buckets.popleft()
        self._at, self._inflight = now, inflight
        return now

    def changed(self, inflight: int) -> None:
        """The number in flight changed (a generation registered, or all dropped when the engine died)."""
        self._advance(inflight)

    def finished(self, inflight: int) -> None:
        """A generation finished; `inflight` is the number left."""
        self._advance(inflight)
        self._buckets[-1][2] += 1
        self._busy_since_done = 0.0

    def rate(self) -> float | None:
        """Generations finished per busy second over the window; None while that is not known (no completion in
        the window, and less than max_wait busy seconds since the last one), 0.0 when nothing finished for longer."""
        busy = sum(b[1] for b in self._buckets)
        done = sum(b[2] for b in self._buckets)
        if done == 0:
            return 0.0 if self._busy_since_done >= self.max_wait else None
        return done / busy

    def refusal(self, inflight: int, n: int) -> tuple[str, int] | None:
        """(message, retry-after seconds) when `n` more generations would wait longer than max_wait, else None."""
        if not self.max_wait or inflight + n <= FLOOR:
            return None
        self._advance(inflight)
        x = self.rate()
        if x is None:
            return None
        wait = (inflight + n) / x if x > 0 else math.inf
        if wait <= self.max_wait:
            return None
        retry = min(30, max(1, math.ceil(self.max_wait / 4 if x <= 0 else 1 / x)))
        expect = "nothing finished" if x <= 0 else f"{x:.2f} generations finish per second"
        return (f"server overloaded: {inflight} generations in flight and {expect} over the last "
                f"{WINDOW_S:.0f} s, so this request would wait about {wait:.0f} s (--max-queue-wait "
                f"{self.max_wait:g} s); retry later", retry)

"""Whether a draft model's drafting pays on this machine, from the step rates it measures (STANDALONE).

A draft model pays only when k of its forwards plus one verify step cost less than the plain steps they replace:
an int4 draft of a 135M model drafting for the same model in int8 costs nearly a target step per forward (host
work and attention do not shrink with the weights) and ran 0.59-0.72x, while against the float32 target it ran
1.45-1.65x (benchmarks/README.md). The gate measures both rates on the running batch and drafts only while drafting
is the faster one:
- a sample is one step: output tokens the step's decoding requests gained over the time from its schedule to the
  next one (draft forwards, target forward, verification, emit); samples are kept only while the same requests
  decode in consecutive steps (a new request's prefill or a finish starts over);
- each mode's rate is an exponential average of its samples; the mode not in use is probed now and then, so a
  change of batch or workload is seen: `probe_every` steps after a change of decision, twice as long after each
  probe that left the decision as it was (up to `max_probe_every`), since a probe costs (a drafting probe first
  extends the draft KV over every token decoded without it);
- drafting goes on while its rate is at least `margin` of the plain rate (or either is not measured yet).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

EMA = 0.3  # weight of a new sample in a mode's average rate


@dataclass
class CostGate:
    """Drafting on or off from measured tokens per second with and without drafts."""

    probe_every: int = 32  # steps between probes of the mode not in use, after a change of decision
    max_probe_every: int = 512  # the longest interval, reached while the decision holds
    margin: float = 0.97  # draft while its rate >= margin * the plain rate
    clock: Callable[[], float] = time.perf_counter  # StandaloneDrafter passes the loop thread's CPU time on CPU
    rate: dict = field(default_factory=lambda: {True: None, False: None})  # drafting? -> tokens/s average
    _last: tuple | None = None  # (time, request ids, their token count, drafted) at the previous step
    _steps: int = 0
    _interval: int = 0  # steps between probes now
    _next_probe: int = 0
    _decision: bool | None = None  # the last decision taken on the rates (not a probe)
    stats: dict = field(default_factory=lambda: {"spec_gate_off_steps": 0, "spec_gate_probes": 0})

    def decide(self, reqs: list, tokens: int) -> bool:
        """Called at each step's schedule with its decoding requests and their output tokens so far: record the
        previous step's sample, then whether this step drafts."""
        now = self.clock()
        key = tuple(id(r) for r in reqs)
        # only the same requests decoding in consecutive steps, gaining tokens (a jump-forward rewrite can shrink)
        if self._last is not None and self._last[1] == key and now > self._last[0] and tokens >= self._last[2]:
            sample = (tokens - self._last[2]) / (now - self._last[0])
            old = self.rate[self._last[3]]
            self.rate[self._last[3]] = sample if old is None else (1 - EMA) * old + EMA * sample
        self._steps += 1
        on, off = self.rate[True], self.rate[False]
        if on is None:
            draft = True
        elif off is None:
            draft = self._steps % 4 != 0  # a first plain sample soon
        else:
            draft = on >= self.margin * off
            if draft != self._decision:  # the rates changed the decision: look again soon
                self._decision, self._interval = draft, self.probe_every
                self._next_probe = self._steps + self._interval
            elif self._steps >= self._next_probe:
                draft = not draft
                self.stats["spec_gate_probes"] += 1
                self._interval = min(2 * self._interval, self.max_probe_every)
                self._next_probe = self._steps + self._interval
        if not draft:
            self.stats["spec_gate_off_steps"] += 1
        self._last = (now, key, tokens, draft)
        return draft

    def drafted(self, any_draft: bool) -> None:
        """What the step did: a step allowed to draft where no request drafted (all paused) is a plain sample."""
        if self._last is not None and self._last[3] and not any_draft:
            self._last = self._last[:3] + (False,)

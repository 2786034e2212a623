"""Load shedding by expected wait (runtime/server/backlog.py): the gate's arithmetic on a fake clock, and a slow
fake engine under more closed-loop clients than it can serve in time: fast 503s with Retry-After, no long waits."""

import concurrent.futures
import time

from sglpy.runtime.server.backlog import FLOOR, WINDOW_S, BacklogGate
from sglpy.runtime.testing.server_harness import FAKE, run_server


class Clock:
    def __init__(self):
        self.t = 1000.0

    def __call__(self):
        return self.t


def test_nothing_is_refused_before_the_rate_is_known_and_the_floor_always_passes():
    clock = Clock()
    gate = BacklogGate(10.0, clock)
    assert gate.refusal(0, 50) is None  # nothing measured yet: a burst after an idle spell is admitted
    gate.changed(50)
    clock.t += 9.0
    assert gate.refusal(50, 1) is None  # busy for 9 s, nothing finished yet: not known
    clock.t += 2.0
    msg, retry = gate.refusal(50, 1)  # busy for 11 s > 10 s and nothing finished
    assert "nothing finished" in msg and retry == 3
    assert gate.refusal(FLOOR - 1, 1) is None  # the floor
    clock.t += WINDOW_S * 3  # still busy, nothing finished: still refused (not forgotten with the window)
    assert "nothing finished" in gate.refusal(50, 1)[0]
    gate.finished(49)
    assert gate.refusal(50, 1) is not None  # one in 3 windows of busy time: 0.03 per second
    assert BacklogGate(0.0, clock).refusal(1000, 1) is None  # 0: off


def test_the_gate_admits_what_finishes_within_the_wait():
    clock = Clock()
    gate = BacklogGate(10.0, clock)
    gate.changed(FLOOR)
    for _ in range(12):  # one generation finishes per busy second, 8 in flight throughout
        clock.t += 1.0
        gate.finished(FLOOR - 1)
        gate.changed(FLOOR)
    assert abs(gate.rate() - 1.0) < 1e-9
    assert gate.refusal(FLOOR, 1) is None  # 9 / 1.0 = 9 s <= 10 s
    msg, retry = gate.refusal(FLOOR + 2, 1)  # 11 s
    assert "would wait about 11 s" in msg and "1.00 generations finish per second" in msg and retry == 1


def test_the_rate_forgets_what_is_older_than_the_window_and_idle_time_does_not_count():
    clock = Clock()
    gate = BacklogGate(10.0, clock)
    gate.changed(1)
    clock.t += 1.0
    gate.finished(0)  # 1 per busy second
    clock.t += 20.0  # idle: not busy time
    gate.changed(1)
    clock.t += 3.0
    gate.finished(0)
    assert gate.rate() == 0.5  # 2 finished in 4 busy seconds
    clock.t += WINDOW_S + 2
    gate.changed(0)
    assert gate.rate() is None  # all of it left the window


def test_a_slow_engine_sheds_load_with_fast_503s_instead_of_long_waits():
    # a step takes 0.05 s + 0.01 s per running request: 24 closed-loop clients of 20 tokens each would all wait
    # 20 x 0.29 = 5.8 s; with --max-queue-wait 3 the server admits what it can finish in ~3 s (about 10 at once)
    env = {"SGLPY_FAKE_TOKEN_DELAY": "0.05", "SGLPY_FAKE_ROW_DELAY": "0.01"}
    with run_server("--engine-factory", FAKE, "--max-queue-wait", "3", "--no-log-requests", env=env) as s:
        stop = time.monotonic() + 10

        def client(i):
            out = []
            while time.monotonic() < stop:
                t0 = time.monotonic()
                r = s.post("/generate", {"text": f"c{i}", "sampling_params": {"max_new_tokens": 20}}, timeout=60)
                out.append((r.status_code, time.monotonic() - t0, r.headers.get("Retry-After"), r.text[:200]))
                if r.status_code == 503:
                    time.sleep(float(r.headers["Retry-After"]) / 4)
            return out

        with concurrent.futures.ThreadPoolExecutor(24) as pool:
            got = [x for xs in pool.map(client, range(24)) for x in xs]
    ok = [x for x in got if x[0] == 200]
    refused = [x for x in got if x[0] == 503]
    assert ok and refused, got[:5]
    assert {x[0] for x in got} == {200, 503}, got
    assert all(x[2] and "would wait about" in x[3] or "nothing finished" in x[3] for x in refused), refused[:3]
    assert max(x[1] for x in refused) < 1.0  # refused at once
    assert max(x[1] for x in ok) < 3 * 3  # admitted ones are not stuck behind a backlog

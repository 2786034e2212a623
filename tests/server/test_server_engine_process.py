"""The engine-process side in one process: typed messages in, one pipe message per engine step out."""

import threading
import time

import pytest

from sglpy.runtime.messages import (AbortReq, Call, CallResult, DetokenizeReq, Failed, FlushCacheReq, GenerateReqInput,
                                    ShutdownReq, StepOutputs, TokenizeReq)
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.server.engine_process import EngineProcess, PipeSender
from sglpy.runtime.testing.fake_engine import FakeEngine


class FakeConn:
    """Stands in for the engine -> server pipe end: records what is sent."""

    def __init__(self):
        self.sent = []
        self.lock = threading.Lock()

    def send(self, msg):
        with self.lock:
            self.sent.append(msg)

    def of(self, kind):
        with self.lock:
            return [m for m in self.sent if isinstance(m, kind)]


@pytest.fixture
def proc():
    engine = FakeEngine()
    engine.token_delay = 0.002
    conn = FakeConn()
    p = EngineProcess(engine, PipeSender(conn))
    yield p, conn
    p.close()
    engine.shutdown()


def _wait(cond, timeout=30.0):
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def _finished(conn):
    return {o.rid: o for s in conn.of(StepOutputs) for o in s.outputs if o.finished}


def test_outputs_of_one_step_travel_in_one_message(proc):
    p, conn = proc
    sp = SamplingParams(max_new_tokens=5)
    for i in range(4):
        assert p.handle(GenerateReqInput(rid=f"r{i}", text=f"hello {i}", sampling=sp, stream=True))
    _wait(lambda: len(_finished(conn)) == 4)
    steps = conn.of(StepOutputs)
    assert max(len(s.outputs) for s in steps) == 4  # four requests, one message per step
    assert len(steps) < 4 * 5  # not one message per request per token
    assert all(o.meta_info["completion_tokens"] == 5 for o in _finished(conn).values())


def test_bad_requests_fail_with_400_and_crashes_with_500(proc):
    p, conn = proc
    p.handle(GenerateReqInput(rid="long", text="x" * 5000))
    p.handle(GenerateReqInput(rid="crash", text="__crash__"))
    _wait(lambda: len(conn.of(Failed)) == 2)
    failed = {f.rid: f for f in conn.of(Failed)}
    assert failed["long"].status == 400 and "context" in failed["long"].message
    assert failed["crash"].status == 500 and "crashed on purpose" in failed["crash"].message


def test_an_abort_racing_the_build_still_ends_the_request(proc):
    p, conn = proc
    started = threading.Event()
    release = threading.Event()
    build = p.engine.build_request

    def slow_build(inp):
        started.set()
        release.wait(10)  # e.g. a long grammar compile
        return build(inp)

    p.engine.build_request = slow_build
    p.handle(GenerateReqInput(rid="early", text="hi", sampling=SamplingParams(max_new_tokens=500), stream=True))
    assert started.wait(10)
    p.handle(AbortReq("early"))  # arrives while the request is still being built
    release.set()
    _wait(lambda: "early" in _finished(conn))
    assert _finished(conn)["early"].meta_info["finish_reason"]["type"] == "abort"
    _wait(lambda: p.engine.get_server_info()["num_running_reqs"] == 0)


def test_typed_calls_get_typed_answers(proc):
    p, conn = proc
    p.handle(Call(1, TokenizeReq(["ab"])))
    p.handle(Call(2, DetokenizeReq([10**6])))
    p.handle(Call(3, FlushCacheReq()))
    _wait(lambda: len(conn.of(CallResult)) == 3)
    results = {r.call_id: r for r in conn.of(CallResult)}
    assert results[1].value == [[ord("a") + 4, ord("b") + 4]]
    assert results[2].status == 400 and "out of range" in results[2].error
    assert results[3].value is True
    assert p.handle(ShutdownReq()) is False

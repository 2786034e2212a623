"""The engine-process side in one process: typed messages in, one pipe message per engine step out."""

import asyncio
import threading
import time

import pytest

from sglpy.runtime.messages import (AbortReq, Call, CallResult, DetokenizeReq, Failed, FlushCacheReq, GenerateReqInput,
                                    ReqOutput, ShutdownReq, StepOutputs, TokenizeReq)
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.server.engine_client import _Pending
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


def test_compiles_wait_in_the_engine_submit_never_blocks_and_an_abort_while_compiling_frees_everything(
        tiny_model_path):
    """The process submits a constrained request at once (the engine's admission waits for the compile); an abort
    while it compiles ends it with one final output and leaves nothing behind; a failed compile is a 400."""
    import concurrent.futures
    import dataclasses

    from sglpy.runtime.engine import Engine
    from sglpy.runtime.engine.admission import CANCELLED

    eng = Engine(tiny_model_path, quantization="none", max_total_tokens=512, debug_invariants=True,
                 grammar_workers=0)
    conn = FakeConn()
    p = EngineProcess(eng, PipeSender(conn))
    compiles = {"held": concurrent.futures.Future(), "bad": concurrent.futures.Future()}
    build, submit, waited = eng.build_request, eng.submit, []

    def build_compiling(inp):  # a request whose constraint compile has not finished (the test finishes it)
        req = build(inp)
        return dataclasses.replace(req, guide=compiles[inp.rid]) if inp.rid in compiles else req

    def timed_submit(*a, **k):
        t = time.perf_counter()
        submit(*a, **k)
        waited.append(time.perf_counter() - t)

    eng.build_request, eng.submit = build_compiling, timed_submit
    try:
        sp = SamplingParams(max_new_tokens=4, temperature=0)
        for rid in ("held", "bad", "plain"):
            p.handle(GenerateReqInput(rid=rid, text="hello", sampling=sp))
        _wait(lambda: len(waited) == 3)  # all three submitted while two compiles still run
        assert max(waited) < 1.0 and not any(f.done() for f in compiles.values())
        _wait(lambda: "plain" in _finished(conn))  # the loop serves meanwhile
        compiles["bad"].set_exception(ValueError("regex constraint failed to compile: bad"))
        _wait(lambda: len(conn.of(Failed)) == 1)
        failed = conn.of(Failed)[0]
        assert failed.rid == "bad" and failed.status == 400 and "failed to compile" in failed.message
        p.handle(AbortReq("held"))
        _wait(lambda: "held" in _finished(conn))
        assert _finished(conn)["held"].meta_info["finish_reason"] == {"type": "abort", "message": CANCELLED}
        assert compiles["held"].cancelled()
        finals = [o.rid for s in conn.of(StepOutputs) for o in s.outputs if o.finished]
        assert sorted(finals) == ["held", "plain"]  # one final output each; "bad" got its 400 only
        info = eng.get_server_info()
        assert info["kv_used"] == 0 and info["num_running_reqs"] == 0 and info["num_waiting_reqs"] == 0
        assert not eng.admission.busy and not p._window.building
    finally:
        p.close()
        eng.shutdown()


def test_a_lagging_stream_reader_skips_to_the_newest_cumulative_output():
    def out(n, finished=False):
        return ReqOutput("r", "x" * n, list(range(n)), {"completion_tokens": n}, finished)

    async def main():
        pend = _Pending()
        pend.put(out(1))
        first = await pend.get()  # a reader that keeps up sees every step
        for n in (2, 3, 4):
            pend.put(out(n))
        newest = await pend.get()  # one that lags gets the newest of the queued outputs, not each
        pend.put(out(5, finished=True))
        pend.put(Failed("r", "late", 500))
        last, failure = await pend.get(), await pend.get()  # collapsing never swallows a non-output message
        return first, newest, last, failure

    first, newest, last, failure = asyncio.run(main())
    assert [first.output_ids, newest.output_ids, last.output_ids] == [[0], [0, 1, 2, 3], [0, 1, 2, 3, 4]]
    assert last.finished and isinstance(failure, Failed)

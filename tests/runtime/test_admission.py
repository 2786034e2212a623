"""Admission on the loop thread: submit never waits for a compile; abort while compiling is handled in one place.
And the engine package's structure: the Engine holds its loop, and no module of the package imports itself back."""

import ast
import concurrent.futures
import dataclasses
import json
import pathlib
import queue
import time

from sglpy.runtime.engine.admission import CANCELLED, Admission, GuideReady, SubmitMsg
from sglpy.runtime.messages import GenerateReq, GenerateReqInput
from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams

ENGINE_PKG = pathlib.Path(__file__).resolve().parents[2] / "runtime" / "engine"


def _greq(rid, guide):
    return GenerateReq(rid=rid, input_ids=[1, 2, 3], sampling=SamplingParams(), logprob=LogprobOptions(),
                       extra_key=None, stream=False, guide=guide)


class _Loop:
    """The loop side of Admission, by hand: the inbox, and what it admitted / emitted."""

    def __init__(self):
        self.inbox, self.admitted, self.outputs = queue.Queue(), [], []
        self.adm = Admission(lambda req, sink, guide: (req.rid, guide), self.admitted.append, self.inbox.put)

    def sink(self, step):
        self.outputs += step.outputs

    def drain(self):
        while not self.inbox.empty():
            msg = self.inbox.get_nowait()
            assert isinstance(msg, GuideReady)
            self.adm.ready(msg.rid)


def test_a_request_waits_for_its_compile_without_blocking_and_enters_once_it_is_done():
    loop, fut = _Loop(), concurrent.futures.Future()
    loop.adm.submit(SubmitMsg(_greq("a", fut), loop.sink))  # returns at once
    loop.adm.submit(SubmitMsg(_greq("b", None), loop.sink))  # no constraint: admitted now
    assert loop.admitted == [("b", None)] and loop.adm.busy
    fut.set_result("guide")
    loop.drain()
    assert loop.admitted == [("b", None), ("a", "guide")] and not loop.adm.busy and loop.outputs == []


def test_abort_cancel_and_failure_while_compiling_end_the_request_with_one_final_output():
    loop = _Loop()
    futs = {rid: concurrent.futures.Future() for rid in ("aborted", "cancelled", "failed", "built")}
    for rid in ("aborted", "cancelled", "failed"):
        loop.adm.submit(SubmitMsg(_greq(rid, futs[rid]), loop.sink))
    assert loop.adm.abort("aborted") and futs["aborted"].cancelled()
    loop.adm.track(_greq("built", futs["built"]))  # built, not submitted: cancel(rid) from any thread stops it
    loop.adm.cancel("built")
    assert futs["built"].cancelled()
    futs["cancelled"].cancel()
    futs["failed"].set_exception(ValueError("json_schema constraint failed to compile: bad"))
    loop.drain()
    assert loop.admitted == [] and not loop.adm.busy and not loop.adm.abort("aborted")
    got = {o.rid: o for o in loop.outputs}
    assert sorted(got) == ["aborted", "cancelled", "failed"] and all(o.finished for o in got.values())
    reasons = {rid: o.meta_info["finish_reason"] for rid, o in got.items()}
    assert reasons["aborted"] == reasons["cancelled"] == {"type": "abort", "message": CANCELLED}
    assert reasons["failed"]["type"] == "abort" and "failed to compile" in reasons["failed"]["message"]


def test_engine_submit_does_not_wait_for_the_compile(tiny_model_path):
    from sglpy.runtime.engine import Engine
    from sglpy.runtime.engine.delivery import BatchWaiter

    schema = json.dumps({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})
    with Engine(tiny_model_path, quantization="none", max_total_tokens=512, debug_invariants=True) as eng:
        sp = SamplingParams(max_new_tokens=24, temperature=0, json_schema=schema)
        built = eng.build_request(GenerateReqInput(rid="ref", text="x", sampling=sp))
        guide = built.guide.result(timeout=120)
        slow, gone = concurrent.futures.Future(), concurrent.futures.Future()
        waiter = BatchWaiter(["slow", "gone"])
        t = time.perf_counter()
        eng.submit(dataclasses.replace(built, rid="slow", guide=slow), waiter)
        eng.submit(dataclasses.replace(built, rid="gone", guide=gone), waiter)
        assert time.perf_counter() - t < 1.0  # submit returned with both compiles pending
        eng.abort("gone")
        assert waiter.futures["gone"].result(timeout=60)["meta_info"]["finish_reason"]["message"] == CANCELLED
        assert gone.cancelled() and not waiter.futures["slow"].done()
        slow.set_result(guide)
        out = waiter.futures["slow"].result(timeout=120)
        assert out["meta_info"]["finish_reason"]["type"] in ("stop", "length")
        ref = eng.generate("x", {"max_new_tokens": 24, "temperature": 0, "json_schema": schema})
        assert out["output_ids"] == ref["output_ids"]  # admitted later, decoded the same
        info = eng.get_server_info()
        assert info["kv_used"] == 0 and info["num_running_reqs"] == 0 and not eng._has_work()


def _imports(path: pathlib.Path) -> set[str]:
    """The engine-package modules `path` imports at module level (relative imports)."""
    out = set()
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            out.add(node.module)
    return out


def test_the_engine_package_has_no_import_loop_and_the_engine_holds_its_loop():
    graph = {p.stem: _imports(p) for p in ENGINE_PKG.glob("*.py") if p.stem != "__init__"}

    def reaches(a, b, seen=()):
        return any(n == b or (n not in seen and reaches(n, b, seen + (n,))) for n in graph.get(a, ()))

    loops = sorted(m for m in graph if reaches(m, m))
    assert loops == [], loops
    from sglpy.runtime.engine.engine import Engine
    from sglpy.runtime.engine.step_loop import EngineLoop

    assert not issubclass(Engine, EngineLoop) and [b.__name__ for b in Engine.__mro__[1:-1]] == ["OfflineAPI"]


def test_an_abort_while_building_ends_the_request_at_submit():
    from sglpy.runtime.engine.admission import BuildWindow

    w, submitted = BuildWindow(), []
    w.open("a")
    w.open("b")
    assert w.abort("a") and w.building
    assert w.close("a", lambda: submitted.append("a")) is True  # aborted meanwhile: never submitted
    assert w.close("b", lambda: submitted.append("b")) is False and submitted == ["b"]
    assert not w.abort("b") and not w.building  # submitted: the engine's abort takes it from here

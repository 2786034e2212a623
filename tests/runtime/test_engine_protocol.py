"""EngineProtocol: the runtime Engine and the test FakeEngine both implement it, with the same signatures and behaviour."""

import inspect
import threading

import pytest

from sglpy.runtime.core import EngineProtocol, missing_engine_methods
from sglpy.runtime.messages import EngineInfo, GenerateReq, GenerateReqInput, ReqOutput, StepOutputs
from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams
from sglpy.runtime.testing.fake_engine import FakeEngine

METHODS = [n for n, v in vars(EngineProtocol).items() if callable(v) and not n.startswith("_")]


@pytest.fixture(scope="module", params=["runtime", "fake"])
def engine(request, tiny_model_path):
    if request.param == "runtime":
        from sglpy.runtime.engine import Engine

        eng = Engine(tiny_model_path, max_total_tokens=1024, max_context_len=256)
    else:
        eng = FakeEngine(max_context_len=256)
        eng.token_delay = 0.001
    yield eng
    eng.shutdown()


class Collect:
    """A sink recording every StepOutputs it gets."""

    def __init__(self):
        self.steps: list[StepOutputs] = []
        self.done = threading.Event()
        self.expected = 0

    def __call__(self, step: StepOutputs) -> None:
        self.steps.append(step)
        if sum(o.finished for s in self.steps for o in s.outputs) >= self.expected:
            self.done.set()


def test_both_engines_implement_the_protocol_with_its_signatures(engine):
    assert isinstance(engine, EngineProtocol) and missing_engine_methods(engine) == []
    for name in METHODS:
        want = list(inspect.signature(getattr(EngineProtocol, name)).parameters)[1:]  # without self
        assert list(inspect.signature(getattr(engine, name)).parameters) == want, name
    info = engine.info()
    assert isinstance(info, EngineInfo) and info.context_len == 256 and info.vocab_size > 0


def test_incomplete_engines_are_named():
    class Half:
        def info(self):
            return None

    assert not isinstance(Half(), EngineProtocol)
    assert "build_request" in missing_engine_methods(Half()) and "info" not in missing_engine_methods(Half())


def test_build_validates_once_and_submit_emits_per_step_batches(engine):
    sp = SamplingParams(max_new_tokens=4, temperature=0.0, ignore_eos=True)
    reqs = [engine.build_request(GenerateReqInput(rid=f"p{i}", text=f"prompt {i}", sampling=sp, stream=True,
                                                  logprob=LogprobOptions(return_logprob=True)))
            for i in range(3)]
    assert all(isinstance(r, GenerateReq) and r.input_ids for r in reqs)
    sink = Collect()
    sink.expected = 3
    for r in reqs:
        engine.submit(r, sink)
    assert sink.done.wait(120)
    outs = [o for s in sink.steps for o in s.outputs]
    assert all(isinstance(o, ReqOutput) for o in outs)
    assert any(len(s.outputs) > 1 for s in sink.steps)  # one message carries several requests' outputs
    final = {o.rid: o for o in outs if o.finished}
    assert set(final) == {"p0", "p1", "p2"}
    assert all(o.meta_info["completion_tokens"] == 4 and len(o.meta_info["output_token_logprobs"]) == 4
               for o in final.values())


@pytest.mark.parametrize("inp, match", [
    (dict(text="x", sampling=SamplingParams(max_new_tokens=300)), "exceeds the model's context"),
    (dict(input_ids=[10**6]), "outside the vocabulary"),
    (dict(text="x", sampling=SamplingParams(n=2)), "n > 1"),
    (dict(input_ids=[5, 6], logprob=LogprobOptions(logprob_start_len=3)), "logprob_start_len"),
])
def test_build_request_rejects_with_a_clear_error(engine, inp, match):
    with pytest.raises(ValueError, match=match):
        engine.build_request(GenerateReqInput(rid="bad", **inp))


def test_max_new_tokens_none_means_the_room_left(engine):
    req = engine.build_request(GenerateReqInput(rid="room", input_ids=[5, 6, 7],
                                                sampling=SamplingParams(max_new_tokens=None)))
    assert req.sampling.max_new_tokens == 256 - 3


def test_abort_ends_a_request_with_a_final_output(engine):
    req = engine.build_request(GenerateReqInput(rid="ab", text="go on", stream=True,
                                                sampling=SamplingParams(max_new_tokens=200, ignore_eos=True)))
    sink = Collect()
    sink.expected = 1
    engine.submit(req, sink)
    while not sink.steps:
        threading.Event().wait(0.01)
    engine.abort("ab")
    assert sink.done.wait(60)
    final = [o for s in sink.steps for o in s.outputs if o.finished]
    assert len(final) == 1 and final[0].meta_info["finish_reason"]["type"] == "abort"
    assert engine.get_server_info()["kv_used"] == 0

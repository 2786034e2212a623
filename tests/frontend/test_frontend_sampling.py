"""One SamplingParams: gen's keywords, run's program defaults and every backend's wire form derive from it."""

import inspect

import pytest

import sglpy as sgl
from sglpy.backend_engine import Engine
from sglpy.backend_fake import FakeBackend
from sglpy.backend_http import SGLANG_FRONTEND_KEYS, wire_sampling_params
from sglpy.function import PROGRAM_SAMPLING_KEYS
from sglpy.ir import GenParams
from sglpy.runtime.sampling_params import GEN_ALIASES, LogprobOptions, SamplingParams

FIELDS = set(SamplingParams.field_names())


def test_gen_keywords_are_the_sampling_fields_plus_the_frontend_options():
    # the tool keywords become a structural_tag (sglpy/tools.py), not fields of their own
    keywords = set(inspect.signature(sgl.gen).parameters) - {"name", "choices_method", "tools", "tool_choice",
                                                             "parallel_tool_calls"}
    as_fields = {GEN_ALIASES.get(k, k) for k in keywords}
    assert as_fields == FIELDS | set(GenParams.OPTIONS) - {"lora_path"}  # a program's adapter: run(lora_path=...)
    assert set(GenParams.OPTIONS) == set(LogprobOptions.field_names()) | {"dtype", "lora_path"}
    assert set(GEN_ALIASES.values()) <= FIELDS


def test_typed_gens_take_gens_keywords_without_repeating_them():
    for typed in (sgl.gen_int, sgl.gen_string):
        params = set(inspect.signature(typed).parameters)
        assert params == set(inspect.signature(sgl.gen).parameters) - {
            "min_tokens", "dtype", "choices", "choices_method", "regex", "json_schema", "ebnf", "structural_tag",
            "tools", "tool_choice", "parallel_tool_calls"}
    node = sgl.gen_int("x", max_tokens=3, stop_regex=r"\d{4}", seed=7)
    assert node.overrides == {"max_tokens": 3, "stop_regex": r"\d{4}", "seed": 7, "dtype": int}
    with pytest.raises(TypeError, match="does not take"):
        sgl.gen_string("x", regex="a+")


def test_run_keywords_and_wire_keys_are_checked_against_the_fields():
    assert PROGRAM_SAMPLING_KEYS == FIELDS | set(LogprobOptions.field_names()) | {"lora_path"}
    assert set(SGLANG_FRONTEND_KEYS) <= FIELDS
    wire = wire_sampling_params(SamplingParams())
    assert set(wire) == set(SGLANG_FRONTEND_KEYS)  # an SGLang server sees its frontend's usual body
    wire = wire_sampling_params(SamplingParams(stop_regex=r"\.", repetition_penalty=1.1, seed=3))
    assert wire["stop_regex"] == [r"\."] and wire["repetition_penalty"] == 1.1 and wire["seed"] == 3


def test_every_gen_keyword_reaches_the_backend():
    fb = FakeBackend(default_response="abc")

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("y", max_tokens=9, stop_regex="q", repetition_penalty=1.2, seed=5, no_stop_trim=True,
                           skip_special_tokens=False, logit_bias={3: 1.0}, ebnf="root ::= \"abc\"",
                           return_logprob=True)

    prog.run(backend=fb).sync()
    params = fb.calls[0][1]["params"]
    sp = params.sampling
    assert (sp.max_new_tokens, sp.stop_regex, sp.repetition_penalty, sp.seed, sp.no_stop_trim) == (
        9, ("q",), 1.2, 5, True)
    assert sp.skip_special_tokens is False and sp.logit_bias == {3: 1.0} and sp.ebnf == 'root ::= "abc"'
    assert params.return_logprob is True and params.logprob_fields() == {"return_logprob": True}


def test_bad_sampling_values_fail_in_the_caller_with_the_runtimes_message():
    with pytest.raises(ValueError, match="stop_regex"):
        sgl.gen("x", stop_regex="(unclosed")
    with pytest.raises(ValueError, match="top_k"):
        sgl.gen("x", top_k=0)
    with pytest.raises(ValueError, match="at most one constraint"):
        sgl.gen("x", regex="a", ebnf="root ::= \"a\"")
    with pytest.raises(TypeError, match="unexpected keyword"):
        sgl.function(lambda s: None).run_batch([{}], max_tokens=3)  # run takes SGLang's max_new_tokens


def test_fake_backend_honours_stop_regex():
    fb = FakeBackend(default_response="alpha 12 beta 345 gamma")

    @sgl.function
    def prog(s):
        s += "Q:" + sgl.gen("cut", stop_regex=[r"\d+ g", r"b\w+"]) + sgl.gen("kept", stop_regex=r"\d{3}",
                                                                           no_stop_trim=True)

    st = prog.run(backend=fb)
    assert st["cut"] == "alpha 12 "
    assert st.get_meta_info("cut")["finish_reason"] == {"type": "stop", "matched": r"b\w+"}
    assert st["kept"] == "alpha 12 beta 345"


def test_backends_agree_on_special_token_defaults(monkeypatch):
    class Stub:
        tokenizer = type("T", (), {"name_or_path": "stub", "encode": lambda self, t: [ord(c) for c in t]})()
        calls: list = []

        def generate(self, prompt=None, sampling_params=None, **kw):
            self.calls.append(sampling_params)
            return {"text": "ok", "output_ids": [], "meta_info": {"finish_reason": {"type": "length", "length": 1}}}

    @sgl.function
    def prog(s):
        s += "x" + sgl.gen("y", max_tokens=2)

    stub, fb = Stub(), FakeBackend()
    for skip in (True, False):
        monkeypatch.setattr(sgl.global_config, "skip_special_tokens_in_output", skip)
        prog.run(backend=Engine(engine=stub)).sync()
        prog.run(backend=fb).sync()
        assert stub.calls[-1].skip_special_tokens is skip
        http_body = wire_sampling_params(fb.calls[-1][1]["params"].sampling)
        assert http_body["skip_special_tokens"] is skip and http_body["spaces_between_special_tokens"] is True

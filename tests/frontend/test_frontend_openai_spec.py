"""sgl.OpenAI against a scripted OpenAI-compatible endpoint (runtime/testing/stub_openai.py): the request mapping,
the clear errors for what an endpoint cannot do, select's methods, and API speculative execution (call counts)."""

import json

import pytest

import sglpy as sgl
from sglpy.backend_openai import UnsupportedFeature, create_logit_bias_int, match_choice
from sglpy.runtime.testing.fake_engine import FakeTokenizer
from sglpy.runtime.testing.stub_openai import StubOpenAI

pytest.importorskip("openai")

HEADER = "Make up a character.\n"
DOC = "Name: Bob\nAge: 30\nJob: baker\n"


def document_responder(body):
    """A model that follows the format: completions continue HEADER + DOC; chat answers DOC (or continues it)."""
    if "prompt" in body:
        prompt = body["prompt"]
        assert (HEADER + DOC).startswith(prompt), prompt
        return (HEADER + DOC)[len(prompt):]
    last = body["messages"][-1]
    if last["role"] == "assistant":  # continue_final_message: the turn so far
        assert DOC.startswith(last["content"]), last["content"]
        return DOC[len(last["content"]):]
    return DOC


@pytest.fixture
def stub():
    with StubOpenAI(document_responder) as s:
        yield s


def backend(stub, **kw):
    return sgl.OpenAI("stub-model", base_url=stub.url, max_retries=0, **kw)


def completion_program(spec):
    @sgl.function(num_api_spec_tokens=spec)
    def character(s):
        s += HEADER
        s += "Name:" + sgl.gen("name", stop="\n", max_tokens=16) + "\n"
        s += "Age:" + sgl.gen("age", stop="\n", max_tokens=16) + "\n"
        s += "Job:" + sgl.gen("job", stop="\n", max_tokens=16) + "\n"

    return character


def chat_program(spec):
    @sgl.function(num_api_spec_tokens=spec)
    def character(s):
        s += sgl.user("Make up a character.")
        s += sgl.assistant("Name:" + sgl.gen("name", stop="\n") + "\nAge:" + sgl.gen("age", stop="\n")
                           + "\nJob:" + sgl.gen("job", stop="\n"))

    return character


def values(state):
    return [state["name"], state["age"], state["job"]]


# ---------------------------------------------------------------- speculative execution


def test_completion_spec_fills_three_gens_from_one_call(stub):
    be = backend(stub, is_chat_model=False)
    plain = completion_program(None).run(backend=be, temperature=0)
    assert values(plain) == [" Bob", " 30", " baker"] and be.token_usage.calls == 3
    be.token_usage.reset()
    spec = completion_program(64).run(backend=be, temperature=0)
    assert values(spec) == values(plain) and spec.text() == plain.text()
    assert be.token_usage.calls == 1
    assert "stop" not in stub.requests[-1] and stub.requests[-1]["max_tokens"] == 64
    assert spec.get_meta_info("name")["api_spec"] == "called" and spec.get_meta_info("job")["api_spec"] == "reused"


def test_completion_spec_miss_falls_back_to_its_own_call():
    # the model leaves the format after the name: the speculated rest is dropped, the next gens call again
    def responder(body):
        p = body["prompt"]
        return " Bob\nHeight: 2\n" if p.endswith("Name:") else document_responder(body)

    with StubOpenAI(responder) as stub:
        be = backend(stub, is_chat_model=False)
        state = completion_program(64).run(backend=be, temperature=0)
        assert values(state) == [" Bob", " 30", " baker"]
        assert be.token_usage.calls == 2  # the speculative call, then one more speculating the rest


def test_chat_spec_fills_a_three_gen_turn_from_one_call(stub):
    be = backend(stub)
    state = chat_program(64).run(backend=be, temperature=0)
    assert values(state) == [" Bob", " 30", " baker"]
    assert be.token_usage.calls == 1
    body = stub.requests[-1]
    assert body["max_tokens"] == 64 and "stop" not in body
    assert [m["role"] for m in body["messages"]] == ["user"]
    assert state.messages()[-1] == {"role": "assistant", "content": "Name: Bob\nAge: 30\nJob: baker"}
    assert state.get_meta_info("age")["api_spec"] == "hit"


def test_spec_state_is_per_program_state_so_run_batch_works(stub):
    be = backend(stub)
    states = chat_program(64).run_batch([{}] * 6, backend=be, temperature=0, num_threads=6)
    assert [s.error() for s in states] == [None] * 6
    assert all(values(s) == [" Bob", " 30", " baker"] for s in states)
    assert be.token_usage.calls == 6  # one call per program


def test_chat_spec_miss_makes_one_call_per_gen_where_the_endpoint_can_continue():
    def responder(body):
        if body["messages"][-1]["role"] == "user":
            return "Sure! Here is a character: Bob, 30, baker."  # not the format
        return document_responder(body)

    with StubOpenAI(responder) as stub:
        be = backend(stub, sglang_extensions=True)  # continue_final_message, as SGLang-family servers take it
        state = chat_program(64).run(backend=be, temperature=0)
        assert values(state) == [" Bob", " 30", " baker"]
        assert be.token_usage.calls == 4
        assert stub.requests[-1]["continue_final_message"] is True
        assert stub.requests[-1]["messages"][-1] == {"role": "assistant", "content": "Name: Bob\nAge: 30\nJob:"}
        assert state.get_meta_info("job")["api_spec"] == "miss"
    with StubOpenAI(responder) as stub:  # a plain OpenAI endpoint cannot continue a partial assistant message
        state = chat_program(64).run(backend=backend(stub), temperature=0)
        with pytest.raises(sgl.ProgramError, match="continuing a partial assistant message"):
            state["name"]


def test_chat_without_spec_needs_the_gen_first_in_the_turn(stub):
    state = chat_program(None).run(backend=backend(stub), temperature=0)
    with pytest.raises(sgl.ProgramError, match="not supported by sgl.OpenAI"):
        state["name"]


def test_spec_rules_are_errors_not_guesses(stub):
    be = backend(stub)

    @sgl.function(num_api_spec_tokens=32)
    def differing(s):
        s += sgl.user("x")
        s += sgl.assistant(sgl.gen("a", stop="\n", temperature=0) + "\n" + sgl.gen("b", stop="\n", temperature=0.7))

    with pytest.raises(sgl.ProgramError, match="temperature differs"):
        differing.run(backend=be)["a"]

    @sgl.function(num_api_spec_tokens=32)
    def early_read(s):
        s += sgl.user("x")
        with s.assistant():
            s += "Name:" + sgl.gen("name", stop="\n")
            s += s["name"]  # filled only when the turn closes

    with pytest.raises(RuntimeError, match="when its assistant turn closes"):
        early_read.run(backend=be)
    with pytest.raises(sgl.ProgramError, match="stream=True is not supported"):
        st = chat_program(32).run(backend=be, stream=True)
        st["name"]
    with pytest.raises(ValueError, match="num_api_spec_tokens"):
        sgl.function(num_api_spec_tokens=0)(lambda s: None)


def test_spec_is_ignored_on_local_backends():
    fake = sgl.FakeBackend(default_response="x")
    state = completion_program(64).run(backend=fake)
    assert values(state) == ["x", "x", "x"] and len(fake.calls) == 3


# ---------------------------------------------------------------- request mapping and clear errors


def test_gen_request_fields(stub):
    be = backend(stub)

    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=5, stop=["\n", "."], temperature=0.3, top_p=0.9, n=2, seed=7,
                                   frequency_penalty=0.5))

    state = prog.run(backend=be)
    assert state["a"] == [DOC[:5], DOC[:5]]  # n = 2: the samples, the first in the text
    assert state.text().endswith(DOC[:5] + "\n")
    body = stub.requests[-1]
    assert {k: body[k] for k in ("max_tokens", "stop", "temperature", "top_p", "n", "seed", "frequency_penalty")} == \
        {"max_tokens": 5, "stop": ["\n", "."], "temperature": 0.3, "top_p": 0.9, "n": 2, "seed": 7,
         "frequency_penalty": 0.5}
    assert body["messages"] == [{"role": "user", "content": "hi"}]


def test_json_schema_is_response_format_on_chat(stub):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}

    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a", json_schema=schema, max_tokens=8))

    prog.run(backend=backend(stub))["a"]
    rf = stub.requests[-1]["response_format"]
    assert rf["type"] == "json_schema" and rf["json_schema"]["schema"] == schema


@pytest.mark.parametrize("kw,feature", [({"regex": "[a-z]+"}, "gen(regex=...)"), ({"top_k": 5}, "gen(top_k=...)"),
                                        ({"stop_regex": "x"}, "gen(stop_regex=...)"),
                                        ({"dtype": float}, "gen(regex=...)"), ({"return_logprob": True}, "logprob")])
def test_what_a_plain_endpoint_cannot_do_is_an_error_naming_it(stub, kw, feature):
    @sgl.function
    def prog(s):
        s += sgl.user("hi")
        s += sgl.assistant(sgl.gen("a", max_tokens=4, **kw))

    state = prog.run(backend=backend(stub))
    with pytest.raises(sgl.ProgramError) as e:
        state["a"]
    assert isinstance(e.value.__cause__, UnsupportedFeature)
    assert feature in str(e.value) and "sgl.OpenAI ('stub-model'" in str(e.value)
    assert not stub.requests  # nothing was sent


def test_json_schema_on_a_plain_completion_endpoint_is_an_error(stub):
    @sgl.function
    def prog(s):
        s += "JSON:" + sgl.gen("a", json_schema={"type": "object"}, max_tokens=8)

    with pytest.raises(sgl.ProgramError, match=r"gen\(json_schema=...\) is not supported by sgl.OpenAI"):
        prog.run(backend=backend(stub, is_chat_model=False))["a"]
    assert not stub.requests


def test_dtype_int_uses_an_integer_logit_bias_and_checks_the_answer():
    with StubOpenAI(lambda body: "42 apples") as stub:
        be = backend(stub, is_chat_model=False, tokenizer=FakeTokenizer())

        @sgl.function
        def prog(s):
            s += "Count:" + sgl.gen_int("n", max_tokens=4)

        assert prog.run(backend=be)["n"] == "42"
        bias = stub.requests[-1]["logit_bias"]
        digits = {str(ord(c) + 4) for c in "0123456789"}
        assert digits <= set(bias) and set(bias) <= digits | {"1"}  # digits and EOS
        assert stub.requests[-1]["stop"] == [" ", "\n"]
    with StubOpenAI(lambda body: "many") as stub:
        state = prog.run(backend=backend(stub, is_chat_model=False, tokenizer=FakeTokenizer()))
        with pytest.raises(sgl.ProgramError, match="did not yield an integer"):
            state["n"]
    assert set(create_logit_bias_int(FakeTokenizer())) == digits | {"1"}


def test_chat_select_methods(stub):
    @sgl.function
    def pick(s):
        s += sgl.user("Pick one.")
        s += sgl.assistant(sgl.select("c", ["red", "green"]))

    with StubOpenAI(lambda body: json.dumps({"choice": "green"}) if "response_format" in body else "Green.") as stub:
        state = pick.run(backend=backend(stub))
        assert state["c"] == "green" and state.get_meta_info("c")["select_method"] == "json_schema_enum"
        assert stub.requests[-1]["response_format"]["json_schema"]["schema"]["properties"]["choice"]["enum"] == \
            ["red", "green"]
        state = pick.run(backend=backend(stub, select_by="generate"))
        assert state["c"] == "green" and state.get_meta_info("c")["select_method"] == "generate_and_match"
    with StubOpenAI(lambda body: "blue") as stub:
        with pytest.raises(sgl.ProgramError, match="matches none of"):
            pick.run(backend=backend(stub, select_by="generate"))["c"]


def test_choices_regex_matches_exactly_the_choices():
    import re

    from sglpy.backend_openai import choices_regex

    choices = ["red", "light blue (sky).", "a+b|c*", "x\\y", "[z]{2}?^$"]
    rx = choices_regex(choices)
    assert all(re.fullmatch(rx, c) for c in choices)
    assert not any(re.fullmatch(rx, c) for c in ["light blue (sky)x", "aab|c", "b", "zz", ""])


def test_match_choice():
    assert match_choice(" Yes.", ["Yes", "No"]) == "Yes"
    assert match_choice("no", ["Yes", "No"]) == "No"
    assert match_choice("Search for it", ["Search", "Finish"]) == "Search"
    assert match_choice("maybe", ["Yes", "No"]) is None


def test_chat_gen_outside_an_assistant_turn_is_an_error(stub):
    @sgl.function
    def plain(s):
        s += "Q: hi\nA:" + sgl.gen("a", max_tokens=4)

    with pytest.raises(sgl.ProgramError, match="inside an assistant turn"):
        plain.run(backend=backend(stub))["a"]


# ---------------------------------------------------------------- sgl.LiteLLM (the shim, with a stand-in module)


class _LiteLLMStandIn:
    """A stand-in for the `litellm` module: completion() answers through the openai client, recording its kwargs."""

    def __init__(self):
        self.calls = []

    def completion(self, base_url=None, api_key=None, timeout=None, max_retries=None, **kw):
        import openai

        self.calls.append(kw)
        return openai.OpenAI(base_url=base_url, api_key=api_key, max_retries=0).chat.completions.create(**kw)


def test_litellm_is_the_chat_backend_over_litellm_completion(stub):
    mod = _LiteLLMStandIn()
    be = sgl.LiteLLM("openai/stub-model", base_url=stub.url, api_key="k", litellm_module=mod)
    state = chat_program(64).run(backend=be, temperature=0)
    assert values(state) == [" Bob", " 30", " baker"] and be.token_usage.calls == 1  # speculative execution too
    assert mod.calls[-1]["model"] == "openai/stub-model" and mod.calls[-1]["max_tokens"] == 64

    @sgl.function
    def regex(s):
        s += sgl.user("x")
        s += sgl.assistant(sgl.gen("a", regex="[a-z]+", max_tokens=4))

    with pytest.raises(sgl.ProgramError, match=r"gen\(regex=...\) is not supported by sgl.LiteLLM"):
        regex.run(backend=be)["a"]

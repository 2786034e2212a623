"""Reasoning models from the frontend: sgl.gen with a JSON schema on a tiny Qwen3 reasoning model through the
engine backend (valid JSON after the thinking), and sgl.separate_reasoning (SGLang's meaning: the variable keeps
the answer, `<name>_reasoning_content` the thinking, the program text the answer), on the engine and a fake."""

from __future__ import annotations

import json

import jsonschema
import pytest

import sglpy as sgl
from sglpy.backend_fake import FakeBackend
from sglpy.ir import SglExprList, SglSeparateReasoning

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory):
    from sglpy.runtime.testing.tiny_model import make_reasoning_model

    path = make_reasoning_model(tmp_path_factory.mktemp("fe-reasoner") / "qwen3-think")
    backend = sgl.Engine(path, reasoning_parser="qwen3", max_thinking_tokens=8, max_total_tokens=8192,
                         grammar_workers=0)
    yield backend
    backend.shutdown()


@sgl.function
def person(s, i, split):
    s += sgl.user(f"Person {i} as JSON")
    g = sgl.gen("p", json_schema=json.dumps(PERSON), max_tokens=80, temperature=0.8)
    s += sgl.assistant(sgl.separate_reasoning(g) if split else g)


def test_gen_json_after_thinking_on_the_engine_backend(reasoner):
    states = person.run_batch([{"i": i, "split": False} for i in range(4)], backend=reasoner)
    for st in states:
        thinking, sep, answer = st["p"].partition("</think>")
        assert sep and thinking.strip(), st["p"]  # the engine thought first (its bound: 8 tokens)
        jsonschema.validate(json.loads(answer), PERSON)


def test_separate_reasoning_splits_variable_text_and_messages(reasoner):
    states = person.run_batch([{"i": i, "split": True} for i in range(4)], backend=reasoner)
    for st in states:
        jsonschema.validate(json.loads(st["p"]), PERSON)
        assert st["p_reasoning_content"] and "</think>" not in st["p_reasoning_content"]
        assert "</think>" not in st.text() and st.text().rstrip().endswith(st["p"] + "<|im_end|>")
        assert st.messages()[-1] == {"role": "assistant", "content": st["p"]}


def test_separate_reasoning_on_a_fake_backend():
    @sgl.function
    def prog(s):
        s += "Q: a and b?\n<think>\n"
        s += sgl.separate_reasoning([sgl.gen("a", max_tokens=64), " and ", sgl.gen("b", max_tokens=64)],
                                    model_type="qwen3")
        s += " done"

    fake = FakeBackend(responses=["weigh it\n</think>\n\nA", "no think tags here"])
    st = prog.run(backend=fake)
    assert (st["a"], st["a_reasoning_content"]) == ("A", "weigh it")
    # the second gen's prompt no longer ends inside a thinking section: its whole output is the answer
    assert (st["b"], st["b_reasoning_content"]) == ("no think tags here", None)
    assert st.text() == "Q: a and b?\n<think>\nA and no think tags here done"

    r1 = prog.run(backend=FakeBackend(responses=["x</think>y", "z"]))
    assert r1["a"] == "y" and r1["a_reasoning_content"] == "x"


def test_separate_reasoning_shape_and_errors():
    expr = sgl.separate_reasoning(sgl.gen("x"), model_type="deepseek-r1")
    assert isinstance(expr, SglExprList) and isinstance(expr.exprs[-1], SglSeparateReasoning)
    assert expr.exprs[-1].name == "x_reasoning_content"
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        sgl.separate_reasoning(sgl.gen("x"), model_type="o1")
    with pytest.raises(ValueError, match="named gen"):
        sgl.separate_reasoning(sgl.gen(), model_type="qwen3")

    @sgl.function
    def no_parser(s):
        s += sgl.separate_reasoning(sgl.gen("x", max_tokens=4))

    with pytest.raises(ValueError, match="separate_reasoning needs model_type"):
        no_parser.run(backend=FakeBackend(responses=["abc"]))

    @sgl.function
    def streamed(s):
        s += "<think>\n"
        s += sgl.separate_reasoning(sgl.gen("x", max_tokens=16), model_type="qwen3")

    st = streamed.run(backend=FakeBackend(responses=["t</think>a"]), stream=True)
    assert "".join(st.text_iter()) and st["x"] == "t</think>a"  # streaming: skipped, as SGLang does
    assert st["x_reasoning_content"] is None

"""sgl.gen(tools=...): the variable holds the parsed call(s), valid under the tool's schema, in-process and over HTTP."""

from __future__ import annotations

import jsonschema
import pytest

import sglpy as sgl
from sglpy.runtime.testing.server_harness import run_server

pytestmark = pytest.mark.timeout(600)

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                        "b": {"type": "integer", "minimum": 0, "maximum": 99}},
       "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"name": "get_weather", "description": "current weather", "parameters": WEATHER},
         {"type": "function", "function": {"name": "add", "description": "a + b", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}


@sgl.function
def ask(s, question, choice="required", parallel=False):
    s += sgl.system("You are helpful.\n" + sgl.tool_prompt(TOOLS))
    s += sgl.user(question)
    s += sgl.assistant(sgl.gen("call", tools=TOOLS, tool_choice=choice, parallel_tool_calls=parallel,
                               max_tokens=120, temperature=1.0))


def _check(state, choice="required", parallel=False):
    res = state["call"]
    assert isinstance(res, sgl.ToolResult), res
    if choice == "auto" and not res.calls:
        return 0
    assert res.calls and (parallel or len(res.calls) == 1), res
    for c in res.calls:
        if choice not in ("required", "auto"):
            assert c.name == choice
        jsonschema.validate(c.arguments, SCHEMAS[c.name])
    assert res.call is res.calls[0] and res.call.id.startswith("call_")
    assert res.text in state.text()  # the raw call stays in the conversation
    return len(res.calls)


def _run_all(backend):
    states = ask.run_batch([{"question": f"What is {i} + 3?"} for i in range(6)], backend=backend)
    assert sum(_check(s) for s in states) == 6
    assert _check(ask.run("Weather in Oslo?", choice="get_weather", backend=backend), "get_weather") == 1
    assert _check(ask.run("Add 1 and 2, twice.", parallel=True, backend=backend), parallel=True) >= 1
    _check(ask.run("Hi", choice="auto", backend=backend), "auto")


def test_tool_gen_in_process(tiny_model_path):
    backend = sgl.Engine(tiny_model_path, max_total_tokens=8192, max_context_len=2048)
    try:
        _run_all(backend)
    finally:
        backend.shutdown()


def test_tool_gen_over_http(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "8192", "--max-context-len", "2048",
                    "--num-threads", "1") as srv:
        _run_all(sgl.RuntimeEndpoint(srv.url))


def test_bad_tool_gens_fail_in_the_caller():
    with pytest.raises(ValueError, match="duplicate tool name"):
        sgl.gen("x", tools=TOOLS + TOOLS[:1])
    with pytest.raises(ValueError, match="tool_choice"):
        sgl.gen("x", tools=TOOLS, tool_choice="nope")
    with pytest.raises(ValueError, match="need tools"):
        sgl.gen("x", tool_choice="auto")
    with pytest.raises(ValueError, match="no regex"):
        sgl.gen("x", tools=TOOLS, regex="a")

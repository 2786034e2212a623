"""The OpenAI chat route per model family, on tiny random models: a Qwen3 reasoning model (--reasoning-parser qwen3,
a template with Qwen3's tools block: hermes calls) gives valid tool calls and JSON after its separated thinking,
with enable_thinking and SGLang's per-request thinking budget (custom_params.thinking_budget) honoured, and Anthropic
thinking blocks; a Gemma 2 model with its turn markers gives valid tool calls, valid JSON and prefix-cache hits (a
Phi-3 one with PHI3_TEMPLATE too: one more server start, left out of the suite's time)."""

from __future__ import annotations

import json
import pathlib

import jsonschema
import pytest

from sglpy.runtime.testing.server_harness import run_server, sse_events
from sglpy.runtime.testing.tiny_model import QWEN3_TOOLS_TEMPLATE, make_family_model, make_reasoning_model

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "the weather in a city",
                                           "parameters": WEATHER}}]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
JSON_FORMAT = {"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}}
MSGS = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Weather in Paris?"}]
# turn markers as the families' own templates write them (written here: the tiny models carry the default tokenizer)
GEMMA_TEMPLATE = ("{{ bos_token }}{% for m in messages %}<start_of_turn>{{ 'model' if m.role == 'assistant' else "
                  "'user' }}\n{{ m.content }}<end_of_turn>\n{% endfor %}{% if add_generation_prompt %}"
                  "<start_of_turn>model\n{% endif %}")
PHI3_TEMPLATE = ("{% for m in messages %}<|{{ m.role }}|>\n{{ m.content }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")


def _chat(srv, **body):
    r = srv.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "max_tokens": 80, "temperature": 0,
                                               **body})
    assert r.status_code == 200, r.text
    return r.json()


def _check_calls(msg) -> None:
    assert msg["tool_calls"], msg
    for call in msg["tool_calls"]:
        assert call["function"]["name"] == "get_weather"
        jsonschema.validate(json.loads(call["function"]["arguments"]), WEATHER)


def _think_end_index(choice) -> int:
    """Where `</think>` is among the output tokens (from the chat logprobs' token texts)."""
    return [t["token"] for t in choice["logprobs"]["content"]].index("</think>")


@pytest.fixture(scope="module")
def qwen3(tmp_path_factory):
    path = make_reasoning_model(tmp_path_factory.mktemp("q3") / "qwen3-tools", template=QWEN3_TOOLS_TEMPLATE)
    with run_server("--model", path, "--reasoning-parser", "qwen3", "--max-thinking-tokens", "6",
                    "--max-total-tokens", "8192", "--num-threads", "1") as s:
        yield s


def test_qwen3_tool_calls_after_separated_thinking(qwen3):
    for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
        out = _chat(qwen3, tools=TOOLS, tool_choice=choice, temperature=0.8, seed=3, n=3, logprobs=True,
                    parallel_tool_calls=False, max_tokens=160)
        for ch in out["choices"]:
            msg = ch["message"]
            assert ch["finish_reason"] == "tool_calls" and msg["reasoning_content"], ch
            assert "<think>" not in (msg["content"] or "") and _think_end_index(ch) <= 6  # the server's bound
            _check_calls(msg)
    events = sse_events(qwen3.post("/v1/chat/completions", json={
        "model": "m", "messages": MSGS, "max_tokens": 80, "temperature": 0, "stream": True, "tools": TOOLS,
        "tool_choice": "required", "parallel_tool_calls": False}))
    deltas = [e["choices"][0]["delta"] for e in events if e != "[DONE]" and e["choices"]]
    assert any(d.get("reasoning_content") for d in deltas)
    first_call = next(i for i, d in enumerate(deltas) if d.get("tool_calls"))
    # the thinking came first (the chunk that ends it may also open the call)
    assert not any(d.get("reasoning_content") for d in deltas[first_call + 1:]), deltas
    args = "".join(c["function"].get("arguments", "") for d in deltas for c in d.get("tool_calls") or [])
    jsonschema.validate(json.loads(args), WEATHER)


def test_qwen3_json_after_thinking_and_thinking_switch(qwen3):
    on = _chat(qwen3, response_format=JSON_FORMAT)["choices"][0]["message"]
    assert on["reasoning_content"]
    jsonschema.validate(json.loads(on["content"]), PERSON)
    off = _chat(qwen3, response_format=JSON_FORMAT, tools=TOOLS, tool_choice="none",
                chat_template_kwargs={"enable_thinking": False})["choices"][0]["message"]
    assert off["reasoning_content"] is None  # the template closed the thinking: the constraint starts at once
    jsonschema.validate(json.loads(off["content"]), PERSON)
    calls = _chat(qwen3, tools=TOOLS, tool_choice="required", chat_template_kwargs={"enable_thinking": False},
                  parallel_tool_calls=False, max_tokens=160)
    assert calls["choices"][0]["message"]["reasoning_content"] is None
    _check_calls(calls["choices"][0]["message"])


def test_reasoning_effort_and_earlier_thinking_reach_the_template(qwen3):
    """reasoning_effort is a template variable (as SGLang forwards it) and an assistant message's reasoning_content
    is passed to the template (this one renders both: the prompts grow)."""
    base = _chat(qwen3, max_tokens=1)["usage"]["prompt_tokens"]
    assert _chat(qwen3, max_tokens=1, reasoning_effort="high")["usage"]["prompt_tokens"] > base
    history = MSGS + [{"role": "assistant", "content": "Sunny."}, {"role": "user", "content": "And Rome?"}]
    plain = _chat(qwen3, max_tokens=1, messages=history)["usage"]["prompt_tokens"]
    history[2] = {**history[2], "reasoning_content": "Paris is in France, so look it up."}
    assert _chat(qwen3, max_tokens=1, messages=history)["usage"]["prompt_tokens"] > plain


def test_per_request_thinking_budget_on_the_openai_routes(qwen3):
    """custom_params.thinking_budget bounds this request (not the server's 6), constrained or not; the server's
    bound holds for an unconstrained request too."""
    constrained = _chat(qwen3, response_format=JSON_FORMAT, logprobs=True, custom_params={"thinking_budget": 1})
    assert _think_end_index(constrained["choices"][0]) <= 1
    jsonschema.validate(json.loads(constrained["choices"][0]["message"]["content"]), PERSON)
    free = _chat(qwen3, logprobs=True, ignore_eos=True, max_tokens=20, custom_params={"thinking_budget": 2})
    assert _think_end_index(free["choices"][0]) <= 2 and free["choices"][0]["message"]["reasoning_content"]
    server_bound = _chat(qwen3, logprobs=True, ignore_eos=True, max_tokens=20)
    assert _think_end_index(server_bound["choices"][0]) <= 6
    zero = _chat(qwen3, logprobs=True, ignore_eos=True, max_tokens=8, custom_params={"thinking_budget": 0})
    assert _think_end_index(zero["choices"][0]) == 0 and not zero["choices"][0]["message"]["reasoning_content"]
    r = qwen3.post("/v1/completions", json={"model": "m", "prompt": "<|im_start|>assistant\n<think>\n",
                                            "max_tokens": 12, "temperature": 0, "ignore_eos": True,
                                            "custom_params": {"thinking_budget": 3}, "logprobs": 0})
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["logprobs"]["tokens"].index("</think>") <= 3
    for bad in ({"thinking_budget": -1}, {"thinking_budget": 2, "processor": "x"}, {"thinking_budget": True}):
        r = qwen3.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "custom_params": bad})
        assert r.status_code == 400 and "custom_params" in r.text, r.text


def _message(srv, **body):
    r = srv.post("/v1/messages", json={"model": "m", "max_tokens": 80, "temperature": 0,
                                       "messages": [{"role": "user", "content": "Weather in Paris?"}], **body})
    assert r.status_code == 200, r.text
    return r.json()


def test_anthropic_messages_thinking_blocks(qwen3):
    """/v1/messages on a reasoning model: a thinking block before the tool_use (its input valid), streamed as
    thinking_delta then input_json_delta; thinking.budget_tokens bounds it, thinking disabled removes it."""
    tool = {"tools": [{"name": "get_weather", "input_schema": WEATHER}],
            "tool_choice": {"type": "tool", "name": "get_weather"}}
    out = _message(qwen3, **tool)
    kinds = [b["type"] for b in out["content"]]
    assert kinds == ["thinking", "tool_use"] and out["content"][0]["thinking"] and out["stop_reason"] == "tool_use"
    jsonschema.validate(out["content"][1]["input"], WEATHER)
    zero = _message(qwen3, thinking={"type": "enabled", "budget_tokens": 0}, **tool)
    assert zero["content"][0] == {"type": "thinking", "thinking": "", "signature": ""}
    jsonschema.validate(zero["content"][1]["input"], WEATHER)
    off = _message(qwen3, thinking={"type": "disabled"}, **tool)
    assert [b["type"] for b in off["content"]] == ["tool_use"]
    r = qwen3.post("/v1/messages", json={"model": "m", "max_tokens": 80, "temperature": 0, "stream": True,
                                         "messages": [{"role": "user", "content": "Weather?"}], **tool})
    events = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    starts = [e["content_block"]["type"] for e in events if e["type"] == "content_block_start"]
    deltas = [e["delta"] for e in events if e["type"] == "content_block_delta"]
    assert starts == ["thinking", "tool_use"] and deltas[0]["type"] == "thinking_delta"
    args = "".join(d["partial_json"] for d in deltas if d["type"] == "input_json_delta")
    jsonschema.validate(json.loads(args), WEATHER)
    bad = qwen3.post("/v1/messages", json={"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
                                           "thinking": {"type": "enabled"}})
    assert bad.status_code == 400 and "thinking must be" in bad.text


@pytest.fixture(scope="module", params=["gemma2"])  # Phi-3 (PHI3_TEMPLATE) passes too; one server start each
def family_server(request, tmp_path_factory):
    path = pathlib.Path(make_family_model(tmp_path_factory.mktemp(request.param) / request.param, request.param))
    (path / "chat_template.jinja").write_text(GEMMA_TEMPLATE if request.param == "gemma2" else PHI3_TEMPLATE)
    with run_server("--model", str(path), "--max-total-tokens", "8192", "--num-threads", "1") as s:
        yield s


def test_family_tools_json_and_prefix_cache(family_server):
    """Tools (the generic format: these templates render none), a JSON schema, and the shared prompt cached."""
    calls = _chat(family_server, tools=TOOLS, tool_choice="required", n=2, temperature=0.8, seed=1,
                  parallel_tool_calls=False, max_tokens=160)
    for ch in calls["choices"]:
        assert ch["finish_reason"] == "tool_calls" and "reasoning_content" not in ch["message"]
        _check_calls(ch["message"])
    first = _chat(family_server, response_format=JSON_FORMAT)
    again = _chat(family_server, response_format=JSON_FORMAT)
    for out in (first, again):
        jsonschema.validate(json.loads(out["choices"][0]["message"]["content"]), PERSON)
    assert again["choices"][0]["message"] == first["choices"][0]["message"]
    assert again["usage"]["prompt_tokens_details"]["cached_tokens"] >= first["usage"]["prompt_tokens"] - 1
    r = family_server.post("/v1/chat/completions", json={"model": "m", "messages": MSGS, "max_tokens": 4,
                                                         "custom_params": {"thinking_budget": 4}})
    assert r.status_code == 400 and "needs a reasoning model served with --reasoning-parser" in r.text
    r = family_server.post("/v1/messages", json={"model": "m", "max_tokens": 4, "messages": MSGS[1:],
                                                 "thinking": {"type": "enabled", "budget_tokens": 4}})
    assert r.status_code == 400 and "thinking needs a reasoning model" in r.text

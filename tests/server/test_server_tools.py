"""Tool calling over the OpenAI API with the real `openai` client: every tool_choice mode, streaming and not,
structural tags on /v1 and /generate, the client's structured-output helper, bad input, a native template."""

from __future__ import annotations

import json
import shutil
from typing import Literal

import jsonschema
import pytest

from sglpy.runtime.testing.server_harness import run_server

openai = pytest.importorskip("openai",
    reason="openai is not installed (the GPU image lacks it unless `make gpu-bundle` carried it)")
pydantic = pytest.importorskip("pydantic",
    reason="pydantic is not installed (the GPU image lacks it unless `make gpu-bundle` carried it)")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["c", "f"]}},
           "required": ["city", "unit"], "additionalProperties": False}
ADD = {"type": "object", "properties": {"a": {"type": "integer", "minimum": -999, "maximum": 999},
                                        "b": {"type": "integer", "minimum": -999, "maximum": 999}},
       "required": ["a", "b"], "additionalProperties": False}
BOOK = {"type": "object", "properties": {
    "date": {"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
    "guests": {"type": "integer", "minimum": 1, "maximum": 8}, "vip": {"type": "boolean"},
    "tags": {"type": "array", "items": {"enum": ["quiet", "window", "late"]}, "maxItems": 3}},
    "required": ["date", "guests"], "additionalProperties": False}
SCHEMAS = {"get_weather": WEATHER, "add": ADD, "book_table": BOOK}
TOOLS = [{"type": "function", "function": {"name": n, "description": f"the {n} tool", "parameters": p}}
         for n, p in SCHEMAS.items()]
MSGS = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]
# llama3's trigger {"name" is the tokens {" name ": of the default tokenizer; pushing them makes a random model call
LLAMA3_PUSH = {"39428": 12, "1245": 12, "1799": 12}


def check_call(call) -> dict:
    """A call's arguments parse and validate against its tool's schema; returns them."""
    assert call.type == "function" and call.id.startswith("call_")
    args = json.loads(call.function.arguments)
    jsonschema.validate(args, SCHEMAS[call.function.name])
    return args


@pytest.fixture(scope="module")
def srv(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "32768", "--max-context-len", "2048",
                    "--num-threads", "1") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_required_calls_always_validate_at_temperature_1(client):
    calls = 0
    for seed in range(3):
        r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", n=10,
                                           temperature=1.0, seed=seed, max_tokens=300, parallel_tool_calls=False)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls", ch
            assert len(ch.message.tool_calls) == 1
            for c in ch.message.tool_calls:
                check_call(c)
                calls += 1
    assert calls >= 30


@pytest.mark.parametrize("parallel", [None, False])
def test_named_choice_makes_exactly_one_call(client, parallel):
    """As vLLM and SGLang (instructor's TOOLS mode, LangChain's bind_tools(tool_choice=name) rely on it)."""
    extra = {} if parallel is None else {"parallel_tool_calls": parallel}  # None: the client's default (true)
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, n=8, temperature=1.0, max_tokens=300,
                                       tool_choice={"type": "function", "function": {"name": "book_table"}}, **extra)
    for ch in r.choices:
        assert ch.finish_reason == "tool_calls", ch
        assert [c.function.name for c in ch.message.tool_calls] == ["book_table"]
        check_call(ch.message.tool_calls[0])
    stream = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, temperature=1.0, max_tokens=300,
                                            tool_choice={"type": "function", "function": {"name": "add"}},
                                            stream=True, **extra)
    names, reasons = [], []
    for chunk in stream:
        for ch in chunk.choices:
            names += [d.function.name for d in ch.delta.tool_calls or [] if d.function and d.function.name]
            reasons += [ch.finish_reason] if ch.finish_reason else []
    assert names == ["add"] and reasons == ["tool_calls"]


def test_parallel_tool_calls(client):
    # parallel: after each call the model may end (EOS) or start another, so a random model may run to the cap
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", n=6,
                                       temperature=1.0, max_tokens=300)
    for ch in r.choices:
        assert ch.finish_reason in ("tool_calls", "length") and ch.message.tool_calls
        for c in ch.message.tool_calls:
            check_call(c)


def test_none_calls_nothing(client):
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="none", max_tokens=16)
    assert r.choices[0].message.tool_calls is None
    assert isinstance(r.choices[0].message.content, str)


def _collect_stream(stream) -> list[dict]:
    """Per choice: content text, calls rebuilt from delta.tool_calls, finish_reason."""
    out: dict[int, dict] = {}
    for chunk in stream:
        for ch in chunk.choices:
            o = out.setdefault(ch.index, {"content": "", "calls": {}, "finish": None})
            o["content"] += ch.delta.content or ""
            for d in ch.delta.tool_calls or []:
                if d.id is not None:  # the first delta of a call: id, type and the whole name
                    assert d.index not in o["calls"] and d.type == "function" and d.function.name
                    o["calls"][d.index] = {"id": d.id, "name": d.function.name, "arguments": ""}
                o["calls"][d.index]["arguments"] += d.function.arguments or ""
            if ch.finish_reason:
                o["finish"] = ch.finish_reason
    return [out[i] for i in sorted(out)]


def test_required_streams_openai_shaped_tool_call_deltas(client):
    stream = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", n=4,
                                            temperature=1.0, max_tokens=300, stream=True, parallel_tool_calls=False)
    for o in _collect_stream(stream):
        assert o["finish"] == "tool_calls" and o["calls"] and not o["content"].strip()
        for c in o["calls"].values():
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])


def test_a_tool_loop_conversation_renders(client):
    first = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, max_tokens=300,
                                           tool_choice={"type": "function", "function": {"name": "add"}})
    call = first.choices[0].message.tool_calls[0]
    msgs = MSGS + [first.choices[0].message.model_dump(exclude_none=True),
                   {"role": "tool", "tool_call_id": call.id, "content": "5"}]
    r = client.chat.completions.create(model="m", messages=msgs, tools=TOOLS, tool_choice="none", max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length")


def test_the_examples_openai_loop_runs(srv):
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "examples"))
    try:
        import tool_loop

        call, result, answer = tool_loop.openai_loop(srv.url)
    finally:
        sys.path.pop(0)
    assert call["function"]["name"] in tool_loop.IMPLS and isinstance(answer, str)


def test_bad_tool_input_is_a_400_naming_the_field_and_the_engine_keeps_serving(client):
    bad = [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": {"type": "string", "pattern": "(unclosed"}}}}}]
    cases = [
        (dict(tools=bad, tool_choice="required"), "tools[0].function.parameters"),
        (dict(tools=TOOLS + TOOLS[:1]), "tools[3].function.name"),
        (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice"),
        (dict(tool_choice="required"), "tool_choice"),
        (dict(tools=[{"type": "code_interpreter"}]), "tools[0].type"),
        (dict(tools=TOOLS, messages=MSGS + [{"role": "tool", "tool_call_id": "call_x", "content": "1"}]),
         "messages[1].tool_call_id"),
    ]
    for kw, param in cases:
        kw = {"messages": MSGS, **kw}
        for stream in (False, True):
            with pytest.raises(openai.BadRequestError) as e:
                client.chat.completions.create(model="m", max_tokens=8, stream=stream, **kw)
            assert e.value.status_code == 400
            assert e.value.body["param"] == param, e.value.body
        r = client.chat.completions.create(model="m", messages=MSGS, max_tokens=4)
        assert r.choices[0].message.content is not None


def test_structural_tag_response_format_and_generate_param(srv, client):
    tag = {"type": "structural_tag", "triggers": ["<"],
           "structures": [{"begin": "<w>", "schema": WEATHER, "end": "</w>"}]}
    r = client.chat.completions.create(model="m", messages=MSGS, response_format=tag, max_tokens=60, n=4,
                                       logit_bias={"44": 10})  # "<": a random model opens tags often
    seen = 0  # every "<" of the free text must open a <w> region holding a valid document
    for ch in r.choices:
        text = ch.message.content
        rest = text
        while "<" in rest:
            rest = rest[rest.index("<"):]
            if not rest.startswith("<w>"):
                assert ch.finish_reason == "length" and "<w>".startswith(rest), text
                break
            body, sep, rest = rest[3:].partition("</w>")
            if not sep:
                assert ch.finish_reason == "length", text
                break
            jsonschema.validate(json.loads(body), WEATHER)
            seen += 1
    assert seen >= 1
    body = {"text": "x", "sampling_params": {"structural_tag": json.dumps({**tag, "triggers": ["<w>"]}),
                                             "max_new_tokens": 40, "logit_bias": {"44": 10}}}
    assert srv.post("/generate", body).status_code == 200
    bad = srv.post("/generate", {"text": "x", "sampling_params": {"structural_tag": {"structures": []}}})
    assert bad.status_code == 400 and "structural_tag" in bad.json()["error"]["message"]


class Booking(pydantic.BaseModel):
    """The client's structured-outputs helper sends this as a strict json_schema."""

    day: Literal["mon", "tue", "wed"]
    guests: pydantic.conint(ge=1, le=8)
    vip: bool


def test_client_parse_helper_returns_the_pydantic_object(client):
    r = client.chat.completions.parse(model="m", messages=MSGS, response_format=Booking, max_tokens=60)
    got = r.choices[0].message.parsed
    assert isinstance(got, Booking), r


@pytest.fixture(scope="module")
def llama3_srv(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "32768", "--max-context-len", "2048",
                    "--num-threads", "1", "--tool-call-parser", "llama3") as s:
        yield s


def test_auto_every_call_that_appears_validates_streaming_and_not(llama3_srv):
    client = openai.OpenAI(base_url=llama3_srv.url + "/v1", api_key="unused", max_retries=0, timeout=300)
    seen = 0
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, n=8, temperature=1.0, max_tokens=200,
                                       logit_bias=LLAMA3_PUSH)
    for ch in r.choices:
        for c in ch.message.tool_calls or []:
            check_call(c)
            seen += 1
        if ch.message.tool_calls:
            assert ch.finish_reason in ("tool_calls", "length")
    stream = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, n=8, temperature=1.0,
                                            max_tokens=200, logit_bias=LLAMA3_PUSH, stream=True)
    for o in _collect_stream(stream):
        for c in o["calls"].values():
            if o["finish"] == "length" and c is list(o["calls"].values())[-1]:
                continue  # the last call may be cut short by max_tokens
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])
            seen += 1
    assert seen >= 4
    r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required",
                                       temperature=1.0, max_tokens=300, parallel_tool_calls=False)
    assert r.choices[0].finish_reason == "tool_calls"


HERMES_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\nYou may call functions.\n<tools>\n{%- for t in tools %}\n{{ t | tojson }}"
    "{%- endfor %}\n</tools>\nReturn calls as <tool_call>\n{\"name\": <name>, \"arguments\": <args>}\n</tool_call>"
    "<|im_end|>\n{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{%- elif m.tool_calls %}<|im_start|>assistant\n{%- for c in m.tool_calls %}\n<tool_call>\n"
    "{\"name\": \"{{ c.function.name }}\", \"arguments\": {{ c.function.arguments | tojson }}}\n</tool_call>"
    "{%- endfor %}<|im_end|>\n"
    "{%- else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{%- endif %}")


@pytest.fixture(scope="module")
def hermes_model(tiny_model_path, tmp_path_factory):
    """The tiny model with a Hermes/Qwen-style template that renders tools (written here, no download)."""
    path = tmp_path_factory.mktemp("hermes") / "tiny-hermes"
    shutil.copytree(tiny_model_path, path)
    cfg_path = path / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text())
    cfg["chat_template"] = HERMES_TEMPLATE
    cfg_path.write_text(json.dumps(cfg))
    (path / "chat_template.jinja").unlink(missing_ok=True)
    return str(path)


def test_native_template_renders_tools_and_history(hermes_model):
    from transformers import AutoTokenizer

    from sglpy.runtime.tools import ToolCall, detect, parse_tools, render_conversation

    tok = AutoTokenizer.from_pretrained(hermes_model)
    setup = detect(tok.chat_template)
    assert setup.native and setup.format.name == "hermes"
    call = ToolCall("add", '{"a": 2, "b": 3}', "call_1")
    msgs = [*MSGS, {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "content": "5", "tool_call_id": "call_1"}]
    out, extra = render_conversation(msgs, setup, parse_tools(TOOLS))
    text = tok.apply_chat_template(out, tokenize=False, add_generation_prompt=True, **extra)
    assert '"name": "book_table"' in text and "<tools>" in text
    assert '<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>' in text
    assert "<tool_response>\n5\n</tool_response>" in text


def test_native_template_server_calls_in_its_format(hermes_model):
    from transformers import AutoTokenizer

    from sglpy.runtime.tools import detect, parse_tools, render_conversation

    tok = AutoTokenizer.from_pretrained(hermes_model)
    out, extra = render_conversation(MSGS, detect(tok.chat_template), parse_tools(TOOLS))
    want_prompt = len(tok.encode(tok.apply_chat_template(out, tokenize=False, add_generation_prompt=True, **extra),
                                 add_special_tokens=False))
    with run_server("--model", hermes_model, "--max-total-tokens", "16384", "--max-context-len", "2048",
                    "--num-threads", "1") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=300)
        r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", n=4,
                                           temperature=1.0, max_tokens=300, parallel_tool_calls=False)
        assert r.usage.prompt_tokens == want_prompt  # the template rendered the tools itself
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls"
            for c in ch.message.tool_calls:
                check_call(c)


@pytest.mark.slow
def test_generic_format_on_the_default_model():
    with run_server("--max-total-tokens", "16384") as s:
        client = openai.OpenAI(base_url=s.url + "/v1", api_key="unused", max_retries=0, timeout=600)
        r = client.chat.completions.create(model="m", messages=MSGS, tools=TOOLS, tool_choice="required", n=4,
                                           temperature=1.0, max_tokens=200, parallel_tool_calls=False)
        for ch in r.choices:
            assert ch.finish_reason == "tool_calls"
            for c in ch.message.tool_calls:
                check_call(c)
        weather = [{"role": "user", "content": "What's the weather in Oslo? Use the tool."}]
        r = client.chat.completions.create(model="m", messages=weather, tools=TOOLS, temperature=0, max_tokens=120)
        for c in r.choices[0].message.tool_calls or []:  # auto: whether it calls is the model's choice
            check_call(c)
        stream = client.chat.completions.create(model="m", messages=weather, tools=TOOLS, tool_choice="required",
                                                temperature=0, max_tokens=120, stream=True, parallel_tool_calls=False)
        (o,) = _collect_stream(stream)
        assert o["finish"] == "tool_calls"
        for c in o["calls"].values():
            jsonschema.validate(json.loads(c["arguments"]), SCHEMAS[c["name"]])

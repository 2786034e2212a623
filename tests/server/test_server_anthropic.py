"""POST /v1/messages (Anthropic's Messages API) on the fake engine: shapes, streaming events, prefill, stop
sequences, and clear 400s for what it does not take. The constrained tool path runs on a real model in
tests/frontend/test_frontend_hosted_server.py."""

import json

import pytest

from sglpy.runtime.testing.server_harness import FAKE, run_server

anthropic = pytest.importorskip("anthropic")


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE, env={"SGLPY_FAKE_TOKEN_DELAY": "0.02"}) as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return anthropic.Anthropic(base_url=srv.url, api_key="unused", max_retries=0)


def chat_text(srv, messages, max_tokens, **kw):
    """What /v1/chat/completions answers for the same conversation (the same template and engine)."""
    body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0, **kw}
    return srv.post("/v1/chat/completions", body).json()["choices"][0]["message"]["content"]


def test_message_shape_system_and_usage(srv, client):
    msg = client.messages.create(model="m", max_tokens=6, system="Be brief.",
                                 messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]}])
    assert msg.type == "message" and msg.role == "assistant" and msg.id.startswith("msg_")
    assert [b.type for b in msg.content] == ["text"] and len(msg.content[0].text) == 6
    assert msg.stop_reason == "max_tokens" and msg.stop_sequence is None
    assert msg.usage.output_tokens == 6 and msg.usage.input_tokens > 0
    same = chat_text(srv, [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}], 6)
    assert msg.content[0].text == same  # system and user render through the model's template, like chat


def test_prefill_is_continued(srv, client):
    convo = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Sure:"}]
    msg = client.messages.create(model="m", max_tokens=5, messages=convo)
    assert msg.content[0].text == chat_text(srv, convo, 5, continue_final_message=True)


def test_stop_sequence(client):
    base = client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])
    stop = base.content[0].text[3]
    msg = client.messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}],
                                 stop_sequences=[stop])
    assert msg.content[0].text == base.content[0].text[:3]
    assert msg.stop_reason == "stop_sequence" and msg.stop_sequence == stop


def test_stream_events(srv, client):
    with client.messages.stream(model="m", max_tokens=5, messages=[{"role": "user", "content": "hi"}]) as s:
        pieces = list(s.text_stream)
        final = s.get_final_message()
    assert "".join(pieces) == final.content[0].text and len(pieces) == 5
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 5
    r = srv.post("/v1/messages", {"model": "m", "max_tokens": 2, "stream": True,
                                  "messages": [{"role": "user", "content": "hi"}]})
    events = [line[len("event: "):] for line in r.text.splitlines() if line.startswith("event: ")]
    assert events == ["message_start", "content_block_start", "content_block_delta", "content_block_delta",
                      "content_block_stop", "message_delta", "message_stop"]
    data = [json.loads(line[6:]) for line in r.text.splitlines() if line.startswith("data: ")]
    assert [d["type"] for d in data] == events


@pytest.mark.parametrize("body,needle", [
    ({"bogus": 1}, "unknown field"),
    ({"messages": [{"role": "user", "content": [{"type": "image", "source": {}}]}]}, "only text blocks"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "role: user|assistant"),
    ({"tools": [{"name": "a", "input_schema": {"type": "object"}}]}, "tool_choice 'auto'"),
    ({"tools": [{"name": "a", "input_schema": {}}], "tool_choice": {"type": "tool", "name": "b"}}, "not in tools"),
    ({"thinking": {"type": "enabled", "budget_tokens": 10}}, "thinking"),
    ({"max_tokens": 0}, "max_tokens"),
])
def test_refusals_are_400_naming_the_problem(srv, body, needle):
    full = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}], **body}
    r = srv.post("/v1/messages", full)
    assert r.status_code == 400 and needle in r.json()["error"]["message"], r.text


def test_tool_constraint_reaches_the_engine(srv):
    # the fake engine refuses constraints: the forced tool's schema must have been sent as one
    r = srv.post("/v1/messages", {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}],
                                  "tools": [{"name": "a", "input_schema": {"type": "object"}}],
                                  "tool_choice": {"type": "any"}})
    assert r.status_code == 400 and "constrain" in r.text.lower(), r.text

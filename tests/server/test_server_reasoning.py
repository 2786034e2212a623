"""Reasoning models (--reasoning-parser): reasoning_content beside content (streamed and not), separate_reasoning,
enable_thinking, and JSON-schema constraints that start after `</think>` with --max-thinking-tokens forcing it;
on a tiny random Qwen3 whose chat template opens `<think>`. Plus the parser and the thinking guide alone."""

from __future__ import annotations

import json

import jsonschema
import pytest
import requests

from sglpy.runtime.engine import Engine
from sglpy.runtime.engine.reasoning_guide import ThinkingGuide, ThinkTokens
from sglpy.runtime.reasoning import ReasoningStream, reasoning_format, split_reasoning, thinking_open
from sglpy.runtime.testing.server_harness import run_server, sse_events
from sglpy.runtime.testing.tiny_model import make_reasoning_model, tokenizer_source

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 99}},
          "required": ["name", "age"], "additionalProperties": False}
QWEN3, R1 = reasoning_format("qwen3"), reasoning_format("deepseek-r1")


@pytest.fixture(scope="module")
def reasoner(tmp_path_factory):
    return make_reasoning_model(tmp_path_factory.mktemp("reasoner") / "qwen3-think")


@pytest.mark.parametrize("fmt,text,prompt_open,want", [
    (QWEN3, "<think>\nhmm </thi a bit\n</think>\n\n{\"a\": 1}", None, ("hmm </thi a bit", '{"a": 1}')),
    (QWEN3, "plain answer", None, (None, "plain answer")),
    (QWEN3, "I think</think> ok", True, ("I think", "ok")),
    (QWEN3, "<think>x</think>y", False, (None, "<think>x</think>y")),
    (R1, "I ponder.</think>answer", None, ("I ponder.", "answer")),
    (R1, "never ends", None, ("never ends", "")),
])
def test_split_whole_and_streamed_agree(fmt, text, prompt_open, want):
    assert split_reasoning(fmt, text, prompt_open) == type(split_reasoning(fmt, "", None))(*want)
    for step in (1, 2, 3, 5, len(text)):
        stream, r, c = ReasoningStream(fmt, prompt_open), "", ""
        for i in range(0, len(text), step):
            dr, dc = stream.feed(text[i:i + step])
            r, c = r + dr, c + dc
        dr, dc = stream.feed("", final=True)
        r, c = r + dr, c + dc
        assert (r.strip() or None) == (want[0] or None) and c == want[1], (step, r, c)


def test_thinking_open_reads_the_prompt_tail():
    assert thinking_open(QWEN3, "<|im_start|>assistant\n<think>\n") is True
    assert thinking_open(QWEN3, "<|im_start|>assistant\n<think>\n\n</think>\n\n") is False
    assert thinking_open(QWEN3, "old</think>answer<|im_end|><|im_start|>assistant\n") is None
    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        reasoning_format("o1")


def test_thinking_guide_masks_eos_bounds_thinking_then_hands_over(reasoner):
    from sglpy.runtime.engine.constrained import ConstrainedDecoding
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reasoner)
    cd = ConstrainedDecoding(tok, 49160, {2}, workers=0)
    try:
        inner = cd.compile("regex", "(yes|no)").result()
        think = ThinkTokens.from_tokenizer(QWEN3, tok, 3)
        g = ThinkingGuide(inner, think)
        s = g.initial_state
        assert not g.token_allowed(s, 2) and g.token_allowed(s, 100) and g.forced_string(s) == ""
        for t in (100, 101, 102):
            s = g.advance(s, t)
        assert [t for t in (2, 100, think.end_id) if g.token_allowed(s, t)] == [think.end_id]  # budget spent
        s = g.advance(s, think.end_id)
        assert s == ("answer", inner.initial_state) and not g.is_final(s)
        assert g.token_allowed(s, tok.encode("yes", add_special_tokens=False)[0])
    finally:
        cd.close()
    with pytest.raises(ValueError, match="needs '</think>' as one token"):
        ThinkTokens.from_tokenizer(QWEN3, AutoTokenizer.from_pretrained(tokenizer_source()), None)


def test_engine_json_after_thinking(reasoner):
    """12 sampled requests: each thinks (at most 8 tokens, then `</think>` is forced) and answers valid JSON."""
    eng = Engine(reasoner, reasoning_parser="qwen3", max_thinking_tokens=8, max_total_tokens=8192)
    try:
        tok = eng.tokenizer
        prompts = [tok.apply_chat_template([{"role": "user", "content": f"Person {i} as JSON"}], tokenize=False,
                                           add_generation_prompt=True) for i in range(12)]
        outs = eng.generate(prompts, [{"max_new_tokens": 80, "temperature": 0.8, "seed": i,
                                       "json_schema": json.dumps(PERSON)} for i in range(12)])
        end = tok.convert_tokens_to_ids("</think>")
        for o in outs:
            ids = o["output_ids"]
            assert end in ids and ids.index(end) <= 8, ids  # the budget forced `</think>` at the latest
            split = split_reasoning(QWEN3, o["text"], True)
            assert split.reasoning is not None
            jsonschema.validate(json.loads(split.content), PERSON)
        assert sum(o["meta_info"]["jump_forward_tokens"] for o in outs) > 0  # jump-forward after </think>
    finally:
        eng.shutdown()


@pytest.fixture(scope="module")
def srv(reasoner):
    with run_server("--model", reasoner, "--reasoning-parser", "qwen3", "--max-thinking-tokens", "8",
                    "--max-total-tokens", "8192", "--num-threads", "1") as s:
        yield s


def _chat(srv, **body):
    body = {"model": "m", "messages": [{"role": "user", "content": "A person as JSON"}], "max_tokens": 80,
            "temperature": 0, "response_format": {"type": "json_schema",
                                                  "json_schema": {"name": "p", "schema": PERSON}}, **body}
    return srv.post("/v1/chat/completions", json=body)


def test_chat_reasoning_content_streamed_and_not(srv):
    r = _chat(srv)
    assert r.status_code == 200, r.text
    msg = r.json()["choices"][0]["message"]
    assert msg["reasoning_content"] and "</think>" not in msg["content"]
    jsonschema.validate(json.loads(msg["content"]), PERSON)
    events = sse_events(_chat(srv, stream=True))
    deltas = [e["choices"][0]["delta"] for e in events if e != "[DONE]" and e["choices"]]
    reasoning = "".join(d.get("reasoning_content", "") for d in deltas)
    content = "".join(d.get("content") or "" for d in deltas)
    assert reasoning.strip() == msg["reasoning_content"] and content == msg["content"]
    assert any("reasoning_content" in d and not d.get("content") for d in deltas)


def test_separate_reasoning_false_and_enable_thinking_false(srv):
    whole = _chat(srv, separate_reasoning=False).json()["choices"][0]["message"]
    assert "reasoning_content" not in whole and "</think>" in whole["content"]
    off = _chat(srv, chat_template_kwargs={"enable_thinking": False}).json()["choices"][0]["message"]
    assert off["reasoning_content"] is None  # the template closed the thinking: the constraint starts at once
    jsonschema.validate(json.loads(off["content"]), PERSON)


def test_generate_max_thinking_tokens_per_request(srv, reasoner):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(reasoner)
    end = tok.convert_tokens_to_ids("</think>")
    prompt = tok.apply_chat_template([{"role": "user", "content": "JSON please"}], tokenize=False,
                                     add_generation_prompt=True)
    r = srv.post("/generate", json={"text": prompt, "max_thinking_tokens": 2, "sampling_params": {
        "max_new_tokens": 60, "temperature": 0, "json_schema": json.dumps(PERSON)}})
    assert r.status_code == 200, r.text
    ids = r.json()["output_ids"]
    assert ids.index(end) <= 2  # the request's bound, not the server's 8
    jsonschema.validate(json.loads(split_reasoning(QWEN3, r.json()["text"], True).content), PERSON)
    bad = srv.post("/generate", json={"text": prompt, "max_thinking_tokens": -1})
    assert bad.status_code == 400 and "max_thinking_tokens" in bad.text


def test_bad_parser_flag_is_refused():
    from sglpy.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="reasoning_parser must be one of"):
        EngineConfig(reasoning_parser="nope")
    with pytest.raises(ValueError, match="max_thinking_tokens must be an int >= 0"):
        EngineConfig(max_thinking_tokens=-1)
    assert requests  # the harness's client

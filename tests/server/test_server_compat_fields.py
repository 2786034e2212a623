"""Fields other clients send (fake engine): /tokenize's `prompt` (SGLang 0.5.23's name for `text`), and
/v1/completions `echo` + `logprobs` (the prompt's logprobs first, as vLLM and OpenAI's legacy API answer it;
sgl.OpenAI scores select choices with it)."""

import pytest

from sglpy.runtime.testing.server_harness import FAKE, run_server


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE) as s:
        yield s


def test_tokenize_accepts_sglangs_prompt_field(srv):
    by_text = srv.post("/tokenize", {"text": "hey"}).json()
    by_prompt = srv.post("/tokenize", {"prompt": "hey", "model": "x"}).json()  # SGLang's client body
    assert by_prompt["tokens"] == by_text["tokens"] and by_prompt["count"] == 3
    assert srv.post("/tokenize", {"prompt": ["a", "bc"]}).json()["count"] == [1, 2]


def test_tokenize_needs_exactly_one_of_text_and_prompt(srv):
    for body in ({}, {"text": "a", "prompt": "a"}):
        r = srv.post("/tokenize", body)
        assert r.status_code == 400 and "text or prompt" in r.json()["error"]["message"]
    assert srv.post("/tokenize", {"prompt": 3}).status_code == 400


def test_completions_echo_with_logprobs_returns_the_prompt_logprobs(srv):
    r = srv.post("/v1/completions", {"prompt": ["ab", "xyz"], "echo": True, "logprobs": 0, "max_tokens": 1,
                                     "temperature": 0})
    assert r.status_code == 200, r.text
    for choice, prompt in zip(r.json()["choices"], ["ab", "xyz"]):
        lp = choice["logprobs"]
        assert choice["text"].startswith(prompt) and len(choice["text"]) == len(prompt) + 1
        assert lp["tokens"][:len(prompt)] == list(prompt)  # byte-level fake tokenizer: one token per character
        assert lp["token_logprobs"][0] is None and lp["token_logprobs"][1:len(prompt)] == [-1.0] * (len(prompt) - 1)
        assert lp["text_offset"] == list(range(len(prompt) + 1))
    r = srv.post("/v1/completions", {"prompt": "ab", "echo": True, "logprobs": 0, "max_tokens": 1, "stream": True})
    assert r.status_code == 400 and "streaming" in r.json()["error"]["message"]

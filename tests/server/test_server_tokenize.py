"""POST /tokenize takes SGLang 0.5.23's request field `prompt` as well as sglpy's `text` (fake engine)."""

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

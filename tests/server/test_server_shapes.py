"""Response shapes that need many samples or exact bookkeeping, against the fake engine (fast, deterministic)."""

import pytest
import requests

from sglpy.runtime.testing.server_harness import FAKE, run_server, sse_events


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE, "--served-model-name", "fake", env={"SGLPY_FAKE_TOKEN_DELAY": "0.002"}) as s:
        yield s


def test_completions_batch_prompts_times_n(srv):
    out = srv.post("/v1/completions", {"model": "fake", "prompt": ["ab", "cde"], "max_tokens": 3, "n": 2}).json()
    assert [c["index"] for c in out["choices"]] == [0, 1, 2, 3]
    assert out["usage"] == {"prompt_tokens": 2 + 3, "completion_tokens": 4 * 3, "total_tokens": 5 + 12,
                            "prompt_tokens_details": {"cached_tokens": 0}}
    ids = srv.post("/v1/completions", {"model": "fake", "prompt": [[10, 11], [12]], "max_tokens": 1}).json()
    assert ids["usage"]["prompt_tokens"] == 3 and len(ids["choices"]) == 2


def test_completions_echo_and_stop(srv):
    plain = srv.post("/v1/completions", {"prompt": "ab", "max_tokens": 6}).json()["choices"][0]["text"]
    echo = srv.post("/v1/completions", {"prompt": "ab", "max_tokens": 6, "echo": True}).json()["choices"][0]
    assert echo["text"] == "ab" + plain
    stop = plain[3]
    out = srv.post("/v1/completions", {"prompt": "ab", "max_tokens": 6, "stop": [stop]}).json()["choices"][0]
    assert out["text"] == plain[:3] and out["finish_reason"] == "stop" and out["matched_stop"] == stop


def test_chat_stream_with_n_interleaves_choices(srv):
    r = srv.post("/v1/chat/completions", {"model": "fake", "messages": [{"role": "user", "content": "hi"}],
                                          "max_tokens": 5, "n": 3, "stream": True,
                                          "stream_options": {"include_usage": True}}, stream=True)
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    assert all(c["object"] == "chat.completion.chunk" and c["model"] == "fake" for c in chunks)
    assert len({c["id"] for c in chunks}) == 1
    usage = chunks[-1]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 15
    texts = {0: "", 1: "", 2: ""}
    finishes = {}
    for c in chunks[:-1]:
        choice = c["choices"][0]
        texts[choice["index"]] += choice["delta"].get("content", "")
        if choice["finish_reason"]:
            finishes[choice["index"]] = choice["finish_reason"]
    assert finishes == {0: "length", 1: "length", 2: "length"}
    assert all(len(t) == 5 for t in texts.values())
    firsts = [c["choices"][0] for c in chunks[:3]]
    assert all(f["delta"] == {"role": "assistant", "content": ""} for f in firsts)


def test_chat_template_is_applied_by_the_tokenizer(srv):
    out = srv.post("/v1/chat/completions", {"messages": [{"role": "system", "content": "S"},
                                                         {"role": "user", "content": [{"type": "text", "text": "U"}]}],
                                            "max_tokens": 1}).json()
    # fake template: "<|system|>S\n<|user|>U\n<|assistant|>" = 33 byte tokens
    assert out["usage"]["prompt_tokens"] == len("<|system|>S\n<|user|>U\n<|assistant|>")


def test_completion_stream_logprob_offsets(srv):
    r = srv.post("/v1/completions", {"prompt": "zz", "max_tokens": 4, "logprobs": 1, "stream": True}, stream=True)
    chunks = [e for e in sse_events(r) if e != "[DONE]"]
    offsets = [o for c in chunks if c["choices"][0]["logprobs"] for o in c["choices"][0]["logprobs"]["text_offset"]]
    assert offsets == [0, 1, 2, 3]


def test_put_generate_and_request_id_header(srv):
    r = requests.put(srv.url + "/generate", json={"text": "x", "rid": "put-1", "sampling_params": {"max_new_tokens": 1}},
                     timeout=30)
    assert r.status_code == 200 and r.headers["X-Request-Id"] == "put-1" and r.json()["meta_info"]["id"] == "put-1"


def test_one_log_line_per_finished_request(srv):
    srv.post("/generate", {"text": "abc", "rid": "log-me", "sampling_params": {"max_new_tokens": 3}})
    lines = [line for line in srv.log().splitlines() if "rid=log-me " in line]
    assert len(lines) == 1
    assert ("route=/generate outcome=ok finish=length prompt_tokens=3 completion_tokens=3 cached_tokens=0"
            in lines[0]) and "e2e=" in lines[0] and "ttft=" in lines[0]


def test_get_model_info_and_models(srv):
    info = srv.get("/get_model_info").json()
    assert info["model_path"] == "fake-model" and info["chat_template"].startswith("{% for m in messages %}")
    assert info["special_tokens"]["eos_token"] == "</s>"
    assert srv.get("/v1/models").json()["data"][0]["id"] == "fake"
    assert srv.get("/v1/models/fake").json()["id"] == "fake"
    assert srv.get("/v1/models/other").status_code == 404


def _wait_idle(srv, timeout=5.0):
    import time

    deadline = time.monotonic() + timeout
    while True:
        info = srv.get("/get_server_info").json()
        if info["num_inflight_requests"] == 0 and info["kv_pool"]["used"] == 0:
            return
        assert time.monotonic() < deadline, info["kv_pool"]
        time.sleep(0.05)


def test_batch_with_one_bad_item_fails_whole_and_leaks_nothing(srv):
    r = srv.post("/generate", {"text": ["fine", "x" * 5000], "sampling_params": {"max_new_tokens": 500}})
    assert r.status_code == 400 and "context" in r.json()["error"]["message"]
    _wait_idle(srv)


def test_batch_and_n_stream_disconnects_abort_every_member(srv):
    r = srv.post("/generate", {"text": ["a", "b", "c"], "sampling_params": {"max_new_tokens": 2000}, "stream": True},
                 stream=True)
    lines = r.iter_lines()
    next(lines)
    assert srv.get("/get_server_info").json()["num_inflight_requests"] == 3
    r.close()
    _wait_idle(srv)
    r = srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2000, "n": 4,
                                          "stream": True}, stream=True)
    lines = r.iter_lines()
    next(lines)
    assert srv.get("/get_server_info").json()["num_inflight_requests"] == 4
    r.close()
    _wait_idle(srv)

"""The HTTP API against the real engine on a tiny random-weight Llama: the `openai` client and `requests`.

Greedy decoding makes outputs deterministic, so different routes (and stream vs non-stream) must agree.
"""

import json
import re
import time

import jsonschema
import pytest
import requests

from sglpy.runtime.testing.server_harness import run_server, sse_events

openai = pytest.importorskip("openai",
    reason="openai is not installed (the GPU image lacks it unless `make gpu-bundle` carried it)")

GREEDY = {"temperature": 0.0, "ignore_eos": True}
META_KEYS = {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens", "e2e_latency"}


@pytest.fixture(scope="module")
def srv(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "16384", "--max-context-len", "1024",
                    "--num-threads", "1", "--served-model-name", "tiny") as s:
        yield s


@pytest.fixture(scope="module")
def client(srv):
    return openai.OpenAI(base_url=srv.url + "/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


def gen(srv, text, n_tokens=8, **extra):
    r = srv.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": n_tokens, **GREEDY}, **extra})
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------- /generate with requests
def test_generate_single_shape(srv):
    out = gen(srv, "The capital of France is")
    assert set(out) == {"text", "output_ids", "meta_info"}
    meta = out["meta_info"]
    assert META_KEYS <= set(meta)
    assert meta["finish_reason"] == {"type": "length", "length": 8}
    assert meta["completion_tokens"] == len(out["output_ids"]) == 8
    assert isinstance(out["text"], str) and out["text"]
    assert "input_token_logprobs" not in meta


def test_generate_batch_keeps_order_and_matches_singles(srv):
    prompts = ["one two", "three four five", "six"]
    singles = [gen(srv, p)["text"] for p in prompts]
    r = srv.post("/generate", {"text": prompts, "sampling_params": {"max_new_tokens": 8, **GREEDY}})
    outs = r.json()
    assert isinstance(outs, list) and len(outs) == 3
    assert [o["text"] for o in outs] == singles
    assert len({o["meta_info"]["id"] for o in outs}) == 3
    by_ids = srv.post("/generate", {"input_ids": [[100, 200, 300], [400]], "sampling_params": {"max_new_tokens": 3}})
    assert [o["meta_info"]["prompt_tokens"] for o in by_ids.json()] == [3, 1]


def test_generate_n_expands_to_a_list(srv):
    outs = srv.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 4, "n": 3}}).json()
    assert isinstance(outs, list) and len(outs) == 3


def test_seeded_n_samples_differ_and_reproduce(srv, client):
    """n samples of one seeded request are independent draws (OpenAI, vLLM), and the whole set reproduces from the
    same cache state (without deterministic inference a cached prompt prefix can change the last bits of the logits,
    and a sampled draw can move with them: docs/runtime.md, "Quantization and the KV cache dtype")."""
    body = {"text": "Tell me a story", "sampling_params": {"max_new_tokens": 12, "n": 3, "seed": 11,
                                                             "temperature": 1.0, "ignore_eos": True}}
    def generate():
        assert srv.post("/flush_cache", {}).status_code == 200
        return [o["text"] for o in srv.post("/generate", body).json()]
    runs = [generate() for _ in range(2)]
    assert len(set(runs[0])) == 3 and runs[0] == runs[1]

    def chat():
        assert srv.post("/flush_cache", {}).status_code == 200  # the same cache state each time: see the docstring
        out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Tell me a story"}],
                                             max_tokens=12, n=3, seed=11, temperature=1.0,
                                             extra_body={"ignore_eos": True})
        return [c.message.content for c in out.choices]
    first = chat()
    assert len(set(first)) == 3 and chat() == first


def test_generate_stream_is_cumulative_and_matches_non_stream(srv):
    full = gen(srv, "Once upon a time", 12)
    r = srv.post("/generate", {"text": "Once upon a time", "sampling_params": {"max_new_tokens": 12, **GREEDY},
                               "stream": True}, stream=True)
    assert r.headers["Content-Type"].startswith("text/event-stream")
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    chunks = events[:-1]
    # How many chunks arrive depends on timing: a reader that lags gets the newest cumulative output (as SGLang's
    # tokenizer manager does), so a fast tiny model may finish in one. The collapse is unit-tested in
    # test_server_engine_process.py; here every chunk must extend the one before and the last must be the answer.
    assert chunks
    for a, b in zip(chunks, chunks[1:]):
        assert b["text"].startswith(a["text"]) and b["output_ids"][:len(a["output_ids"])] == a["output_ids"]
    assert chunks[-1]["text"] == full["text"] and chunks[-1]["output_ids"] == full["output_ids"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert all(c["meta_info"]["finish_reason"] is None for c in chunks[:-1])


def test_generate_batch_stream_tags_index(srv):
    r = srv.post("/generate", {"text": ["a", "b"], "sampling_params": {"max_new_tokens": 3}, "stream": True},
                 stream=True)
    events = sse_events(r)
    assert events[-1] == "[DONE]"
    assert {e["index"] for e in events[:-1]} == {0, 1}


def test_generate_logprobs(srv, tokenizer):
    prompt = "Logprobs are fun to test"
    n_prompt = len(tokenizer.encode(prompt))
    out = gen(srv, prompt, 5, return_logprob=True, logprob_start_len=0, top_logprobs_num=2,
              return_text_in_logprobs=True)
    meta = out["meta_info"]
    inp, outp = meta["input_token_logprobs"], meta["output_token_logprobs"]
    assert len(inp) == n_prompt == meta["prompt_tokens"]
    assert inp[0][0] is None and all(lp <= 0 for lp, _, _ in inp[1:])
    assert [t for _, t, _ in outp] == out["output_ids"]
    assert "".join(text for _, _, text in outp) == out["text"]
    assert all(len(top) == 2 for top in meta["output_top_logprobs"])
    best = meta["output_top_logprobs"][0][0]
    assert best[1] == out["output_ids"][0] and best[0] >= meta["output_top_logprobs"][0][1][0]  # greedy = top-1


def test_extra_key_namespaces_the_prefix_cache(srv):
    prompt = "A prompt cached under one namespace only, long enough to span several tokens " * 2
    gen(srv, prompt, 1, extra_key="tenant-a")
    same = gen(srv, prompt, 1, extra_key="tenant-a")["meta_info"]["cached_tokens"]
    other = gen(srv, prompt, 1, extra_key="tenant-b")["meta_info"]["cached_tokens"]
    assert same > 0 and other == 0


def test_scoring_request_and_prefix_cache(srv):
    prefix = "A long shared prefix that should land in the radix cache " * 4
    first = srv.post("/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    assert first["meta_info"]["completion_tokens"] == 0 and first["text"] == ""
    p = first["meta_info"]["prompt_tokens"]
    scored = srv.post("/generate", {"text": [prefix + " yes", prefix + " no"],
                                    "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                                    "return_logprob": True, "return_text_in_logprobs": True,
                                    "logprob_start_len": max(p - 2, 0)}).json()
    for s in scored:
        assert s["meta_info"]["cached_tokens"] > 0
        assert len(s["meta_info"]["input_token_logprobs"]) == s["meta_info"]["prompt_tokens"] - max(p - 2, 0)


# ---------------------------------------------------------------- the openai client
def test_openai_completion_matches_generate(srv, client):
    out = client.completions.create(model="tiny", prompt="The capital of France is", max_tokens=8, temperature=0,
                                    extra_body={"ignore_eos": True})
    assert out.object == "text_completion" and out.model == "tiny"
    assert out.choices[0].text == gen(srv, "The capital of France is")["text"]
    assert out.choices[0].finish_reason == "length"
    assert out.usage.completion_tokens == 8 and out.usage.total_tokens == out.usage.prompt_tokens + 8


def test_openai_completion_n_and_logprobs(client):
    out = client.completions.create(model="tiny", prompt="Count: 1 2 3", max_tokens=4, temperature=0.8, n=2,
                                    logprobs=2, extra_body={"ignore_eos": True})
    assert [c.index for c in out.choices] == [0, 1]
    for c in out.choices:
        assert len(c.logprobs.tokens) == len(c.logprobs.token_logprobs) == 4
        assert "".join(c.logprobs.tokens) == c.text
        assert all(len(t) <= 2 for t in c.logprobs.top_logprobs)
    single = client.completions.create(model="tiny", prompt="Count: 1 2 3", max_tokens=4)
    assert out.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt is counted once for n samples
    assert out.usage.completion_tokens == 8


def test_openai_chat_applies_the_chat_template(client, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
    out = client.chat.completions.create(model="tiny", messages=messages, max_tokens=6, temperature=0,
                                         extra_body={"ignore_eos": True})
    templated = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert out.usage.prompt_tokens == len(tokenizer.encode(templated))
    msg = out.choices[0].message
    assert msg.role == "assistant" and isinstance(msg.content, str) and msg.content
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 6


def test_openai_streaming_chat_matches_non_stream(client):
    kw = dict(model="tiny", messages=[{"role": "user", "content": "Tell me a story."}], max_tokens=10, temperature=0,
              extra_body={"ignore_eos": True})
    full = client.chat.completions.create(**kw).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full
    reasons = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert reasons == ["length"]
    assert chunks[-1].usage.completion_tokens == 10 and chunks[-1].choices == []


def test_openai_chat_logprobs(client):
    out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=4,
                                         temperature=0, logprobs=True, top_logprobs=3, extra_body={"ignore_eos": True})
    content = out.choices[0].logprobs.content
    assert len(content) == 4 and "".join(c.token for c in content) == out.choices[0].message.content
    assert all(len(c.top_logprobs) == 3 and c.logprob <= 0 for c in content)


def test_openai_bad_request_raises_client_error(client):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "x"}], max_tokens=5000)
    assert "context" in str(e.value)


def test_openai_response_format_json_schema(srv, client):
    if not srv.get("/get_model_info").json()["supports_constraints"]:
        pytest.skip("the engine reports no constrained decoding (Engine.constrained is None)")
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"],
              "additionalProperties": False}
    out = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=64, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(out.choices[0].message.content), schema)
    obj = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "JSON please"}],
                                         max_tokens=64, temperature=0, response_format={"type": "json_object"})
    text = obj.choices[0].message.content
    assert text.lstrip().startswith("{")
    if obj.choices[0].finish_reason == "stop":  # a random-weight model may still be inside a long string
        assert isinstance(json.loads(text), dict)
    stream = client.chat.completions.create(
        model="tiny", messages=[{"role": "user", "content": "Answer in JSON."}], max_tokens=64, temperature=0,
        stream=True, response_format={"type": "json_schema", "json_schema": {"name": "answer", "schema": schema}})
    streamed = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    assert streamed == out.choices[0].message.content


def test_regex_constraint_via_generate_and_openai(srv, client):
    if not srv.get("/get_model_info").json()["supports_constraints"]:
        pytest.skip("the engine reports no constrained decoding (Engine.constrained is None)")
    out = srv.post("/generate", {"text": "Code:", "sampling_params": {"max_new_tokens": 16, "regex": "[0-9]{3}-[a-z]{2}",
                                                                     "temperature": 0}}).json()
    assert re.fullmatch("[0-9]{3}-[a-z]{2}", out["text"]), out
    c = client.completions.create(model="tiny", prompt="Answer:", max_tokens=8, temperature=0,
                                  extra_body={"regex": "(yes|no)"})
    assert c.choices[0].text in ("yes", "no") and c.choices[0].finish_reason == "stop"


def test_invalid_constraints_are_400(srv):
    for sp in ({"regex": "(unclosed"}, {"json_schema": "{not json"}, {"ebnf": "root ::= ("},
               {"regex": "a", "json_schema": "{}"}, {"regex": "(a|b)*a(a|b){30}"}):  # last: DFA state blow-up
        r = srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, **sp}})
        assert r.status_code == 400, (sp, r.text)
        assert r.json()["error"]["message"]
    assert gen(srv, "still serving", 2)["meta_info"]["completion_tokens"] == 2


def test_openai_models(client):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert client.models.retrieve("tiny").max_model_len == 1024


# ---------------------------------------------------------------- info, cache, metrics, health
def test_model_and_server_info(srv, tiny_model_path):
    info = srv.get("/get_model_info").json()
    assert info["model_path"] == tiny_model_path and info["is_generation"] is True
    assert "<|im_start|>" in info["chat_template"]
    assert info["special_tokens"]["eos_token"] == "<|im_end|>" and info["context_len"] == 1024
    server = srv.get("/get_server_info").json()
    assert server["max_total_num_tokens"] == 16384 and server["port"] == int(srv.url.rsplit(":", 1)[1])
    assert server["kv_pool"]["total"] == 16384 and server["version"]


def test_pool_stats_track_a_running_request_and_its_abort(srv):
    info = srv.get("/get_server_info").json()
    # the engine fields the server's pool view and gauges read (a rename would silently read as 0)
    assert {"kv_used", "kv_free", "kv_evictable", "max_total_num_tokens", "num_running_reqs",
            "num_waiting_reqs", "prompt_tokens", "cached_tokens"} <= set(info)
    r = srv.post("/generate", {"text": "keep going", "sampling_params": {"max_new_tokens": 900, **GREEDY},
                               "stream": True}, stream=True)
    lines = r.iter_lines()
    next(lines)
    busy = srv.get("/get_server_info").json()
    assert busy["kv_pool"]["used"] > 0 and busy["num_running_reqs"] == 1 and busy["num_inflight_requests"] == 1
    assert 'sglang:num_running_reqs{model_name="tiny"} 1.0' in srv.get("/metrics").text
    r.close()  # disconnect: the abort must release the request's KV
    deadline = time.monotonic() + 10
    while (info := srv.get("/get_server_info").json())["kv_pool"]["used"] or info["num_inflight_requests"]:
        assert time.monotonic() < deadline, info["kv_pool"]
        time.sleep(0.05)
    assert info["kv_pool"]["free"] + info["kv_pool"]["cached"] == info["kv_pool"]["total"]


def test_flush_cache_and_health(srv):
    assert srv.post("/flush_cache").status_code == 200
    assert srv.get("/flush_cache").status_code == 200
    assert srv.get("/get_server_info").json()["kv_pool"]["cached"] == 0
    assert srv.get("/health").status_code == 200 and srv.get("/health_generate").status_code == 200


def test_metrics_after_traffic(srv):
    gen(srv, "metrics prompt", 4)
    text = srv.get("/metrics").text
    assert 'sglang:num_requests_total{model_name="tiny"}' in text
    assert "sglang:time_to_first_token_seconds_bucket" in text
    assert 'sglang:max_total_num_tokens{model_name="tiny"} 16384.0' in text
    assert requests.get(srv.url + "/metrics", timeout=10).headers["Content-Type"].startswith("text/plain")


# ---------------------------------------------------------------- stop_regex over HTTP
def _first_triple_pattern(text: str) -> str:
    """A fixed-length (3 chars) regex built from the middle of `text`, so the first match is the same
    whether it is searched in the whole text or in the prefix that first contains it."""
    i = len(text) // 2
    return "(?s)" + re.escape(text[i]) + "." + re.escape(text[i + 2])


def test_stop_regex_via_generate_openai_and_the_frontend(srv, client):
    import sglpy as sgl

    full = gen(srv, "Count the sheep:", n_tokens=24)["text"]
    pattern = _first_triple_pattern(full)
    m = re.search(pattern, full)
    out = gen(srv, "Count the sheep:", n_tokens=24, sampling_params={"max_new_tokens": 24, "stop_regex": pattern,
                                                                     **GREEDY})
    assert out["text"] == full[: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = srv.post("/generate", {"text": "Count the sheep:", "sampling_params": {
        "max_new_tokens": 24, "stop_regex": [pattern], "no_stop_trim": True, **GREEDY}}).json()
    assert kept["text"] == full[: m.end()]
    events = sse_events(srv.post("/generate", {"text": "Count the sheep:", "stream": True, "sampling_params": {
        "max_new_tokens": 24, "stop_regex": pattern, **GREEDY}}, stream=True))
    texts = [e["text"] for e in events if e != "[DONE]"]
    assert texts[-1] == full[: m.start()] and all(texts[-1].startswith(t) for t in texts)  # never shows the match
    comp = client.completions.create(model="tiny", prompt="Count the sheep:", max_tokens=24, temperature=0,
                                     extra_body={"stop_regex": pattern, "ignore_eos": True})
    assert comp.choices[0].text == full[: m.start()] and comp.choices[0].finish_reason == "stop"
    assert srv.post("/generate", {"text": "x", "sampling_params": {"stop_regex": "(unclosed"}}).status_code == 400

    @sgl.function
    def sheep(s):
        s += "Count the sheep:" + sgl.gen("x", max_tokens=24, stop_regex=pattern, ignore_eos=True)

    st = sheep.run(backend=sgl.RuntimeEndpoint(srv.url), temperature=0)
    assert st["x"] == full[: m.start()]
    assert st.get_meta_info("x")["finish_reason"] == {"type": "stop", "matched": pattern}

"""SGLang's wire against `sglpy serve` (fake engine): the exact requests SGLang's frontend and sglang-router send,
the routes they call, and issue 13's refusals at the door (each with a neighbour request that finishes normally)."""

import json
import socket
import threading
import time

import pytest
import requests

from sglpy.runtime.testing.server_harness import FAKE, run_server

OFFSET = 4  # the fake engine's byte tokenizer: id = byte + 4


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE, env={"SGLPY_FAKE_TOKEN_DELAY": "0.002"}) as s:
        yield s


def ids_of(text: str) -> list[int]:
    return [b + OFFSET for b in text.encode()]


@pytest.mark.parametrize("unconditional", [False, True])
def test_replay_of_sglang_select_requests(srv, unconditional):
    """The bodies SGLang 0.5.23's RuntimeEndpoint.select posts (runtime_endpoint.py:246-313), for all three choice
    methods (token_length_normalized and greedy_token_selection send the first two; unconditional_likelihood_normalized
    adds the third), and the reply shapes its code indexes."""
    prefix, choices = "Is water wet? Answer:", ["Yes", "No"]
    first = srv.post("/generate", {"text": prefix, "sampling_params": {"max_new_tokens": 0}}).json()
    assert first["text"] == "" and first["output_ids"] == [] and first["meta_info"]["completion_tokens"] == 0
    p = first["meta_info"]["prompt_tokens"]
    assert p == len(ids_of(prefix))
    start = max(p - 2, 0)
    outs = srv.post("/generate", {"text": [prefix + c for c in choices],
                                  "sampling_params": {"max_new_tokens": 0, "temperature": 0},
                                  "return_logprob": True, "return_text_in_logprobs": True,
                                  "logprob_start_len": start}).json()
    assert isinstance(outs, list) and len(outs) == len(choices)
    windows = []
    for c, o in zip(choices, outs):
        lps = o["meta_info"]["input_token_logprobs"]
        assert [e[1] for e in lps] == ids_of(prefix + c)[start:]
        assert all(isinstance(e[0], float) for e in lps)  # k > 0: every entry has a value (the rule select reads)
        assert "".join(e[2] for e in lps) == (prefix + c).encode()[start:].decode()  # text in slot 2
        assert o["meta_info"]["output_token_logprobs"] == [] and o["meta_info"]["output_token_logprobs_length"] == 0
        windows.append([e[1] for e in lps])
    if unconditional:
        outs = srv.post("/generate", {"input_ids": windows, "sampling_params": {"max_new_tokens": 0},
                                      "return_logprob": True}).json()
        # no logprob_start_len: -1 gives one null entry for the last token, so the client's
        # `unconditionals[0] = unconditionals[0] or 0` has an element to read
        assert [o["meta_info"]["input_token_logprobs"] for o in outs] == [[[None, w[-1], None]] for w in windows]


def test_frontend_routes(srv):
    r = srv.post("/concate_and_append_request", {"src_rids": ["a", "b"], "dst_rid": "c"})
    assert r.status_code == 200
    for body in ({"src_rids": [], "dst_rid": "c"}, {"src_rids": ["a"]}, {"src_rids": ["a"], "dst_rid": 3},
                 {"src_rids": ["a"], "dst_rid": "c", "x": 1}):
        assert srv.post("/concate_and_append_request", body).status_code == 400, body
    for path in ("/start_profile", "/stop_profile"):
        for method in ("GET", "POST"):
            r = requests.request(method, srv.url + path, timeout=10)
            assert r.status_code == 200 and "no trace" in r.text
    info = srv.get("/server_info").json()
    assert info["tp_size"] == 1 and info["dp_size"] == 1 and info["served_model_name"] == "fake-model"
    assert srv.get("/model_info").json()["model_path"] == "fake-model"
    load = srv.get("/get_load").json()
    assert load == [{"dp_rank": 0, "num_reqs": 0, "num_waiting_reqs": 0, "num_tokens": 0}]


def test_router_bodies_at_their_defaults_are_served(srv):
    gen = {"text": "hi", "model": None, "log_metrics": True, "background": False, "no_logs": False,
           "return_bytes": False, "return_entropy": False, "return_hidden_states": False,
           "return_text_in_logprobs": False, "stream": False,
           "sampling_params": {"temperature": 0.0, "max_new_tokens": 3, "top_p": 1.0, "top_k": -1, "n": 1,
                               "stop": [], "stop_token_ids": [], "ignore_eos": False, "skip_special_tokens": True,
                               "no_stop_trim": False, "min_new_tokens": 0, "repetition_penalty": 1.0}}
    assert srv.post("/generate", gen).status_code == 200
    chat = {"model": "default", "messages": [{"role": "user", "content": "hi"}], "logprobs": False,
            "stream": False, "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False,
            "skip_special_tokens": True, "separate_reasoning": True, "stream_reasoning": True,
            "return_hidden_states": False, "max_completion_tokens": 3}
    assert srv.post("/v1/chat/completions", chat).status_code == 200
    comp = {"model": "default", "prompt": "hi", "max_tokens": 3, "stream": False, "echo": False,
            "no_stop_trim": False, "ignore_eos": False, "skip_special_tokens": True, "return_hidden_states": False}
    assert srv.post("/v1/completions", comp).status_code == 200


def test_log_metrics_false_and_no_logs(srv):
    before = srv.get("/metrics").text
    assert srv.post("/generate", {"text": "quiet one", "sampling_params": {"max_new_tokens": 1},
                                  "log_metrics": False, "no_logs": True, "rid": "quiet-rid"}).status_code == 200
    assert _count(srv.get("/metrics").text) == _count(before)
    assert "quiet-rid" not in srv.log()


def _count(metrics: str) -> float:
    return float(next(line.split()[-1] for line in metrics.splitlines() if line.startswith("sglang:num_requests_total")))


SURROGATE = b'"ab\\ud800cd"'
POST_ROUTES = {
    "/generate": b'{"text": %s, "sampling_params": {"max_new_tokens": 2}}',
    "/v1/completions": b'{"prompt": %s, "max_tokens": 2}',
    "/v1/chat/completions": b'{"messages": [{"role": "user", "content": %s}], "max_tokens": 2}',
    "/tokenize": b'{"text": %s}',
    "/detokenize": b'{"tokens": [5], "model": %s}',
    "/abort_request": b'{"rid": %s}',
    "/concate_and_append_request": b'{"src_rids": [%s], "dst_rid": "x"}',
}


@pytest.mark.parametrize("route", sorted(POST_ROUTES))
def test_lone_surrogates_are_a_400_on_every_route(srv, route):
    r = requests.post(srv.url + route, data=POST_ROUTES[route] % SURROGATE,
                      headers={"Content-Type": "application/json"}, timeout=30)
    assert r.status_code == 400, r.text
    assert "UTF-8" in r.json()["error"]["message"]


ISSUE_13 = [
    ("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "skip_special_tokens": "no"}},
     "skip_special_tokens"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 1000000}, "top_logprobs_num"),
    ("/generate", {"text": "x", "return_logprob": True, "top_logprobs_num": 49153}, "top_logprobs_num"),
    ("/generate", {"text": "x", "sampling_params": {"stop": {"a": 1}}}, "stop"),
    ("/generate", {"text": "x", "sampling_params": {"ignore_eos": "yes"}}, "ignore_eos"),
    ("/generate", {"text": "x", "sampling_params": {"ignore_eos": 1}}, "ignore_eos"),
    ("/generate", {"text": "x", "sampling_params": {"spaces_between_special_tokens": "x"}},
     "spaces_between_special_tokens"),
    ("/generate", {"text": "x", "sampling_params": {"no_stop_trim": "x"}}, "no_stop_trim"),
    ("/generate", {"text": "x", "sampling_params": {"logit_bias": {"99999999": 5}}}, "logit_bias"),
    ("/v1/completions", {"prompt": "x", "n": 0}, "n"),
    ("/v1/completions", {"prompt": "x", "logit_bias": {"99999999": 5}}, "logit_bias"),
    ("/v1/chat/completions", {"messages": [{"role": "user"}]}, "content"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "n": 0}, "n"),
]


@pytest.mark.parametrize("route,body,word", ISSUE_13)
def test_issue_13_inputs_are_refused_at_the_door_and_a_neighbour_finishes(srv, route, body, word):
    result = {}

    def neighbour():
        result["r"] = srv.post("/generate", {"text": "neighbour", "sampling_params": {"max_new_tokens": 20}})

    t = threading.Thread(target=neighbour)
    t.start()
    r = srv.post(route, body)
    t.join(30)
    assert r.status_code == 400, r.text
    assert word in r.json()["error"]["message"], r.json()
    n = result["r"]
    assert n.status_code == 200 and n.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 20}


def test_router_http2_probe_logs_one_line_not_a_traceback(srv):
    host, port = srv.url.split("//")[1].split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
        s.recv(1024)
    deadline = time.monotonic() + 5
    while "HTTP/2 or gRPC probe" not in srv.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    log = srv.log()
    assert "HTTP/2 or gRPC probe" in log and "Traceback" not in log and "Error handling request" not in log


def test_stop_regex_on_every_generation_route(srv):
    base = srv.post("/generate", {"text": "regex me", "sampling_params": {"max_new_tokens": 12}}).json()["text"]
    pattern = base[4] + "."
    out = srv.post("/generate", {"text": "regex me", "sampling_params": {"max_new_tokens": 12,
                                                                           "stop_regex": [pattern]}}).json()
    assert out["text"] == base[:4] and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    comp = srv.post("/v1/completions", {"prompt": "regex me", "max_tokens": 12, "stop_regex": pattern}).json()
    assert comp["choices"][0]["text"] == base[:4] and comp["choices"][0]["matched_stop"] == pattern
    keep = srv.post("/generate", {"text": "regex me", "sampling_params": {"max_new_tokens": 12, "no_stop_trim": True,
                                                                            "stop_regex": pattern}}).json()
    assert keep["text"] == base[:6]
    assert json.dumps(srv.post("/generate", {"text": "x", "sampling_params": {"stop_regex": "(a"}}).json()).count(
        "stop_regex") >= 1

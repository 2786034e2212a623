"""Server behaviour under bad input and faults, against the fake engine (fast, deterministic).

Each fault is answered with the right status and an OpenAI-style error body, the next request still
works, and nothing leaks (the fake engine accounts KV the way the real one does).
"""

import json
import socket
import threading
import time

import pytest
import requests

import os
import signal
import subprocess
import sys

from sglpy.runtime.testing.server_harness import FAKE, free_port, run_server, sse_events

openai = pytest.importorskip("openai",
    reason="openai is not installed (the GPU image lacks it unless `make gpu-bundle` carried it)")

KEY = "test-key-123"
ENV = {"SGLPY_FAKE_TOKEN_DELAY": "0.01"}


@pytest.fixture(scope="module")
def srv():
    with run_server("--engine-factory", FAKE, "--max-request-bytes", "65536", "--max-running-requests", "4",
                    "--max-queued-requests", "2", api_key=KEY, env=ENV) as s:
        yield s


def assert_error(resp, status, *words):
    assert resp.status_code == status, resp.text
    body = resp.json()
    err = body["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == status
    for w in words:
        assert w in err["message"], err["message"]
    return err


def assert_serves(srv):
    r = srv.post("/generate", {"text": "ok", "sampling_params": {"max_new_tokens": 2}})
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 2


def wait_idle(srv, timeout=10.0):
    """Poll until the server has no request in flight and the engine holds no KV."""
    deadline = time.monotonic() + timeout
    while True:
        info = srv.get("/get_server_info").json()
        if info["num_inflight_requests"] == 0 and info["kv_pool"]["used"] == 0:
            return info
        assert time.monotonic() < deadline, f"still busy: {info['num_inflight_requests']} {info['kv_pool']}"
        time.sleep(0.05)


@pytest.mark.parametrize("body,words", [
    (b"{not json", ["malformed JSON"]),
    (b"", ["empty"]),
    (b"[1, 2]", ["JSON object"]),
    (b'{"text": 5}', ["text", "string"]),
    (b'{"text": "a", "sampling_params": "x"}', ["sampling_params"]),
    (b'{"text": "a", "bogus_field": 1}', ["unknown field", "bogus_field"]),
    (b'{"text": "a", "sampling_params": {"max_new_tokenz": 3}}', ["max_new_tokenz"]),
    (b'{"text": "a", "sampling_params": {"temperature": -1}}', ["temperature"]),
    (b'{"text": "a", "input_ids": [1]}', ["exactly one"]),
    (b'{"input_ids": []}', ["empty"]),
    (b'{"text": "a", "sampling_params": {"regex": "(unclosed"}}', ["regex"]),
    (b'{"text": "a", "image_data": "x.png"}', ["image_data", "not supported"]),
    (b'{"text": "a", "sampling_params": {"max_new_tokens": 100000}}', ["context"]),
    (b'{"text": "a", "max_new_tokens": NaN}', ["JSON"]),
    (b'{"text": ' + b"[" * 20_000 + b"]" * 20_000 + b"}", ["JSON"]),
    (b'{"text": "a", "sampling_params": {"n": 7}}', ["at most 6"]),
])
def test_generate_rejects_bad_bodies_with_400(srv, body, words):
    r = requests.post(srv.url + "/generate", data=body, headers={**srv.headers, "Content-Type": "application/json"},
                      timeout=30)
    assert_error(r, 400, *words)
    assert_serves(srv)


@pytest.mark.parametrize("route,body,words", [
    ("/v1/completions", {"prompt": "a", "max_tokens": "10"}, ["max_tokens", "int"]),
    ("/v1/completions", {"prompt": "a", "frobnicate": True}, ["frobnicate"]),
    ("/v1/completions", {"max_tokens": 3}, ["prompt"]),
    ("/v1/chat/completions", {"messages": []}, ["messages"]),
    ("/v1/chat/completions", {"messages": [{"role": "wizard", "content": "x"}]}, ["role"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
     ["tools"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "top_p": 0}, ["top_p"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, ["schema"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, ["text"]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}],
                              "chat_template_kwargs": {"chat_template": "{{ 7 * 7 }}"}}, ["chat_template"]),
])
def test_openai_routes_reject_bad_bodies_with_400(srv, route, body, words):
    assert_error(srv.post(route, {"model": "m", **body}), 400, *words)
    assert_serves(srv)


def test_openai_ignores_only_bookkeeping_fields(srv):
    r = srv.post("/v1/completions", {"model": "m", "prompt": "a", "max_tokens": 2, "user": "u", "metadata": {}})
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 2


def test_oversized_body_is_413_and_server_continues(srv):
    r = srv.post("/generate", {"text": "x" * 100_000})
    assert_error(r, 413, "too large")
    assert_serves(srv)


def test_api_key_required_everywhere_but_health(srv):
    for path in ("/generate", "/v1/completions"):
        assert_error(requests.post(srv.url + path, json={"text": "a"}, timeout=10), 401, "API key")
    for path in ("/v1/models", "/metrics", "/get_server_info", "/get_model_info", "/health_generate"):
        assert_error(requests.get(srv.url + path, headers={"Authorization": "Bearer wrong"}, timeout=10), 401)
    assert requests.get(srv.url + "/health", timeout=10).status_code == 200
    bad = openai.OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.completions.create(model="m", prompt="a", max_tokens=2)
    good = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0)
    assert good.completions.create(model="m", prompt="a", max_tokens=2).usage.completion_tokens == 2


def test_unknown_route_is_a_json_404(srv):
    assert_error(srv.get("/nope"), 404)


def test_stream_disconnect_aborts_and_frees_kv(srv):
    before = srv.get("/metrics").text
    r = srv.post("/generate", {"text": "long", "sampling_params": {"max_new_tokens": 2000},
                               "stream": True}, stream=True)
    lines = r.iter_lines()
    got = [next(lines) for _ in range(6)]
    assert any(line.startswith(b"data: {") for line in got)
    assert srv.get("/get_server_info").json()["num_inflight_requests"] == 1
    r.close()  # the client goes away mid-stream
    t0 = time.monotonic()
    wait_idle(srv)
    assert time.monotonic() - t0 < 3, "abort took about as long as the remaining generation (20 s)"
    assert "outcome=client disconnected" in srv.log()
    after = srv.get("/metrics").text
    assert _metric(after, "sglang:num_aborted_requests_total") == _metric(before, "sglang:num_aborted_requests_total") + 1
    assert_serves(srv)


def test_non_stream_disconnect_aborts(srv):
    with pytest.raises(requests.ReadTimeout):
        requests.post(srv.url + "/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 2000}},
                      headers=srv.headers, timeout=0.3)
    wait_idle(srv, timeout=3)  # the full generation would take 20 s


def test_queue_full_answers_503_with_retry_after(srv):
    streams = [srv.post("/generate", {"text": f"q{i}", "sampling_params": {"max_new_tokens": 200}, "stream": True},
                        stream=True) for i in range(6)]  # 4 running + 2 queued = the limit
    try:
        assert all(s.status_code == 200 for s in streams)
        r = srv.post("/generate", {"text": "one too many", "sampling_params": {"max_new_tokens": 2}})
        assert_error(r, 503, "busy")
        assert r.headers["Retry-After"] == "1"
        assert_error(srv.post("/v1/completions", {"prompt": "x", "max_tokens": 2, "n": 1}), 503)
    finally:
        for s in streams:
            s.close()
    wait_idle(srv)
    assert_serves(srv)


def test_abort_request_endpoint_and_duplicate_rid(srv):
    r = srv.post("/generate", {"text": "a", "rid": "my-rid", "sampling_params": {"max_new_tokens": 250},
                               "stream": True}, stream=True)
    lines = r.iter_lines()
    next(lines)
    assert_error(srv.post("/generate", {"text": "b", "rid": "my-rid"}), 400, "already in flight")
    assert srv.post("/abort_request", {"rid": "my-rid"}).json() == {"aborted": ["my-rid"]}
    events = [json.loads(x[6:]) for x in lines if x.startswith(b"data: {")]
    assert events[-1]["meta_info"]["finish_reason"]["type"] == "abort"
    assert len(events[-1]["output_ids"]) < 250
    assert_error(srv.post("/abort_request", {"rid": 5}), 400, "rid")
    wait_idle(srv)


def test_engine_exception_is_500_and_engine_keeps_serving(srv):
    assert_error(srv.post("/generate", {"text": "__crash__"}), 500, "crashed on purpose")
    assert_serves(srv)


def test_tokenize_round_trip_and_types(srv):
    r = srv.post("/tokenize", {"text": "hey"}).json()
    assert r["count"] == 3 and len(r["tokens"]) == 3
    assert srv.post("/detokenize", {"tokens": r["tokens"]}).json() == {"text": "hey"}
    assert srv.post("/tokenize", {"text": ["a", "bc"]}).json()["count"] == [1, 2]
    assert_error(srv.post("/tokenize", {"text": 3}), 400, "text")
    assert_error(srv.post("/detokenize", {"tokens": ["a"]}), 400, "tokens")
    assert_error(srv.post("/detokenize", {"tokens": [10**9]}), 400, "out of range")


def test_health_generate(srv):
    assert srv.get("/health_generate").status_code == 200


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"{name} not in /metrics")


def test_metrics_count_requests_tokens_and_latency(srv):
    text = srv.get("/metrics").text
    for name in ("sglang:num_requests_total", "sglang:prompt_tokens_total", "sglang:generation_tokens_total",
                 "sglang:time_to_first_token_seconds_count", "sglang:inter_token_latency_seconds_count",
                 "sglang:e2e_request_latency_seconds_count", "sglang:num_running_reqs", "sglang:num_queue_reqs",
                 "sglang:token_usage", "sglang:cache_hit_rate"):
        assert name in text, name
    n0, g0 = _metric(text, "sglang:num_requests_total"), _metric(text, "sglang:generation_tokens_total")
    srv.post("/generate", {"text": "m", "sampling_params": {"max_new_tokens": 7}})
    text = srv.get("/metrics").text
    assert _metric(text, "sglang:num_requests_total") == n0 + 1
    assert _metric(text, "sglang:generation_tokens_total") == g0 + 7


def test_engine_death_fails_inflight_requests_and_health():
    # restarts off: the dead engine stays dead (tests/server/test_server_supervisor.py covers restarts)
    with run_server("--engine-factory", FAKE, "--engine-restart-attempts", "0", env=ENV) as s:
        slow = {}

        def long_request():
            slow["resp"] = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1000}})

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.3)
        r = s.post("/generate", {"text": "__die__"})
        assert_error(r, 503, "engine")
        t.join(10)
        assert not t.is_alive(), "in-flight request hung after the engine died"
        assert_error(slow["resp"], 503, "engine")
        assert_error(s.get("/health"), 503, "exit code 3")
        assert_error(s.post("/generate", {"text": "x"}), 503)
        assert s.proc.poll() is None  # the server itself stays up and reports unhealthy


def test_sigterm_finishes_inflight_then_exits_cleanly():
    with run_server("--engine-factory", FAKE, "--graceful-shutdown-timeout", "5", env=ENV) as s:
        r = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60}, "stream": True}, stream=True)
        time.sleep(0.1)
        assert s.sigterm(timeout=20) == 0
        events = sse_events(r)
        assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length"
        with pytest.raises(requests.ConnectionError):
            requests.get(s.url + "/health", timeout=2)
    assert "stopped" in s.log()


def test_sigterm_to_the_process_group_still_drains():
    with run_server("--engine-factory", FAKE, "--graceful-shutdown-timeout", "5", env=ENV,
                    new_session=True) as s:
        r = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 60}, "stream": True}, stream=True)
        time.sleep(0.1)
        os.killpg(s.proc.pid, signal.SIGTERM)  # as `kill -TERM -PGID` or a supervisor killing the group
        assert s.proc.wait(20) == 0
        events = sse_events(r)
        assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "length"


def test_sigterm_aborts_what_outlives_the_grace_period():
    with run_server("--engine-factory", FAKE, "--graceful-shutdown-timeout", "0.3", env=ENV) as s:
        r = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 200}, "stream": True},
                   stream=True)
        time.sleep(0.1)
        t0 = time.monotonic()
        assert s.sigterm(timeout=20) == 0
        assert time.monotonic() - t0 < 8
        events = sse_events(r)
        assert events[-1] == "[DONE]" and events[-2]["meta_info"]["finish_reason"]["type"] == "abort"


def test_port_in_use_fails_fast():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        with pytest.raises(RuntimeError, match="exited"):
            with run_server("--engine-factory", FAKE, "--port", str(port), startup_timeout=30):
                pass


def test_engine_startup_failure_exits_with_the_reason():
    with pytest.raises(RuntimeError, match="exited with 1") as e:
        with run_server("--engine-factory", FAKE, env={"SGLPY_FAKE_STARTUP_FAIL": "1"}, startup_timeout=60):
            pass
    assert "the fake weights are missing" in str(e.value)


def test_sigterm_while_the_engine_loads_exits_promptly():
    port = free_port()
    env = {**os.environ, "SGLPY_FAKE_STARTUP_DELAY": "60"}
    proc = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--port", str(port), "--engine-factory",
                             FAKE], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while True:  # bound before the engine is ready: /health says 503
            try:
                r = requests.get(f"http://127.0.0.1:{port}/health", timeout=2)
                assert r.status_code == 503 and "starting" in r.json()["error"]["message"]
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        assert time.monotonic() - t0 < 10
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_health_generate_reports_a_stalled_engine():
    with run_server("--engine-factory", FAKE, "--health-generate-timeout", "0.5",
                    env={"SGLPY_FAKE_TOKEN_DELAY": "2"}) as s:
        t0 = time.monotonic()
        assert_error(s.get("/health_generate"), 503, "timed out")
        assert time.monotonic() - t0 < 3
        assert s.get("/health").status_code == 200  # the process is alive; only generation is stuck


def test_dead_engine_step_loop_fails_requests_instead_of_hanging():
    with run_server("--engine-factory", FAKE, "--engine-restart-attempts", "0", env=ENV) as s:
        t0 = time.monotonic()
        assert_error(s.post("/generate", {"text": "__stall__"}), 503, "exit code 70")
        assert time.monotonic() - t0 < 5
        assert_error(s.get("/health"), 503)

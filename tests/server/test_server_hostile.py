"""Hostile clients against the real engine (tiny model): no request can stall, abort or reach past its sender.

One server runs in an empty working folder holding decoy grammar files, with an engine that audits what its
process opens after startup (sglpy.runtime.testing.audit). Each case checks the hostile request's status
and error text, and that normal requests sent beside it finish with their normal output.
"""

import json
import threading
import time

import pytest
import requests

from sglpy.runtime.testing.server_harness import run_server

AUDITED = "sglpy.runtime.testing.audit:AuditedEngine"
PLAIN = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
WORST_REGEXES = ["(a{0,100}){0,100}(b{0,100}){0,100}", "(.{0,200}x){8}"]


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    d = tmp_path_factory.mktemp("empty-cwd")
    (d / "etc").mkdir()
    (d / "etc" / "passwd.lark").write_text('X: "secret"\n')  # compiles if a grammar ever reads it
    (d / "common.lark").write_text('NUMBER: "pwned"\n')
    return d


@pytest.fixture(scope="module")
def srv(tiny_model_path, workdir):
    with run_server("--model", tiny_model_path, "--engine-factory", AUDITED, "--max-total-tokens", "8192",
                    "--max-context-len", "512", "--grammar-compile-timeout", "2", "--log-level", "warning",
                    cwd=str(workdir)) as s:
        yield s


@pytest.fixture(scope="module")
def expected(srv):
    """Each normal prompt's output when it runs alone."""
    return {p: plain(srv, p).json()["output_ids"] for p in ("Hello there", "Count: 1 2 3", "Why is the sky")}


def plain(srv, prompt, **kw):
    return srv.post("/generate", {"text": prompt, "sampling_params": PLAIN, **kw})


def assert_normal(srv, expected, prompt):
    r = plain(srv, prompt)
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["output_ids"] == expected[prompt]
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 8}


def in_thread(fn):
    box = {}

    def run():
        box["resp"] = fn()
        box["at"] = time.monotonic()

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, box


def wait_idle(srv, timeout=30.0):
    deadline = time.monotonic() + timeout
    while True:
        info = srv.get("/get_server_info").json()
        if info["num_inflight_requests"] == 0 and info["kv_pool"]["used"] == 0:
            return info
        assert time.monotonic() < deadline, (info["num_inflight_requests"], info["kv_pool"])
        time.sleep(0.05)


@pytest.mark.parametrize("regex", WORST_REGEXES)
def test_a_worst_case_compile_costs_only_its_sender(srv, expected, regex):
    t, box = in_thread(lambda: srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8,
                                                                                        "regex": regex}}))
    time.sleep(0.2)
    for prompt in expected:
        assert_normal(srv, expected, prompt)
        assert srv.get("/health").status_code == 200
    assert t.is_alive(), "the compile was meant to still be running while the normal requests finished"
    t.join(120)
    r = box["resp"]
    assert r.status_code == 400, r.text
    msg = r.json()["error"]["message"]
    assert "budget" in msg or "too large" in msg, msg
    wait_idle(srv)


def test_a_client_leaving_during_a_compile_cancels_it(srv, expected):
    before = srv.get("/get_server_info").json()["grammar"]["cancelled"]
    with pytest.raises(requests.Timeout):
        requests.post(srv.url + "/generate", json={"text": "x", "sampling_params": {
            "max_new_tokens": 8, "regex": "(a{0,100}){0,100}(b{0,100}){0,99}"}}, timeout=0.5)
    deadline = time.monotonic() + 30
    while srv.get("/get_server_info").json()["grammar"]["cancelled"] == before:
        assert time.monotonic() < deadline, "the abandoned compile was not cancelled"
        time.sleep(0.05)
    r = srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": "[0-9]{4}"}})
    assert r.status_code == 200 and len(r.json()["text"]) == 4  # the workers serve again
    wait_idle(srv)


def test_a_compile_worker_killed_mid_compile_is_a_retryable_server_error(srv, expected):
    import os
    import signal
    import subprocess

    engine = srv.get("/get_server_info").json()["engine_pid"]
    t, box = in_thread(lambda: srv.post("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "regex": WORST_REGEXES[0] + "c"}}))
    time.sleep(0.8)  # compiling: its budget is 2 s of CPU
    assert t.is_alive()
    workers = subprocess.run(["pgrep", "-P", str(engine), "-f", "grammar_worker"], capture_output=True,
                             text=True).stdout.split()
    assert workers, "no compile worker found"
    for pid in workers:
        os.kill(int(pid), signal.SIGKILL)
    t.join(60)
    r = box["resp"]
    assert r.status_code == 503, r.text  # the server's fault: the client may retry, never a 400
    err = r.json()["error"]
    assert err["type"] == "service_unavailable" and "compile worker died" in err["message"], err
    ok = srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": "[0-9]{4}"}})
    assert ok.status_code == 200 and len(ok.json()["text"]) == 4, ok.text  # the workers came back
    assert_normal(srv, expected, "Hello there")
    wait_idle(srv)


@pytest.mark.parametrize("grammar", ["%import etc.passwd (X)\nstart: X", "%import .etc.passwd (X)\nstart: X",
                                     "%import common (NUMBER)\nstart: NUMBER  // the decoy ./common.lark too"])
def test_ebnf_imports_never_reach_the_filesystem(srv, grammar):
    r = srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 6, "ebnf": grammar}})
    if "etc.passwd" in grammar:
        assert r.status_code == 400 and "refused" in r.json()["error"]["message"], r.text
    else:  # lark's bundled common.NUMBER, never ./common.lark ("pwned")
        assert r.status_code == 200, r.text
        assert "pwned" not in r.json()["text"]


def _nested(n, style):
    if style == "properties":
        return '{"type":"object","properties":{"a":' * n + '{"type":"integer"}' + "}}" * n
    if style == "items":
        return '{"type":"array","items":' * n + '{"type":"integer"}' + "}" * n
    return '{"anyOf":[' * n + '{"type":"integer"}' + "]}" * n


@pytest.mark.parametrize("depth", [1000, 5000])
@pytest.mark.parametrize("style", ["properties", "items", "anyOf"])
def test_deeply_nested_schemas_are_never_a_500(srv, expected, depth, style):
    r = srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 4,
                                                               "json_schema": _nested(depth, style)}})
    assert r.status_code in (200, 400), r.text
    if r.status_code == 400:
        msg = r.json()["error"]["message"]
        assert any(w in msg for w in ("nested too deeply", "budget", "too large", "depth")), msg
    assert_normal(srv, expected, "Hello there")


@pytest.mark.parametrize("bad", [
    {"sampling_params": {**PLAIN, "skip_special_tokens": "no"}},
    {"sampling_params": PLAIN, "return_logprob": True, "top_logprobs_num": 1_000_000},
    {"sampling_params": PLAIN, "return_logprob": True, "top_logprobs_num": 49153, "logprob_start_len": 0},
])
def test_a_bad_value_hurts_only_its_sender(srv, expected, bad):
    threads = [in_thread(lambda p=p: plain(srv, p)) for p in expected]
    r = srv.post("/generate", {"text": "Bad value", **bad})
    # refused at the door (400), or failed inside the engine for this request alone (abort)
    assert r.status_code in (200, 400), r.text
    if r.status_code == 200:
        assert r.json()["meta_info"]["finish_reason"]["type"] == "abort", r.json()["meta_info"]
    for (t, box), prompt in zip(threads, expected):
        t.join(60)
        assert box["resp"].status_code == 200 and box["resp"].json()["output_ids"] == expected[prompt]
    wait_idle(srv)


def test_no_request_field_opens_a_file(srv, workdir):
    paths = ["/etc/passwd", "etc/passwd", "../../etc/passwd", "file:///etc/passwd", str(workdir / "etc")]
    for p in paths:
        for body in ({"text": p, "sampling_params": {"max_new_tokens": 2, "stop": [p], "stop_regex": [p + "x"]}},
                     {"text": "x", "sampling_params": {"max_new_tokens": 2, "regex": p.replace(".", r"\.")}},
                     {"text": "x", "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps(
                         {"$ref": p})}},
                     {"text": "x", "sampling_params": {"max_new_tokens": 2, "json_schema": json.dumps(
                         {"type": "object", "properties": {"a": {"$ref": p + "#/x"}}})}},
                     {"text": "x", "sampling_params": {"max_new_tokens": 2, "ebnf": f'%import {p} (X)\nstart: X'}},
                     {"text": "x", "extra_key": p, "rid": p + str(time.time_ns())}):
            srv.post("/generate", body)
        srv.post("/tokenize", {"text": p})
        srv.post("/v1/completions", {"model": p, "prompt": p, "max_tokens": 2})
        srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": p}], "max_tokens": 2,
                                          "chat_template_kwargs": {"path": p, "template": p}})
        srv.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "x"}], "max_tokens": 2,
                                          "response_format": {"type": "json_schema", "json_schema": {
                                              "name": p, "schema": {"$ref": p}}}})
    info = wait_idle(srv)
    assert info["audit"] == [], info["audit"]
    assert info["grammar"]["refused_opens"] == 0  # the workers never even tried


def test_a_killed_engine_comes_back_and_serves(tiny_model_path):
    import os
    import signal

    t0 = time.monotonic()
    with run_server("--model", tiny_model_path, "--max-total-tokens", "4096", "--log-level", "warning") as s:
        startup = time.monotonic() - t0
        before = s.post("/generate", {"text": "Hello there", "sampling_params": PLAIN}).json()["output_ids"]
        os.kill(s.get("/get_server_info").json()["engine_pid"], signal.SIGKILL)
        t1 = time.monotonic()
        while s.get("/health").status_code != 503:
            assert time.monotonic() - t1 < 10
            time.sleep(0.02)
        while s.get("/health").status_code != 200:
            assert time.monotonic() - t1 < startup + 60, "the engine did not come back"
            time.sleep(0.05)
        after = s.post("/generate", {"text": "Hello there", "sampling_params": PLAIN}).json()["output_ids"]
        assert after == before
        assert s.get("/get_server_info").json()["engine_restarts"] == 1


def test_sigterm_during_a_compile_ends_the_server_and_its_workers(srv):
    # last in this module: it stops the shared server
    import psutil

    engine = psutil.Process(srv.get("/get_server_info").json()["engine_pid"])
    procs = [engine, *engine.children(recursive=True)]
    assert any("grammar_worker" in " ".join(p.cmdline()) for p in procs[1:])
    t, box = in_thread(lambda: srv.post("/generate", {"text": "x", "sampling_params": {
        "max_new_tokens": 8, "regex": WORST_REGEXES[1] + "q"}}))
    time.sleep(0.5)  # compiling (its budget is 2 s of CPU)
    t0 = time.monotonic()
    assert srv.sigterm(timeout=10 + 5) == 0  # --graceful-shutdown-timeout 10 (the default)
    gone, alive = psutil.wait_procs(procs, timeout=max(0.1, 10 + 5 - (time.monotonic() - t0)))
    assert not alive, f"outlived the server: {[p.cmdline() for p in alive]}"
    t.join(10)
    assert not t.is_alive()  # the client got its answer or a closed connection, never a hang

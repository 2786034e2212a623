"""The server's per-request limits (docs/server.md, Limits): what a client gets at each one, against the fake engine."""

import json
import socket
import time

import pytest

from sglpy.runtime.server.config import ServerConfig, config_from_args
from sglpy.runtime.server.limits import json_depth
from sglpy.runtime.testing.server_harness import FAKE, run_server

ARGS = ("--engine-factory", FAKE, "--max-prompt-chars", "1000", "--max-constraint-bytes", "2000",
        "--max-schema-depth", "8", "--timeout-keep-alive", "1.5", "--max-request-bytes", "100000",
        "--max-running-requests", "2", "--max-queued-requests", "1")


@pytest.fixture(scope="module")
def srv():
    with run_server(*ARGS, env={"SGLPY_FAKE_TOKEN_DELAY": "0.01"}) as s:
        yield s


def nested(depth: int) -> dict:
    s = {"type": "string"}
    for _ in range(depth):
        s = {"type": "array", "items": s}
    return s


def error(resp, status, *words):
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    for w in words:
        assert w in err["message"], err
    return err


def test_flags_map_onto_the_config():
    c = config_from_args(list(ARGS))
    assert (c.max_prompt_chars, c.max_constraint_bytes, c.max_schema_depth, c.timeout_keep_alive) == (1000, 2000, 8, 1.5)
    d = ServerConfig()
    assert (d.max_prompt_chars, d.max_constraint_bytes, d.max_schema_depth) == (1_000_000, 1 << 20, 128)
    with pytest.raises(ValueError, match="max_schema_depth"):
        ServerConfig(max_schema_depth=-1)
    with pytest.raises(ValueError, match="timeout_keep_alive"):
        ServerConfig(timeout_keep_alive=0)


def test_json_depth():
    assert json_depth(json.dumps(nested(3)), 10) == 4
    assert json_depth(json.dumps(nested(50)), 10) == 11  # stops counting past the limit
    assert json_depth("[" * 5000 + "]" * 5000, 10) == 11  # deeper than the parser's recursion: too deep
    assert json_depth("not json", 10) == 0


def test_a_long_prompt_is_refused_before_tokenization(srv):
    err = error(srv.post("/generate", {"text": "x" * 1001}), 400, "1001 characters", "--max-prompt-chars")
    assert err["param"] == "prompt"
    error(srv.post("/v1/completions", {"model": "m", "prompt": "x" * 1001}), 400, "--max-prompt-chars")
    assert srv.post("/generate", {"text": "x" * 1000, "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_a_large_constraint_is_refused(srv):
    big = "a" * 2001
    err = error(srv.post("/generate", {"text": "x", "sampling_params": {"regex": big}}), 400, "--max-constraint-bytes")
    assert err["param"] == "regex"
    schema = {"type": "object", "properties": {f"f{i:04d}": {"type": "integer"} for i in range(100)}}
    error(srv.post("/v1/chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}],
                                            "response_format": {"type": "json_schema",
                                                                "json_schema": {"name": "s", "schema": schema}}}),
          400, "json_schema constraint", "--max-constraint-bytes")


def test_a_deep_schema_is_refused(srv):
    err = error(srv.post("/generate", {"text": "x", "sampling_params": {"json_schema": json.dumps(nested(8))}}),
                400, "deeper than 8", "--max-schema-depth")
    assert err["param"] == "json_schema"


def test_a_full_queue_is_a_503_with_retry_after(srv):
    import threading

    def long():
        srv.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 150}})

    threads = [threading.Thread(target=long) for _ in range(3)]
    for t in threads:
        t.start()
    time.sleep(0.5)
    r = srv.post("/generate", {"text": "y"})
    error(r, 503, "server busy")
    assert r.headers["Retry-After"] == "1"
    for t in threads:
        t.join(30)


def test_a_burst_past_the_queue_is_refused_not_admitted(srv):
    # requests arriving in the same instant all passed the door's count before any reached the engine: a burst of
    # 500 was admitted whole past a queue of 384
    import asyncio

    import aiohttp

    async def burst():
        async with aiohttp.ClientSession() as s:
            async def one():
                async with s.post(srv.url + "/generate", json={"text": "x", "sampling_params": {
                        "max_new_tokens": 300}}) as r:
                    await r.read()
                    return r.status, r.headers.get("Retry-After")
            return await asyncio.gather(*(one() for _ in range(20)))

    got = asyncio.run(burst())
    assert sorted(s for s, _ in got).count(200) == 3, got  # 2 running + 1 queued, the rest 503 + Retry-After
    assert all(ra == "1" for s, ra in got if s == 503) and len(got) == 20


def test_an_oversized_body_is_a_413(srv):
    error(srv.post("/generate", {"text": "x" * 200_000}), 413, "too large")


def test_an_idle_connection_is_closed_after_the_keep_alive_timeout(srv):
    port = int(srv.url.rsplit(":", 1)[1])
    never_sent, after_one = socket.create_connection(("127.0.0.1", port)), socket.create_connection(("127.0.0.1", port))
    after_one.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    assert after_one.recv(4096).startswith(b"HTTP/1.1 200")
    t0 = time.monotonic()
    for s in (never_sent, after_one):
        s.settimeout(10)
        assert s.recv(1) == b"", "the server should close an idle connection"  # EOF
    assert 1.0 < time.monotonic() - t0 < 6.0

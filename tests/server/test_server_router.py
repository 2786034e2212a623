"""`sglpy serve` workers behind sglang-router 0.3.2 (fake engines): every route, cache-aware affinity, a worker
killed under load, the circuit breaker, and the clients (sglpy's RuntimeEndpoint, `openai`) unchanged.

Facts about the router these tests rely on (observed with sglang-router 0.3.2): it keeps the `rid`
of /generate and OpenAI bodies, so each worker's request log says which requests it served; under cache_aware
a request that matches no cached prefix goes to the least-loaded worker, ties to the first, so prefix families
are started concurrently to spread them.
"""

from __future__ import annotations

import json
import os
import re
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

import sglpy as sgl
from sglpy import testing_programs
from sglpy.runtime.testing.router_cluster import router_missing_reason, run_router
from sglpy.runtime.testing.server_harness import FAKE, run_server, sse_events
from sglpy.runtime.testing.sglang_programs import CONSTRAINED

ENV = {"SGLPY_FAKE_TOKEN_DELAY": "0.01"}
JSON = {"Content-Type": "application/json"}  # the router refuses other bodies (curl -d sends a form type)


@pytest.fixture(scope="module")
def router_ok():
    reason = router_missing_reason()
    if reason:
        pytest.skip(reason)


@pytest.fixture(scope="module")
def workers(router_ok):
    with run_server("--engine-factory", FAKE, env=ENV) as w1, run_server("--engine-factory", FAKE, env=ENV) as w2:
        yield w1, w2


@pytest.fixture(scope="module")
def cache_aware(workers):
    with run_router([w.url for w in workers], "cache_aware") as router:
        yield router


def served_by(workers, rids) -> dict[str, int]:
    """rid -> index of the worker whose request log has it (each rid must be in exactly one log)."""
    logs = [w.log() for w in workers]
    where = {}
    for rid in rids:
        hits = [i for i, log in enumerate(logs) if re.search(rf"rid={re.escape(rid)} .*outcome=ok", log)]
        assert len(hits) == 1, f"rid {rid} served by workers {hits}"
        where[rid] = hits[0]
    return where


def generate(url, text, rid=None, max_new_tokens=8, **extra):
    body = {"text": text, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}, **extra}
    if rid:
        body["rid"] = rid
    return requests.post(url + "/generate", json=body, timeout=60)


# ---------------------------------------------------------------- every route


def test_native_generate_text_ids_and_stream(cache_aware):
    r = generate(cache_aware.url, "hello there", rid="native-1")
    assert r.status_code == 200 and r.json()["meta_info"]["completion_tokens"] == 8
    r = requests.post(cache_aware.url + "/generate", json={"input_ids": [40, 41, 42], "sampling_params":
                                                            {"max_new_tokens": 3}}, timeout=60)
    assert r.status_code == 200 and len(r.json()["output_ids"]) == 3
    r = requests.post(cache_aware.url + "/generate", json={"input_ids": [[40, 41], [42, 43]], "sampling_params":
                                                            {"max_new_tokens": 2}}, timeout=60)
    assert r.status_code == 200 and [len(o["output_ids"]) for o in r.json()] == [2, 2]  # batch ids pass
    with requests.post(cache_aware.url + "/generate", json={"text": "stream me", "stream": True,
                                                             "sampling_params": {"max_new_tokens": 5}},
                       stream=True, timeout=60) as r:
        events = sse_events(r)
    assert events[-1] == "[DONE]" and len(events) >= 2 and events[-2]["meta_info"]["completion_tokens"] == 5


def test_openai_routes_json_and_stream(cache_aware):
    u = cache_aware.url
    r = requests.post(u + "/v1/completions", json={"model": "anything", "prompt": "abc", "max_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 4
    chat = {"model": "anything", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = requests.post(u + "/v1/chat/completions", json=chat, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["finish_reason"] == "length"
    for path, body in (("/v1/completions", {"model": "m", "prompt": "abc", "max_tokens": 4}), ("/v1/chat/completions",
                                                                                                chat)):
        with requests.post(u + path, json={**body, "stream": True, "stream_options": {"include_usage": True}},
                           stream=True, timeout=60) as r:
            events = sse_events(r)
        assert r.status_code == 200 and events[-1] == "[DONE]"
        assert events[-2]["usage"]["completion_tokens"] == 4


def test_openai_client_unchanged(cache_aware):
    openai = pytest.importorskip("openai")
    client = openai.OpenAI(base_url=cache_aware.url + "/v1", api_key="unused")
    out = client.chat.completions.create(model="default", messages=[{"role": "user", "content": "Hi!"}], max_tokens=6)
    assert out.choices[0].message.content and out.usage.completion_tokens == 6
    pieces = [c.choices[0].delta.content or "" for c in client.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Count"}], max_tokens=5, stream=True) if c.choices]
    assert len("".join(pieces)) == 5
    out = client.completions.create(model="default", prompt="abc", max_tokens=3, extra_body={"top_k": 5})
    assert out.usage.completion_tokens == 3
    assert [m.id for m in client.models.list().data] == ["fake-model"]  # the router's own list (model_path)


@pytest.mark.parametrize("name", sorted(n for n in testing_programs.PROGRAMS if n not in CONSTRAINED))
def test_sglpy_runtime_endpoint_programs_unchanged(cache_aware, name):
    sgl.set_default_backend(sgl.RuntimeEndpoint(cache_aware.url))
    try:
        testing_programs.PROGRAMS[name]()
    finally:
        sgl.set_default_backend(None)


def test_flush_cache_fans_out_and_info_routes(cache_aware, workers):
    u = cache_aware.url
    r = requests.post(u + "/flush_cache", timeout=60)
    assert r.status_code == 200 and r.json()["workers_flushed"] == 2
    assert requests.get(u + "/get_model_info", timeout=60).json()["model_path"] == "fake-model"
    listed = requests.get(u + "/workers", timeout=60).json()["workers"]
    assert sorted(w["url"] for w in listed) == sorted(w.url for w in workers)
    assert all(w["is_healthy"] and w["metadata"]["dp_size"] == "1" for w in listed)
    loads = requests.get(u + "/get_loads", timeout=60).json()["workers"]
    assert sorted(x["load"] for x in loads) == [0, 0]  # our /get_load answered (-1 means it failed)
    metrics = requests.get(u + "/engine_metrics", timeout=60).text
    assert all(f'worker_addr="{w.url}"' in metrics for w in workers)


def test_flush_while_busy_is_a_partial_success_and_opens_no_circuit(cache_aware):
    """A worker with requests running refuses /flush_cache (400, SGLang's rule); the router reports 206
    partial_success and does not count it toward the circuit breaker (11 > its threshold of 10)."""
    with ThreadPoolExecutor(1) as pool:
        busy = pool.submit(generate, cache_aware.url, "keep a worker busy", max_new_tokens=300)
        time.sleep(0.5)
        flushes = [requests.post(cache_aware.url + "/flush_cache", timeout=60) for _ in range(11)]
        assert busy.result().status_code == 200
    assert {r.status_code for r in flushes} == {206}
    assert all(r.json()["status"] == "partial_success" and len(r.json()["failed"]) == 1 for r in flushes)
    assert "closed -> open" not in cache_aware.log()


def test_routes_the_router_does_not_forward(cache_aware):
    """Pinned router limits (docs/server.md): /tokenize and /abort_request are 404 at the router; a batch `text`
    is refused with 422 before any worker."""
    u = cache_aware.url
    assert requests.post(u + "/tokenize", json={"text": "hi"}, timeout=60).status_code == 404
    assert requests.post(u + "/abort_request", json={"rid": "x"}, timeout=60).status_code == 404
    r = requests.post(u + "/generate", json={"text": ["a", "b"], "sampling_params": {"max_new_tokens": 1}},
                      timeout=60)
    assert r.status_code == 422


# ---------------------------------------------------------------- cache-aware affinity

FAMILIES = {name: f"{name}: " + " ".join(f"example {k} of the {name} few-shot prefix." for k in range(40))
            for name in ("alpha", "beta", "gamma", "delta")}


def _family_rounds(url, tag, rounds=3, per_family=6):
    """Warm every family concurrently (so new prefixes spread), then `rounds` bursts of all families' questions."""
    rids = {}
    with ThreadPoolExecutor(len(FAMILIES) * per_family) as pool:
        warm = [pool.submit(generate, url, p + " warm", f"{tag}-{f}-warm", 30) for f, p in FAMILIES.items()]
        assert all(x.result().status_code == 200 for x in warm)
        for r in range(rounds):
            jobs = {}
            for f, p in FAMILIES.items():
                for q in range(per_family):
                    rid = f"{tag}-{f}-{r}-{q}"
                    jobs[rid] = pool.submit(generate, url, f"{p} Question {r}.{q}?", rid, 10)
                    rids[rid] = f
            assert all(j.result().status_code == 200 for j in jobs.values())
    return rids


def test_cache_aware_keeps_each_prefix_on_one_worker_and_uses_both(cache_aware, workers):
    rids = _family_rounds(cache_aware.url, "ca")
    where = served_by(workers, rids)
    by_family = {f: {where[rid] for rid, g in rids.items() if g == f} for f in FAMILIES}
    assert all(len(ws) == 1 for ws in by_family.values()), by_family
    assert {w for ws in by_family.values() for w in ws} == {0, 1}, by_family  # the families spread


def test_round_robin_splits_every_prefix(workers):
    with run_router([w.url for w in workers], "round_robin") as rr:
        rids = _family_rounds(rr.url, "rr", rounds=1)
    where = served_by(workers, rids)
    by_family = {f: {where[rid] for rid, g in rids.items() if g == f} for f in FAMILIES}
    assert all(ws == {0, 1} for ws in by_family.values()), by_family


def test_valid_traffic_never_opens_a_circuit(cache_aware):
    """Run after the tests above (module order): hundreds of valid requests, every worker still routable."""
    with ThreadPoolExecutor(16) as pool:
        outs = list(pool.map(lambda i: generate(cache_aware.url, f"valid {i}", max_new_tokens=i % 4).status_code,
                             range(64)))
    assert outs == [200] * 64
    assert "closed -> open" not in cache_aware.log()
    assert all(w["is_healthy"] for w in requests.get(cache_aware.url + "/workers", timeout=60).json()["workers"])


# ---------------------------------------------------------------- failures


def test_worker_400s_count_toward_the_circuit_breaker(router_ok):
    """Pinned router limit (docs/server.md): a client's invalid requests open the worker's circuit, after which
    valid requests get 503 no_available_workers until the circuit half-opens."""
    with run_server("--engine-factory", FAKE, env=ENV) as w:
        with run_router([w.url], "cache_aware", ("--cb-failure-threshold", "3", "--cb-timeout-duration-secs",
                                                 "600")) as router:
            bad = [requests.post(router.url + "/generate", json={"text": "x", "sampling_params": {"top_p": 7.0}},
                                 timeout=60).status_code for _ in range(3)]  # top_p > 1: the worker's 400
            assert bad == [400] * 3
            r = generate(router.url, "a valid one")
            assert r.status_code == 503 and "no_available_workers" in r.text


def _load(url, i, stream: bool):
    """One request of the load: ('ok' | 'truncated' | 'http <code>', seconds). Streams need [DONE] to be 'ok'."""
    t0 = time.monotonic()
    fam = list(FAMILIES)[i % 4]
    body = {"text": f"{FAMILIES[fam]} Q{i}", "rid": f"kill-{i}", "stream": stream,
            "sampling_params": {"max_new_tokens": 60, "temperature": 0}}
    try:
        with requests.post(url + "/generate", json=body, stream=stream, timeout=(5, 60)) as r:
            if r.status_code != 200:
                assert r.headers.get("content-type", "").startswith("application/json"), r.text
                json.loads(r.text)  # a clean error is a JSON body
                return f"http {r.status_code}", time.monotonic() - t0
            if not stream:
                assert r.json()["meta_info"]["completion_tokens"] == 60
                return "ok", time.monotonic() - t0
            events = sse_events(r)
            return ("ok" if events and events[-1] == "[DONE]" else "truncated"), time.monotonic() - t0
    except requests.exceptions.ChunkedEncodingError:
        return "truncated", time.monotonic() - t0


def _kill_one_worker_under_load() -> tuple:
    """Two workers behind the router, 32 requests, one worker killed mid-load: (results, after-kill statuses)."""
    with run_server("--engine-factory", FAKE, env=ENV, new_session=True) as w1, \
            run_server("--engine-factory", FAKE, env=ENV, new_session=True) as w2:
        with run_router([w1.url, w2.url], "cache_aware") as router:
            with ThreadPoolExecutor(32) as pool:
                futures = [pool.submit(_load, router.url, i, i % 3 == 0) for i in range(32)]
                time.sleep(0.3)  # requests are decoding on both workers (60 tokens x 10 ms)
                os.killpg(w2.proc.pid, signal.SIGKILL)  # the server and its engine process
                results = [f.result(timeout=120) for f in futures]  # a hang fails here
            # afterwards: a few clean failures at most while the dead worker's circuit opens, then only successes
            after = [generate(router.url, f"{p} after {i}", max_new_tokens=2).status_code
                     for i in range(8) for p in FAMILIES.values()]
    return results, after


def test_killing_a_worker_under_load_leaves_only_retried_or_cleanly_failed_requests(router_ok):
    for _ in range(3):  # a run where every request was retried or routed away proves nothing: run it again
        results, after = _kill_one_worker_under_load()
        if {o for o, _ in results} != {"ok"}:
            break
    outcomes = [o for o, _ in results]
    assert max(s for _, s in results) < 60
    assert set(outcomes) <= {"ok", "truncated", "http 500", "http 502", "http 503"}, outcomes
    assert outcomes.count("ok") >= 16, outcomes  # at least the live worker's share completed
    assert set(outcomes) != {"ok"}, "no request was in flight on the killed worker: the test proved nothing"
    # cut streams are the router's limit (no retry, no error event): only streams may end that way
    assert all(i % 3 == 0 for i, o in enumerate(outcomes) if o == "truncated"), outcomes
    assert set(after) <= {200, 500, 502, 503}, after
    assert after[-12:] == [200] * 12, after

"""The web console (GET /, its API) and request traces (--enable-trace, GET /trace/{rid}) over HTTP.

The fake engine covers auth, headers, the ring and stripping; the tiny random-weight model covers what needs the
real engine: per-token origins (cached prompt, jump-forward output), the compile check and the timeline.
"""

import json

import pytest
import requests

from sglpy.runtime.server.config import ServerConfig
from sglpy.runtime.server.trace import TraceRing, build_record
from sglpy.runtime.messages import GenerateReqInput
from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.testing.server_harness import FAKE, run_server, sse_events

KEY = "console-key"
SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module")
def fake(tmp_path_factory):
    with run_server("--engine-factory", FAKE, "--enable-trace", "--trace-capacity", "3", api_key=KEY) as s:
        yield s


@pytest.fixture(scope="module")
def tiny(tiny_model_path):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "4096", "--max-context-len", "512",
                    "--num-threads", "1", "--enable-trace") as s:
        yield s


def gen(srv, text, n=4, **sp):
    r = srv.post("/generate", {"text": text, "sampling_params": {"max_new_tokens": n, "temperature": 0, **sp}})
    assert r.status_code == 200, r.text
    return r.json()


# ---------------------------------------------------------------- page, headers, auth
def test_page_is_served_without_the_key_with_a_strict_csp(fake):
    for path, ctype in (("/", "text/html"), ("/console/app.js", "text/javascript"), ("/console/style.css", "text/css")):
        r = requests.get(fake.url + path, timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(ctype)
        csp = r.headers["Content-Security-Policy"]
        assert "script-src 'self'" in csp and "unsafe-inline" not in csp and "default-src 'none'" in csp
        assert r.headers["X-Content-Type-Options"] == "nosniff"
    page = requests.get(fake.url + "/", timeout=10).text
    assert "<script>" not in page and "onclick" not in page.lower() and "http" not in page  # no inline code, no CDN
    assert ".innerHTML" not in requests.get(fake.url + "/console/app.js", timeout=10).text


@pytest.mark.parametrize("method,path", [("GET", "/console/api/stats"), ("GET", "/trace"), ("GET", "/trace/x"),
                                         ("POST", "/console/api/compile"), ("POST", "/console/api/generate")])
def test_data_routes_need_the_key(fake, method, path):
    r = requests.request(method, fake.url + path, json={}, timeout=10)
    assert r.status_code == 401
    r = requests.request(method, fake.url + path, json={}, timeout=10, headers={"Authorization": "Bearer wrong"})
    assert r.status_code == 401


def test_stats_snapshot_and_history(fake):
    gen(fake, "warm up", 3)
    a = fake.get("/console/api/stats").json()
    assert a["ready"] and a["engine_alive"] and a["trace_enabled"] and a["engine_restarts"] == 0
    assert {"running", "queued", "inflight", "kv", "cache_hit_rate", "generation_tokens", "grammar"} <= set(a)
    assert a["generation_tokens"] >= 3 and a["history"]
    gen(fake, "more tokens", 6)
    import time
    time.sleep(0.6)  # polls closer than 0.5 s share one sample
    b = fake.get("/console/api/stats").json()
    assert b["generation_tokens"] >= a["generation_tokens"] + 6
    assert len(b["history"]) == len(a["history"]) + 1 and b["history"][-1]["tokens_per_s"] > 0


# ---------------------------------------------------------------- the ring (fake engine)
def test_api_responses_carry_no_trace_and_the_ring_keeps_the_newest(fake):
    outs = [gen(fake, f"prompt number {i}", 3) for i in range(5)]
    assert all("trace" not in o["meta_info"] for o in outs)
    listing = fake.get("/trace").json()
    assert listing["enabled"] and listing["capacity"] == 3
    assert [t["rid"] for t in listing["traces"]] == [o["meta_info"]["id"] for o in reversed(outs[2:])]
    assert fake.get("/trace/" + outs[0]["meta_info"]["id"]).status_code == 404
    rec = fake.get("/trace/" + outs[-1]["meta_info"]["id"]).json()
    assert "".join(t["text"] for t in rec["prompt"]) == "prompt number 4"
    assert [t["origin"] for t in rec["output"]] == ["sampled"] * 3
    assert "".join(t["text"] for t in rec["output"]) == outs[-1]["text"]
    phases = [p["phase"] for p in rec["timeline"]]
    assert phases[0] == "tokenize" and phases[-1] == "finish" and "decode" in phases
    assert rec["finish_reason"] == {"type": "length", "length": 3}


def test_openai_and_stream_requests_are_traced(fake):
    r = fake.post("/v1/completions", {"model": "x", "prompt": "openai prompt", "max_tokens": 2})
    assert r.status_code == 200
    s = fake.post("/generate", {"text": "streamed", "stream": True, "sampling_params": {"max_new_tokens": 2}},
                  stream=True)
    events = sse_events(s)
    assert all("trace" not in e["meta_info"] for e in events if isinstance(e, dict))
    routes = [t["route"] for t in fake.get("/trace").json()["traces"]]
    assert routes[:2] == ["/generate", "/v1/completions"]


def test_tracing_off_records_nothing_and_says_so():
    with run_server("--engine-factory", FAKE) as s:
        out = gen(s, "hello", 2)
        assert s.get("/trace").json() == {"enabled": False, "capacity": 0, "traces": []}
        r = s.get("/trace/" + out["meta_info"]["id"])
        assert r.status_code == 404 and "--enable-trace" in r.json()["error"]["message"]
        # the playground's own request still gets its trace inline
        ev = sse_events(s.post("/console/api/generate", {"prompt": "<b>x</b>", "sampling_params":
                                                         {"max_new_tokens": 3}}, stream=True))
        assert ev[-1] == "[DONE]" and "trace" in ev[0]["meta_info"]
        record = ev[-2]["record"]
        assert "".join(t["text"] for t in record["prompt"]) == "<b>x</b>" and len(record["output"]) == 3


def test_ring_unit():
    ring = TraceRing(2)
    inp = GenerateReqInput(rid="a", text="t", sampling=SamplingParams(max_new_tokens=1))
    for rid in ("a", "b", "c"):
        ring.add(build_record(GenerateReqInput(rid=rid, text="t"), "/generate", 0.0, None, None, "ok", 1.0))
    assert len(ring) == 2 and ring.get("a") is None and [t["rid"] for t in ring.recent(5)] == ["c", "b"]
    with pytest.raises(ValueError, match="capacity"):
        TraceRing(0)
    rec = build_record(inp, "/generate", 10.0, {"output_ids": [5, 6], "meta_info": {"prompt_tokens": 1}},
                       {"submitted": 10.1, "steps": [[10.2, 1], [10.3, 2]], "output_origins": "js",
                        "output_pieces": ["x", "y"], "prompt_pieces": ["t"]}, "ok", 10.4)
    assert [t["origin"] for t in rec["output"]] == ["jump_forward", "sampled"]
    assert [p["phase"] for p in rec["timeline"]] == ["tokenize", "queued", "first token", "decode", "finish"]


def test_config_fields():
    assert ServerConfig().enable_trace is False
    with pytest.raises(ValueError, match="trace_capacity"):
        ServerConfig(trace_capacity=0)


# ---------------------------------------------------------------- the real engine (tiny model)
def test_constrained_stream_has_origins_and_a_timeline(tiny):
    body = {"prompt": "Invent a person.", "chat": True, "return_logprob": True,
            "sampling_params": {"max_new_tokens": 40, "temperature": 0, "json_schema": json.dumps(SCHEMA)}}
    ev = sse_events(tiny.post("/console/api/generate", body, stream=True))
    chunks = [e for e in ev if isinstance(e, dict) and "meta_info" in e]
    assert chunks and ev[-1] == "[DONE]"  # a lagging reader may get fewer, cumulative chunks
    rec = ev[-2]["record"]
    origins = [t["origin"] for t in rec["output"]]
    assert origins[0] == "jump_forward" and "sampled" in origins  # '{"' is forced, the name is sampled
    assert origins.count("jump_forward") == rec["jump_forward_tokens"] == chunks[-1]["meta_info"]["jump_forward_tokens"]
    assert all(t["logprob"] is None for t in rec["output"] if t["origin"] == "jump_forward")
    assert all(isinstance(t["logprob"], float) for t in rec["output"] if t["origin"] == "sampled")
    assert "".join(t["text"] for t in rec["output"]).startswith(chunks[-1]["text"][:5])
    phases = [p["phase"] for p in rec["timeline"]]
    assert phases[:3] == ["compile wait", "queued", "prefill"] and phases[-1] == "finish"
    assert rec["grammar_s"] > 0 and rec["constraint"] == "json_schema"
    # the same prompt again: its prefix comes from the radix cache, and the ring has it
    ev2 = sse_events(tiny.post("/console/api/generate", body, stream=True))
    rec2 = ev2[-2]["record"]
    assert rec2["cached_tokens"] > 0
    n = min(rec2["cached_tokens"], rec2["prompt_tokens"])  # a forced opening's KV can be cached too
    assert [t["origin"] for t in rec2["prompt"]] == ["cached"] * n + ["prefilled"] * (rec2["prompt_tokens"] - n)
    assert tiny.get("/trace/" + rec2["rid"]).json()["cached_tokens"] == rec2["cached_tokens"]


def test_compile_check_reports_the_compiler_message(tiny):
    bad = tiny.post("/console/api/compile", {"kind": "json_schema", "value": json.dumps({"type": "objec"})}).json()
    assert bad["ok"] is False and "objec" in bad["error"]
    assert tiny.post("/console/api/compile", {"kind": "regex", "value": "(ab"}).json()["ok"] is False
    assert tiny.post("/console/api/compile", {"kind": "regex", "value": "[a-z]+"}).json()["ok"] is True
    assert tiny.post("/console/api/compile", {"kind": "choices", "value": ["a", "b"]}).json()["ok"] is True
    assert tiny.post("/console/api/compile", {"kind": "nope", "value": "x"}).status_code == 400
    routes = [t["route"] for t in tiny.get("/trace").json()["traces"]]
    assert "/console/api/compile" not in routes  # checks are not traced
    grammar = tiny.get("/console/api/stats").json()["grammar"]
    assert grammar["cached"] >= 2 and grammar["pending"] == 0 and grammar["errors"] >= 2


def test_console_generate_rejects_bad_input(tiny):
    assert tiny.post("/console/api/generate", {"prompt": ""}).status_code == 400
    assert tiny.post("/console/api/generate", {"prompt": "x", "bogus": 1}).status_code == 400
    r = tiny.post("/console/api/generate", {"prompt": "x", "sampling_params": {"regex": "(ab"}})
    assert r.status_code == 400 and "regex" in r.json()["error"]["message"]


def test_sglpy_trace_cli(fake, tmp_path, capsys):
    from sglpy.cli import main

    out = gen(fake, "cli <b>prompt</b>", 3)
    rid = out["meta_info"]["id"]
    assert main(["trace", "--url", fake.url, "--api-key", KEY, "--limit", "2"]) == 0
    table = capsys.readouterr().out
    assert rid[:32] in table and "cli <b>prompt</b>" in table
    assert main(["trace", "--url", fake.url, "--api-key", KEY, "--rid", rid]) == 0
    text = capsys.readouterr().out
    assert "timeline:" in text and "3 sampled" in text
    page = tmp_path / "t.html"
    assert main(["trace", "--url", fake.url, "--api-key", KEY, "--limit", "1", "--html", str(page)]) == 0
    doc = page.read_text()
    assert ">&lt;</span>" in doc and "<b>" not in doc and "<script" not in doc  # one span per (byte) token
    assert main(["trace", "--url", fake.url, "--api-key", "wrong"]) == 1
    assert "401" in capsys.readouterr().err

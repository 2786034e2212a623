"""LoRA adapters over HTTP: --lora-paths, lora_path in /generate (one per prompt), the OpenAI model field as an
adapter or `base:adapter` (an unknown name is a 404 naming the models), /v1/models, and /load_lora_adapter /
/unload_lora_adapter at run time (a bad adapter is a 400 naming the problem and the server keeps serving)."""

from __future__ import annotations

import pytest

pytest.importorskip("peft")

from sglpy.runtime.testing.server_harness import run_server  # noqa: E402
from sglpy.runtime.testing.tiny_lora import make_peft_adapter  # noqa: E402

GREEDY = {"max_new_tokens": 6, "temperature": 0}
PROMPT = "Once upon a time"


@pytest.fixture(scope="module")
def adapters(tiny_model_path, tmp_path_factory):
    d = tmp_path_factory.mktemp("adapters")
    return {"a": make_peft_adapter(tiny_model_path, d / "a", rank=4, targets=("q_proj", "v_proj"), seed=1),
            "b": make_peft_adapter(tiny_model_path, d / "b", rank=8, targets=("o_proj", "down_proj"), seed=2),
            "dora": make_peft_adapter(tiny_model_path, d / "dora", rank=4, config_extra={"use_dora": True})}


@pytest.fixture(scope="module")
def srv(tiny_model_path, adapters):
    with run_server("--model", tiny_model_path, "--max-total-tokens", "4096", "--max-context-len", "512",
                    "--num-threads", "1", "--served-model-name", "tiny", "--quantization", "none",
                    "--lora-paths", f"a={adapters['a']}", f'{{"lora_name": "b", "lora_path": "{adapters["b"]}"}}',
                    "--max-lora-rank", "8") as s:
        yield s


def _ids(srv, **body):
    r = srv.post("/generate", {"text": PROMPT, "sampling_params": GREEDY, **body})
    assert r.status_code == 200, r.text
    out = r.json()
    return [o["output_ids"] for o in out] if isinstance(out, list) else out["output_ids"]


def test_generate_lora_path_per_prompt(srv):
    base, a, b = _ids(srv), _ids(srv, lora_path="a"), _ids(srv, lora_path="b")
    assert len({tuple(base), tuple(a), tuple(b)}) == 3
    r = srv.post("/generate", {"text": [PROMPT] * 3, "sampling_params": GREEDY, "lora_path": ["b", None, "a"]})
    assert [o["output_ids"] for o in r.json()] == [b, base, a]
    r = srv.post("/generate", {"text": PROMPT, "sampling_params": GREEDY, "lora_path": "zzz"})
    assert r.status_code == 400 and "unknown LoRA adapter 'zzz'" in r.text


def test_openai_model_names_the_adapter(srv):
    def completion(model):
        return srv.post("/v1/completions", {"model": model, "prompt": PROMPT, "max_tokens": 6, "temperature": 0})

    texts = {m: completion(m).json()["choices"][0]["text"] for m in ("tiny", "a", "tiny:a", "default")}
    assert texts["a"] == texts["tiny:a"] != texts["tiny"] == texts["default"]
    r = completion("gpt-4o")
    assert r.status_code == 404 and "'gpt-4o'" in r.json()["error"]["message"] and "'a'" in r.json()["error"]["message"]
    ids = [m["id"] for m in srv.get("/v1/models").json()["data"]]
    assert ids == ["tiny", "a", "b"]
    assert srv.get("/v1/models/b").json()["parent"] == "tiny"


def test_load_bad_then_good_adapter_at_run_time(srv, adapters):
    r = srv.post("/load_lora_adapter", {"lora_name": "d", "lora_path": adapters["dora"]})
    assert r.status_code == 400 and "DoRA" in r.json()["error"]["message"]
    r = srv.post("/load_lora_adapter", {"lora_name": "d", "lora_path": "/nonexistent/adapter"})
    assert r.status_code == 400 and "not a folder" in r.json()["error"]["message"]
    assert _ids(srv, lora_path="a")  # still serving
    r = srv.post("/load_lora_adapter", {"lora_name": "a2", "lora_path": adapters["a"]})
    assert r.status_code == 200 and r.json()["success"] and "a2" in r.json()["loaded_adapters"]
    assert _ids(srv, lora_path="a2") == _ids(srv, lora_path="a")
    assert "a2" in [m["id"] for m in srv.get("/v1/models").json()["data"]]
    r = srv.post("/v1/unload_lora_adapter", {"lora_name": "a2"})
    assert r.status_code == 200 and "a2" not in r.json()["loaded_adapters"]
    r = srv.post("/generate", {"text": PROMPT, "sampling_params": GREEDY, "lora_path": "a2"})
    assert r.status_code == 400
    assert srv.post("/v1/completions", {"model": "a2", "prompt": PROMPT, "max_tokens": 2}).status_code == 404


def test_prefix_cache_is_per_adapter(srv):
    srv.post("/flush_cache")
    prompt = "A shared prefix long enough for the radix cache to matter in this test"
    cached = lambda lora: srv.post("/generate", {  # noqa: E731
        "text": prompt, "sampling_params": GREEDY, "lora_path": lora}).json()["meta_info"]["cached_tokens"]
    assert cached("a") == 0 and cached("b") == 0 and cached(None) == 0
    assert cached("a") > 0 and cached(None) > 0

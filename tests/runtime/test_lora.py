"""LoRA adapters per request on tiny random Llama and Qwen3 models: each of 3 PEFT adapters (ranks 4, 8, 16; attention,
all and MLP targets; rslora) gives HF transformers + PEFT's greedy tokens and prompt logprobs (1e-4, float32); a batch
mixing them with the base gives each row what it gets alone; the prefix cache never crosses adapters; bad adapters
are refused by name; adapters load and unload at run time; a quantized base runs float adapters."""

from __future__ import annotations

import threading

import pytest
import torch

pytest.importorskip("peft")

from sglpy.runtime.engine import Engine  # noqa: E402
from sglpy.runtime.testing import make_tiny_model  # noqa: E402
from sglpy.runtime.testing.tiny_lora import make_peft_adapter, peft_reference  # noqa: E402
from sglpy.runtime.testing.tiny_model import make_family_model  # noqa: E402

ATTN = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
ADAPTERS = {  # name -> (rank, alpha, targets, rslora)
    "attn4": (4, 16.0, ATTN, False),
    "all8": (8, 8.0, ATTN + MLP, True),
    "mlp16": (16, 32.0, MLP, False),
}
PROMPTS = ["The quick brown fox jumps over", "def fibonacci(n):", "Paris is the capital of"]
GREEDY = {"max_new_tokens": 8, "temperature": 0}


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def served(request, tmp_path_factory):
    """(engine, base folder, {name: adapter folder}) for one model family, float32, no quantization."""
    d = tmp_path_factory.mktemp(f"lora-{request.param}")
    base = make_tiny_model(d / "base") if request.param == "llama" else make_family_model(d / "base", "qwen3")
    folders = {name: make_peft_adapter(base, d / name, rank=r, alpha=a, targets=t, seed=i + 1, use_rslora=rs)
               for i, (name, (r, a, t, rs)) in enumerate(ADAPTERS.items())}
    eng = Engine(base, quantization="none", grammar_workers=0, lora_paths=[f"{n}={p}" for n, p in folders.items()])
    yield eng, base, folders
    eng.shutdown()


def _hf(base, folder, ids):
    """HF + PEFT: greedy ids after the prompt, and each prompt token's logprob (positions 1..)."""
    model = peft_reference(base, folder)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=GREEDY["max_new_tokens"], do_sample=False)
        logp = model(torch.tensor([ids])).logits[0].log_softmax(-1)
    return out[0, len(ids):].tolist(), [logp[i - 1, ids[i]].item() for i in range(1, len(ids))]


@pytest.mark.parametrize("name", [None, *ADAPTERS])
def test_matches_hf_peft(served, name):
    eng, base, folders = served
    for prompt in PROMPTS[:2]:
        ids = eng.tokenize([prompt])[0]
        out = eng.generate(prompt, GREEDY, lora_path=name, return_logprob=True, logprob_start_len=0)
        want_ids, want_lp = _hf(base, folders.get(name), ids)
        assert out["output_ids"] == want_ids, (name, prompt)
        got_lp = [e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]
        assert max(abs(a - b) for a, b in zip(got_lp, want_lp)) < 1e-4


def test_adapters_change_the_output(served):
    eng, _, _ = served
    outs = {n: eng.generate(PROMPTS[0], GREEDY, lora_path=n)["output_ids"] for n in [None, *ADAPTERS]}
    assert len({tuple(v) for v in outs.values()}) == len(outs)  # else the comparisons above prove little


def test_mixed_batch_gives_each_row_what_it_gets_alone(served):
    eng, _, _ = served
    eng.flush_cache()
    names = [None, "attn4", "all8", "mlp16", "all8", None]
    prompts = [PROMPTS[i % 3] + " and" for i in range(len(names))]
    kw = dict(return_logprob=True, logprob_start_len=0)
    alone = [eng.generate(p, GREEDY, lora_path=n, **kw) for p, n in zip(prompts, names)]
    eng.flush_cache()
    mixed = eng.generate(prompts, GREEDY, lora_path=names, **kw)
    for a, m in zip(alone, mixed):
        assert m["output_ids"] == a["output_ids"]
        for x, y in zip(a["meta_info"]["input_token_logprobs"][1:], m["meta_info"]["input_token_logprobs"][1:]):
            assert abs(x[0] - y[0]) < 1e-4


def test_prefix_cache_never_crosses_adapters(served):
    eng, _, _ = served
    eng.flush_cache()
    prompt = "A long shared prefix about caching in serving systems, repeated for the radix tree"
    cached = lambda n: eng.generate(prompt, GREEDY, lora_path=n)["meta_info"]["cached_tokens"]  # noqa: E731
    assert cached("attn4") == 0
    assert cached("all8") == 0 and cached(None) == 0  # same prompt, other adapter / the base: nothing reused
    assert cached("attn4") > 0 and cached(None) > 0  # the same adapter, and the base among itself, share


def test_unknown_adapter_is_named(served):
    eng, _, _ = served
    with pytest.raises(ValueError, match="unknown LoRA adapter 'nope'.*attn4"):
        eng.generate(PROMPTS[0], GREEDY, lora_path="nope")
    assert eng.generate(PROMPTS[0], GREEDY, lora_path="attn4")["output_ids"]  # still serving


def test_load_and_unload_at_run_time(served, tmp_path):
    eng, base, folders = served
    before = eng.generate(PROMPTS[1], GREEDY, lora_path="attn4")
    info = eng.load_lora_adapter("again", folders["attn4"])
    assert info["rank"] == 4 and "again" in [a["name"] for a in eng.list_lora_adapters()]
    assert eng.generate(PROMPTS[1], GREEDY, lora_path="again")["output_ids"] == before["output_ids"]
    with pytest.raises(ValueError, match="already loaded"):
        eng.load_lora_adapter("again", folders["all8"])
    eng.unload_lora_adapter("again")
    with pytest.raises(ValueError, match="unknown LoRA adapter 'again'"):
        eng.generate(PROMPTS[1], GREEDY, lora_path="again")
    with pytest.raises(ValueError, match="no LoRA adapter named 'again'"):
        eng.unload_lora_adapter("again")


def test_a_load_does_not_pause_running_requests(served, monkeypatch):
    """The adapter's files are read on the caller's thread: a whole request runs while a load is stuck reading."""
    import sglpy.runtime.lora.manager as manager

    eng, _, folders = served
    reading, release = threading.Event(), threading.Event()
    real = manager.load_adapter

    def stuck_read(*args, **kwargs):
        reading.set()
        assert release.wait(60)
        return real(*args, **kwargs)

    monkeypatch.setattr(manager, "load_adapter", stuck_read)
    want = eng.generate(PROMPTS[2], GREEDY, lora_path="attn4")["output_ids"]
    loader = threading.Thread(target=eng.load_lora_adapter, args=("slow", folders["mlp16"]))
    loader.start()
    try:
        assert reading.wait(60)
        assert eng.generate(PROMPTS[2], GREEDY, lora_path="attn4")["output_ids"] == want
        assert loader.is_alive()  # still reading: the request above ran all its steps meanwhile
    finally:
        release.set()
        loader.join(60)
    assert "slow" in [a["name"] for a in eng.list_lora_adapters()]
    eng.unload_lora_adapter("slow")


def test_unload_refused_while_a_request_uses_it(served):
    eng, _, folders = served
    eng.load_lora_adapter("busy", folders["mlp16"])
    chunks = eng.generate(PROMPTS[0], {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}, stream=True,
                          lora_path="busy")
    next(chunks)  # running now
    with pytest.raises(ValueError, match="'busy' is in use by 1 request"):
        eng.unload_lora_adapter("busy")
    for _ in chunks:
        pass
    eng.unload_lora_adapter("busy")


@pytest.mark.parametrize("extra,match", [
    ({"use_dora": True}, "DoRA"),
    ({"modules_to_save": ["embed_tokens"]}, "modules_to_save"),
    ({"peft_type": "IA3"}, "peft_type"),
    ({"r": 5}, "rank 8, its config says 5"),
])
def test_bad_adapters_are_refused_by_name(served, tmp_path, extra, match):
    eng, base, _ = served
    folder = make_peft_adapter(base, tmp_path / "bad", rank=8, targets=ATTN, config_extra=extra)
    with pytest.raises(ValueError, match=match):
        eng.load_lora_adapter("bad", folder)
    assert "bad" not in [a["name"] for a in eng.list_lora_adapters()]


def test_base_mismatch_and_pool_limits_are_named(served, tmp_path):
    eng, base, _ = served
    other = make_tiny_model(tmp_path / "wide", hidden=96, num_layers=3)
    with pytest.raises(ValueError, match="does not fit the base model"):
        eng.load_lora_adapter("wide", make_peft_adapter(other, tmp_path / "wide-ad", rank=4, targets=ATTN))
    with pytest.raises(ValueError, match="above max_lora_rank 16"):
        eng.load_lora_adapter("big", make_peft_adapter(base, tmp_path / "big", rank=32, targets=MLP))
    with pytest.raises(ValueError, match="not a folder"):
        eng.load_lora_adapter("none", str(tmp_path / "missing"))


def test_quantized_base_runs_float_adapters(tmp_path):
    base = make_tiny_model(tmp_path / "base", hidden=64, intermediate=128)
    folder = make_peft_adapter(base, tmp_path / "ad", rank=8, targets=ATTN + MLP, seed=5)
    eng = Engine(base, quantization="int8", grammar_workers=0, lora_paths=[f"ad={folder}"])
    try:
        ids = eng.tokenize([PROMPTS[2]])[0]
        out = eng.generate(PROMPTS[2], GREEDY, lora_path="ad", return_logprob=True, logprob_start_len=0)
        _, want = _hf(base, folder, ids)
        got = [e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]
        assert max(abs(a - b) for a, b in zip(got, want)) < 0.05  # int8 weights: close to the float reference
        decode = eng.generate([PROMPTS[2]] * 3, GREEDY, lora_path=["ad", None, "ad"])  # decode rows mix the two
        assert decode[0]["output_ids"] == decode[2]["output_ids"] != decode[1]["output_ids"]
    finally:
        eng.shutdown()


def test_lora_refusals_in_config():
    from sglpy.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="tensor parallelism"):
        EngineConfig(enable_lora=True, tp_size=2)
    with pytest.raises(ValueError, match="deterministic"):
        EngineConfig(enable_lora=True, enable_deterministic_inference=True)
    with pytest.raises(ValueError, match="lru or fifo"):
        EngineConfig(enable_lora=True, lora_eviction_policy="random")
    with pytest.raises(ValueError, match="lora_dtype must be one of"):
        EngineConfig(enable_lora=True, lora_dtype="float16")
    with pytest.raises(ValueError, match="unique"):
        EngineConfig(lora_paths=["a=/x", "a=/y"])
    refs = EngineConfig(lora_paths=["a=/x", '{"lora_name": "b", "lora_path": "/y", "pinned": true}', "/z"]).lora_paths
    assert [(r.name, r.path) for r in refs] == [("a", "/x"), ("b", "/y"), ("/z", "/z")]


def test_frontend_run_and_run_batch_take_lora_path(served):
    import sglpy as sgl

    eng, _, _ = served
    backend = sgl.Engine(engine=eng)

    @sgl.function
    def story(s, start):
        s += start
        s += sgl.gen("more", max_tokens=6, temperature=0)

    want = {n: eng.generate(PROMPTS[0], {"max_new_tokens": 6, "temperature": 0}, lora_path=n)["text"]
            for n in (None, "all8")}
    assert story.run(PROMPTS[0], backend=backend, lora_path="all8")["more"] == want["all8"]
    states = story.run_batch([{"start": PROMPTS[0]}] * 2, backend=backend, lora_path="all8")
    assert [s["more"] for s in states] == [want["all8"]] * 2
    assert story.run(PROMPTS[0], backend=backend)["more"] == want[None]


def test_ngram_speculation_keeps_the_adapters_outputs(tmp_path):
    base = make_tiny_model(tmp_path / "base")
    folder = make_peft_adapter(base, tmp_path / "ad", rank=8, targets=ATTN + MLP, seed=7, scale=0.05)
    prompt = "one two three four one two three four one two three"
    sp = {"max_new_tokens": 16, "temperature": 0}
    outs = {}
    for spec in (None, "NGRAM"):
        eng = Engine(base, quantization="none", grammar_workers=0, lora_paths=[f"ad={folder}"],
                     speculative_algorithm=spec)
        try:
            outs[spec] = [eng.generate(prompt, sp, lora_path=n)["output_ids"] for n in ("ad", None)]
        finally:
            eng.shutdown()
    assert outs["NGRAM"] == outs[None] and outs[None][0] != outs[None][1]


@pytest.mark.slow
def test_default_model_adapters_match_hf_peft(default_model_path, tmp_path):
    """3 adapters of ranks 4, 8, 16 on the default model (float32): greedy tokens and prompt logprobs as HF + PEFT;
    a batch mixing them with the base gives each row its own answer."""
    from sglpy.runtime.testing.tiny_lora import module_shapes, write_random_adapter

    layers, shapes = module_shapes(default_model_path)
    specs = {"attn4": (4, ATTN), "all8": (8, ATTN + MLP), "mlp16": (16, MLP)}
    folders = {n: write_random_adapter(tmp_path / n, layers, shapes, r, targets=t, seed=i, scale=0.05)
               for i, (n, (r, t)) in enumerate(specs.items())}
    eng = Engine(default_model_path, quantization="none", grammar_workers=0, max_total_tokens=4096,
                 lora_paths=[f"{n}={p}" for n, p in folders.items()])
    try:
        prompt = "The three primary colors are"
        ids = eng.tokenize([prompt])[0]
        names = [None, *specs]
        alone = {}
        for n in names:
            out = eng.generate(prompt, GREEDY, lora_path=n, return_logprob=True, logprob_start_len=0)
            want_ids, want_lp = _hf(default_model_path, folders.get(n), ids)
            assert out["output_ids"] == want_ids, n
            got = [e[0] for e in out["meta_info"]["input_token_logprobs"][1:]]
            assert max(abs(a - b) for a, b in zip(got, want_lp)) < 1e-4, n
            alone[n] = out["output_ids"]
        assert len({tuple(v) for v in alone.values()}) == len(names)
        eng.flush_cache()
        mixed = eng.generate([prompt] * len(names), GREEDY, lora_path=names)
        assert [m["output_ids"] for m in mixed] == [alone[n] for n in names]
    finally:
        eng.shutdown()

"""Engine behaviour on the tiny model: batching, pool accounting, preemption, stops, streaming, errors."""

import asyncio
import re
import threading

import pytest

from sglpy.runtime.engine import Engine


@pytest.fixture(scope="module")
def engine(tiny_model_path):
    eng = Engine(tiny_model_path, max_total_tokens=4096, debug_invariants=True, seed=1)
    yield eng
    eng.shutdown()


# float32 weights (the CPU default, auto, quantizes): for logprobs that must equal HF's, and for greedy outputs compared
# across batch shapes, chunking and preemption. Those are bit-identical in float32 only: int8 rounds the
# activations to bf16 for its kernels, so a last-bit attention difference between batch shapes (gather vs
# in-place read) can flip a near-tie of the random tiny model's logits.
FP32 = {"quantization": "none"}


@pytest.fixture(scope="module")
def engine_fp32(tiny_model_path):
    eng = Engine(tiny_model_path, max_total_tokens=4096, debug_invariants=True, seed=1, **FP32)
    yield eng
    eng.shutdown()


def _assert_no_leak(eng):
    info = eng.get_server_info()
    assert info["kv_used"] == 0 and info["num_running_reqs"] == 0, info
    assert info["kv_free"] + info["kv_evictable"] == info["max_total_num_tokens"]


def test_batch_results_in_input_order_and_equal_single_runs(engine_fp32):
    engine = engine_fp32
    prompts = [f"Prompt number {i} says" + " hi" * i for i in range(12)]
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    batch = engine.generate(prompts, sp)
    singles = [engine.generate(p, sp) for p in prompts]
    assert [b["output_ids"] for b in batch] == [s["output_ids"] for s in singles]
    for b in batch:
        assert b["meta_info"]["completion_tokens"] == 10
        assert b["meta_info"]["finish_reason"] == {"type": "length", "length": 10}
    _assert_no_leak(engine)


def test_tiny_pool_forces_preemption_and_keeps_outputs(tiny_model_path, engine_fp32):
    engine = engine_fp32
    prompts = [f"Story {i}: " + "word " * (20 + i) for i in range(8)]
    sp = {"max_new_tokens": 40, "temperature": 0, "ignore_eos": True}
    expected = [o["output_ids"] for o in engine.generate(prompts, sp)]
    small = Engine(tiny_model_path, max_total_tokens=200, debug_invariants=True, chunked_prefill_size=64, **FP32)
    try:
        got = small.generate(prompts, sp)
        info = small.get_server_info()
        assert [g["output_ids"] for g in got] == expected
        assert info["total_retractions"] > 0, "the pool was meant to be too small for all requests at once"
        _assert_no_leak(small)
    finally:
        small.shutdown()


def test_chunked_prefill_matches_unchunked(tiny_model_path, engine_fp32):
    engine = engine_fp32
    prompt = "long " * 300
    sp = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    ref = engine.generate(prompt, sp)["output_ids"]
    chunked = Engine(tiny_model_path, max_total_tokens=2048, chunked_prefill_size=37, debug_invariants=True, **FP32)
    try:
        assert chunked.generate(prompt, sp)["output_ids"] == ref
    finally:
        chunked.shutdown()


def test_stop_string_across_tokens_is_trimmed(engine):
    base = engine.generate("Count: one two", {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True})
    text = base["text"]
    assert len(text) > 6
    stop = text[3:6]  # a stop string that need not align with token boundaries
    out = engine.generate("Count: one two", {"max_new_tokens": 12, "temperature": 0, "stop": [stop]})
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}
    assert out["text"] == text[: text.find(stop)]
    keep = engine.generate("Count: one two", {"max_new_tokens": 12, "temperature": 0, "stop": stop,
                                               "no_stop_trim": True})
    assert keep["text"].endswith(stop)


def test_stop_token_ids_and_min_new_tokens(engine):
    base = engine.generate("abc", {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True})
    first = base["output_ids"][0]
    out = engine.generate("abc", {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [first]})
    assert out["output_ids"] == [first]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": first}
    out = engine.generate("abc", {"max_new_tokens": 6, "temperature": 0, "stop_token_ids": [first],
                                  "min_new_tokens": 3})
    assert len(out["output_ids"]) >= 3 and out["output_ids"][0] != first


def test_seeded_sampling_is_reproducible(engine):
    sp = {"max_new_tokens": 12, "temperature": 1.0, "top_p": 0.9, "top_k": 50, "seed": 1234}
    a = engine.generate("Seeded", sp)["output_ids"]
    b = engine.generate("Seeded", sp)["output_ids"]
    c = engine.generate("Seeded", dict(sp, seed=99))["output_ids"]
    assert a == b and a != c


def test_streaming_is_cumulative_and_ends_with_finish(engine):
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    chunks = list(engine.generate("Stream me", sp, stream=True))
    texts = [c["text"] for c in chunks]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"
    assert texts[-1] == engine.generate("Stream me", sp)["text"]


def test_generate_stream_yields_deltas(engine):
    sp = {"max_new_tokens": 10, "temperature": 0, "ignore_eos": True}
    chunks = list(engine.generate_stream("Deltas please", sp))
    assert "".join(c["delta"] for c in chunks) == chunks[-1]["text"] == engine.generate("Deltas please", sp)["text"]
    assert chunks[-1]["meta_info"]["finish_reason"]["type"] == "length"


def test_async_generate_and_stream(engine):
    async def main():
        sp = {"max_new_tokens": 5, "temperature": 0}
        outs = await asyncio.gather(*(engine.async_generate(f"async {i}", sp) for i in range(4)))
        chunks = [c async for c in await engine.async_generate("async stream", sp, stream=True)]
        return outs, chunks

    outs, chunks = asyncio.run(main())
    assert len(outs) == 4 and chunks[-1]["meta_info"]["finish_reason"] is not None


def test_abort_running_request_frees_kv(engine):
    sp = {"max_new_tokens": 2000, "temperature": 0, "ignore_eos": True}
    gen = engine.generate("abort me", sp, stream=True, rid="to-abort")
    next(gen)
    engine.abort("to-abort")
    last = list(gen)[-1]
    assert last["meta_info"]["finish_reason"]["type"] == "abort"
    _assert_no_leak(engine)


def test_prompt_logprobs_for_select_style_scoring(engine_fp32, tiny_model_path):
    """Scores of several continuations of one prompt equal a direct HF computation."""
    import torch
    from transformers import AutoModelForCausalLM

    engine = engine_fp32
    tok = engine.tokenizer
    prefix = "The answer is"
    choices = [" yes", " no", " maybe later"]
    outs = engine.generate([prefix + c for c in choices],
                           {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0, top_logprobs_num=2)
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    for c, out in zip(choices, outs):
        ids = tok.encode(prefix + c)
        lps = out["meta_info"]["input_token_logprobs"]
        assert [x[1] for x in lps] == ids and lps[0][0] is None
        with torch.no_grad():
            ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
        for pos in range(1, len(ids)):
            assert abs(lps[pos][0] - ref[pos - 1, ids[pos]].item()) < 1e-3
        assert len(out["meta_info"]["input_top_logprobs"][1]) == 2
        assert out["meta_info"]["completion_tokens"] == 0
    _assert_no_leak(engine)


def test_prompt_logprobs_follow_the_frontend_start_rule(engine_fp32, tiny_model_path):
    """logprob_start_len k >= 0: entries for positions k..P-1 with values, null only for position 0 (the rule
    SGLang's frontend select was written for; SGLang 0.5.23 nulls the first entry for every k, docs/server.md);
    -1 with return_logprob: one null entry for the last prompt token."""
    import torch
    from transformers import AutoModelForCausalLM

    engine = engine_fp32
    hf = AutoModelForCausalLM.from_pretrained(tiny_model_path, dtype=torch.float32)
    ids = engine.tokenizer.encode("Counting the entries of a scored prompt")
    with torch.no_grad():
        ref = torch.log_softmax(hf(torch.tensor([ids])).logits[0].float(), -1)
    engine.generate(input_ids=ids[:5], sampling_params={"max_new_tokens": 0})  # a cached prefix must not matter
    for k in (0, 1, 3, 5, len(ids) - 1, len(ids)):
        meta = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                               logprob_start_len=k, top_logprobs_num=1)["meta_info"]
        lps = meta["input_token_logprobs"]
        assert [e[1] for e in lps] == ids[k:]
        first = 1 if k == 0 else k
        if k == 0:
            assert lps[0][0] is None and meta["input_top_logprobs"][0] is None
        assert [e[0] for e in lps[first - k:]] == pytest.approx(
            [ref[p - 1, ids[p]].item() for p in range(first, len(ids))], abs=1e-3)
        assert meta["output_token_logprobs"] == [] and meta["output_token_logprobs_length"] == 0
    for start in (None, -1):
        out = engine.generate(input_ids=[ids, ids[:4]], sampling_params={"max_new_tokens": 2, "temperature": 0},
                              return_logprob=True, logprob_start_len=start, return_text_in_logprobs=True)
        for o, x in zip(out, (ids, ids[:4])):
            assert o["meta_info"]["input_token_logprobs"] == [[None, x[-1], engine.tokenizer.decode([x[-1]])]]
            assert o["meta_info"]["output_token_logprobs_length"] == 2
    _assert_no_leak(engine)


def test_output_logprobs_shape(engine):
    out = engine.generate("x y z", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True},
                          return_logprob=True, top_logprobs_num=3, return_text_in_logprobs=True)
    lps = out["meta_info"]["output_token_logprobs"]
    assert [x[1] for x in lps] == out["output_ids"]
    assert all(isinstance(x[2], str) for x in lps)
    tops = out["meta_info"]["output_top_logprobs"]
    assert all(len(t) == 3 and t[0][1] == x[1] for t, x in zip(tops, lps))  # greedy: chosen is the top


@pytest.mark.parametrize("bad, match", [
    (dict(prompt=""), "empty"),
    (dict(prompt="x", sampling_params={"max_new_tokens": -1}), "max_new_tokens"),
    (dict(prompt="x", sampling_params={"top_p": 0}), "top_p"),
    (dict(prompt="x", sampling_params={"tempurature": 0.5}), "unknown sampling parameter"),
    (dict(prompt="x", sampling_params={"temperature": "hot"}), "temperature"),
    (dict(input_ids=[]), "empty"),
    (dict(input_ids=[1, 10**9]), "outside the vocabulary"),
    (dict(prompt="word " * 5000), "context"),
    (dict(prompt="x", sampling_params={"regex": "a", "json_schema": {}}), "at most one constraint"),
])
def test_bad_input_is_a_clear_error_and_engine_keeps_serving(engine, bad, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(**bad)
    assert engine.generate("still alive", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] <= 2


def test_unknown_engine_option_is_named():
    with pytest.raises(ValueError, match="max_total_tokenz"):
        Engine(None, max_total_tokenz=5)


def test_many_threads_at_once(engine):
    results = {}

    def worker(i):
        results[i] = engine.generate(f"thread {i}", {"max_new_tokens": 6, "temperature": 0})

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    [t.start() for t in threads]
    [t.join(timeout=120) for t in threads]
    assert len(results) == 16
    _assert_no_leak(engine)


def test_flush_cache(engine):
    assert engine.flush_cache() is True
    info = engine.get_server_info()
    assert info["kv_free"] == info["max_total_num_tokens"]


def test_detokenizer_never_streams_half_characters(engine):
    from sglpy.runtime.engine.detokenizer import IncrementalDetokenizer

    tok = engine.tokenizer
    text = "naïve café 🙂 日本語 ok"
    ids = tok.encode(text, add_special_tokens=False)
    d = IncrementalDetokenizer(tok, [])
    pieces = [d.push([t]) for t in ids]
    assert all("\ufffd" not in p for p in pieces)
    assert "".join(pieces) + d.flush() == text
    cut = IncrementalDetokenizer(tok, [])
    emoji = tok.encode("🙂", add_special_tokens=False)
    if len(emoji) > 1:  # a finish in the middle of a character drops the partial character
        assert cut.push(emoji[:1]) == "" and cut.flush() == ""


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_half_precision_dtypes_run(tiny_model_path, dtype):
    eng = Engine(tiny_model_path, dtype=dtype, max_total_tokens=512)
    try:
        out = eng.generate("half precision", {"max_new_tokens": 4, "temperature": 0, "ignore_eos": True})
        assert out["meta_info"]["completion_tokens"] == 4
        assert eng.kv.buffers.k_buffer.dtype == getattr(__import__("torch"), dtype)
    finally:
        eng.shutdown()


def test_stop_regex_cuts_at_the_first_match_and_streaming_never_shows_it(engine):
    prompt, sp = "Numbers follow:", {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    full = engine.generate(prompt, sp)["text"]
    i = len(full) // 2
    pattern = "(?s)" + re.escape(full[i]) + "." + re.escape(full[i + 2])  # fixed length: same first match in
    m = re.search(pattern, full)                                         # every prefix that contains one
    out = engine.generate(prompt, {**sp, "stop_regex": pattern})
    assert out["text"] == full[: m.start()]
    assert out["meta_info"]["finish_reason"] == {"type": "stop", "matched": pattern}
    kept = engine.generate(prompt, {**sp, "stop_regex": [pattern], "no_stop_trim": True})
    assert kept["text"] == full[: m.end()]
    chunks = [c["text"] for c in engine.generate(prompt, {**sp, "stop_regex": pattern}, stream=True)]
    assert chunks[-1] == full[: m.start()] and all(chunks[-1].startswith(c) for c in chunks)
    # a match that could still complete from the first character on holds back all text until the end
    chunks = [c["text"] for c in engine.generate(prompt, {**sp, "stop_regex": "(?s)" + re.escape(full[0]) + ".*NEVER"},
                                                 stream=True)]
    assert len(chunks) > 2 and chunks[-1] == full and all(c == "" for c in chunks[:-1])
    with pytest.raises(ValueError, match="stop_regex"):
        engine.generate(prompt, {**sp, "stop_regex": "(unclosed"})
    _assert_no_leak(engine)


def test_model_is_loaded_and_run_on_the_loop_thread(tiny_model_path, monkeypatch):
    """libgomp keeps one worker pool per thread that runs a parallel torch op; a second pool (the caller's)
    made every CPU decode step 1.5-2x slower, so loading, warm-up and forwards all stay on the loop thread."""
    from sglpy.runtime.engine import engine as engine_mod

    seen = []

    class SpyRunner(engine_mod.ModelRunner):
        def __init__(self, *args, **kwargs):
            seen.append(("load", threading.current_thread().name))
            super().__init__(*args, **kwargs)

        def forward(self, *args, **kwargs):
            seen.append(("forward", threading.current_thread().name))
            return super().forward(*args, **kwargs)

    monkeypatch.setattr(engine_mod, "ModelRunner", SpyRunner)
    with Engine(tiny_model_path, max_total_tokens=512) as eng:
        eng.generate("hi", {"max_new_tokens": 2})
    assert {what for what, _ in seen} == {"load", "forward"}
    assert {name for _, name in seen} == {"sglpy-engine"}


def test_a_failed_model_load_raises_in_the_constructing_thread(tiny_model_path, monkeypatch):
    from sglpy.runtime.engine import engine as engine_mod

    class BrokenRunner:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("weights are unreadable")

    monkeypatch.setattr(engine_mod, "ModelRunner", BrokenRunner)
    with pytest.raises(RuntimeError, match="weights are unreadable"):
        Engine(tiny_model_path, max_total_tokens=512)

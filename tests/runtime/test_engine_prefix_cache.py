"""Radix cache inside the engine: cached-token counts, identical outputs with the cache on/off, eviction."""

import pytest

from sglpy.runtime.engine import Engine


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    # float32: outputs with and without the cache are compared, and a cached prefix changes the batch shapes
    # (quantized outputs may differ in the last bits with the batch; docs/runtime.md)
    on = Engine(tiny_model_path, max_total_tokens=8192, debug_invariants=True, quantization="none")
    off = Engine(tiny_model_path, max_total_tokens=8192, debug_invariants=True, disable_radix_cache=True,
                 quantization="none")
    yield on, off
    on.shutdown()
    off.shutdown()


def test_cached_token_counts(engines):
    on, _ = engines
    assert on.flush_cache()
    sp = {"max_new_tokens": 1, "temperature": 0}
    short = list(range(1000, 1100))
    long = list(range(1000, 2500))
    assert on.generate(input_ids=short, sampling_params=sp)["meta_info"]["cached_tokens"] == 0
    assert on.generate(input_ids=long, sampling_params=sp)["meta_info"]["cached_tokens"] == 100
    assert on.generate(input_ids=long, sampling_params=sp)["meta_info"]["cached_tokens"] == 1499
    other = on.generate(input_ids=long, sampling_params=sp, extra_key="salt")
    assert other["meta_info"]["cached_tokens"] == 0  # a different namespace never matches


def test_cache_off_reports_zero(engines):
    _, off = engines
    sp = {"max_new_tokens": 1, "temperature": 0}
    off.generate("same prompt twice", sp)
    assert off.generate("same prompt twice", sp)["meta_info"]["cached_tokens"] == 0


def test_multi_turn_and_shared_prefix_outputs_identical(engines):
    on, off = engines
    sp = {"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}
    for eng in engines:
        eng.flush_cache()
    # multi-turn: each turn extends the previous text + output
    hist = {id(on): "System: be brief.\nUser: hi\nAssistant:", id(off): "System: be brief.\nUser: hi\nAssistant:"}
    for turn in range(3):
        outs = {}
        for eng in engines:
            out = eng.generate(hist[id(eng)], sp)
            outs[id(eng)] = out
            hist[id(eng)] += out["text"] + f"\nUser: turn {turn}\nAssistant:"
        assert outs[id(on)]["output_ids"] == outs[id(off)]["output_ids"]
        if turn > 0:
            assert outs[id(on)]["meta_info"]["cached_tokens"] > 0
    shared = "A long shared few-shot prefix. " * 20
    prompts = [shared + f"Question {i}?" for i in range(10)]
    a, b = on.generate(prompts, sp), off.generate(prompts, sp)
    assert [x["output_ids"] for x in a] == [x["output_ids"] for x in b]
    assert sum(x["meta_info"]["cached_tokens"] for x in a) > 5 * len(on.tokenizer.encode(shared)) // 2


def test_workload_larger_than_pool_evicts_and_does_not_leak(tiny_model_path):
    fp32 = {"quantization": "none"}  # outputs compared across batch shapes (see the engines fixture)
    eng = Engine(tiny_model_path, max_total_tokens=300, debug_invariants=True, chunked_prefill_size=64, **fp32)
    try:
        ref = Engine(tiny_model_path, max_total_tokens=8192, disable_radix_cache=True, **fp32)
        prompts = [f"Doc {i}: " + "alpha beta " * (10 + i % 7) for i in range(30)]
        sp = {"max_new_tokens": 20, "temperature": 0, "ignore_eos": True}
        expected = [o["output_ids"] for o in ref.generate(prompts, sp)]
        ref.shutdown()
        for _ in range(2):  # second round hits what survived eviction
            got = eng.generate(prompts, sp)
            assert [g["output_ids"] for g in got] == expected
        info = eng.get_server_info()
        assert info["kv_used"] == 0
        assert info["kv_free"] + info["kv_evictable"] == 300
    finally:
        eng.shutdown()


def test_flush_refused_while_running(engines):
    on, _ = engines
    gen = on.generate("keep running", {"max_new_tokens": 500, "ignore_eos": True}, stream=True, rid="busy")
    next(gen)
    assert on.flush_cache() is False
    on.abort("busy")
    list(gen)
    assert on.flush_cache() is True



def test_pool_pressure_preempts_the_newest_and_caches_only_computed_kv():
    """Short of slots, the newest running request yields; only its computed KV reaches the cache."""
    import torch

    from sglpy.runtime.config import EngineConfig
    from sglpy.runtime.sampling_params import SamplingParams
    from sglpy.runtime.memory.kv_manager import KVManager
    from sglpy.runtime.memory.kv_pool import KVPool, ReqToTokenPool
    from sglpy.runtime.memory.radix_cache import RadixCache
    from sglpy.runtime.core import Req, ReqStatus
    from sglpy.runtime.engine.scheduler import Scheduler

    pool = KVPool(1, 7, 1, 1, torch.float32, torch.device("cpu"))
    rows = ReqToTokenPool(4, 64, torch.device("cpu"))
    cache = RadixCache()
    kv = KVManager(pool, rows, cache)
    sched = Scheduler(EngineConfig(), kv, max_context=64)
    reqs = []
    for ids, out in (([1, 2, 3], [4]), ([5, 6, 7], [8])):  # KV holds the prompt; the sampled token is pending
        r = Req(rid=str(ids[0]), input_ids=ids, sampling=SamplingParams(max_new_tokens=10), output_ids=out)
        assert kv.assign_row(r) and kv.grow(r, 3)
        r.status = ReqStatus.RUNNING
        sched.running.append(r)
        reqs.append(r)
    older, newer = reqs
    batch = sched.schedule()  # one free slot: the older request takes it, the newer one is preempted
    assert [e.req for e in batch.entries] == [older]
    assert newer in sched.waiting and newer.kv_len == 0 and newer.num_preemptions == 1
    # only the three computed tokens of the preempted request are cached, never its pending token
    assert cache.peek_prefix_len([5, 6, 7, 8]) == 3
    sched.check_invariants()

"""Tensor parallelism on CPU (gloo): tp=2 greedy outputs equal tp=1, constraints and the radix cache under tp=2,
bad flags, two "nodes" on loopback, and a killed rank that fails the engine instead of hanging it."""

import json
import subprocess
import sys
import threading
import time

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.engine import Engine
from sglpy.runtime.model.tp_step import RowMirror, StepMessage
from sglpy.runtime.testing import make_tiny_model
from sglpy.runtime.testing.server_harness import free_port

PROMPTS = ["Hello there", "The capital of France is", "1 2 3 4 5", "def f(x):\n    return"]
GREEDY = {"max_new_tokens": 16, "temperature": 0}
# small pool, short chunks: prompts are prefilled in several chunks and decode and extend rows share steps
KW = dict(num_threads=1, max_total_tokens=4096, chunked_prefill_size=8, grammar_workers=0, debug_invariants=True,
          quantization="none")  # tp=N == tp=1 exactly needs fp32: int8 scales of row-parallel shards differ


def _ids(outs):
    return [o["output_ids"] for o in outs]


def _run(path, tp, prompts=PROMPTS, sp=GREEDY, **kw):
    with Engine(path, tp_size=tp, **{**KW, **kw}) as e:
        return e.generate(prompts, sp, return_logprob=True)


@pytest.fixture(scope="module")
def engines(tiny_model_path):
    """tp=1 and tp=2 engines on the tiny model (4 heads, 2 KV heads), alive together for the module."""
    one = Engine(tiny_model_path, tp_size=1, **KW)
    two = Engine(tiny_model_path, tp_size=2, **KW)
    yield one, two
    two.shutdown()
    one.shutdown()


def test_tp2_greedy_equals_tp1(engines):
    one, two = engines
    a = one.generate(PROMPTS, GREEDY, return_logprob=True)
    b = two.generate(PROMPTS, GREEDY, return_logprob=True)
    assert _ids(a) == _ids(b)
    for x, y in zip(a, b):  # the numbers too, up to the all_reduce's summation order
        lx = [t[0] for t in x["meta_info"]["output_token_logprobs"]]
        ly = [t[0] for t in y["meta_info"]["output_token_logprobs"]]
        assert lx == pytest.approx(ly, abs=1e-3)
    assert two.get_server_info()["tp_size"] == 2 and len(two.get_server_info()["tp_rank_pids"]) == 1


def test_tp2_concurrent_mixed_batches_equal_tp1(engines):
    one, two = engines
    prompts = [f"Request {i}: " + "word " * (3 * i) for i in range(10)]
    results = {}

    def run(name, eng):
        results[name] = _ids(eng.generate(prompts, {"max_new_tokens": 12, "temperature": 0}))

    threads = [threading.Thread(target=run, args=(n, e)) for n, e in (("one", one), ("two", two))]
    [t.start() for t in threads]
    [t.join(300) for t in threads]
    assert results["one"] == results["two"]


def test_tp2_json_schema(engines):
    one, two = engines
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8},
                                               "age": {"type": "integer"}}, "required": ["name", "age"]}
    sp = {"json_schema": json.dumps(schema), "temperature": 0, "max_new_tokens": 48}
    a, b = one.generate("A person:", sp), two.generate("A person:", sp)
    assert a["output_ids"] == b["output_ids"]
    assert set(json.loads(b["text"])) == {"name", "age"}


def test_tp2_radix_cache_shared_prefix(engines):
    one, two = engines
    prefix = "You are a helpful assistant. Answer briefly and precisely. " * 3
    for eng in (one, two):
        eng.flush_cache()
    outs = {}
    for name, eng in (("one", one), ("two", two)):
        first = eng.generate(prefix + "Q: sky?", GREEDY)
        second = eng.generate(prefix + "Q: grass?", GREEDY)
        assert second["meta_info"]["cached_tokens"] > 20  # the shared prefix came from the cache
        outs[name] = (first["output_ids"], second["output_ids"])
    assert outs["one"] == outs["two"]


@pytest.mark.parametrize("kind", ["kv_heads_lt_tp", "qwen2_untied"])
def test_tp2_other_splits_equal_tp1(tmp_path, kind):
    if kind == "kv_heads_lt_tp":  # one KV head, replicated on both ranks
        path = make_tiny_model(tmp_path / "m", heads=4, kv_heads=1, seed=1)
    else:  # q/k/v biases split, o_proj without bias, an untied lm_head split by vocabulary
        path = make_tiny_model(tmp_path / "m", arch="qwen2", heads=4, kv_heads=2, seed=2, tie_word_embeddings=False)
    a, b = _run(path, 1, PROMPTS[:2]), _run(path, 2, PROMPTS[:2])
    assert _ids(a) == _ids(b)


def test_tp2_quantized_runs(tiny_model_path):
    out = _run(tiny_model_path, 2, PROMPTS[:2], quantization="int4")
    assert all(len(o["output_ids"]) == GREEDY["max_new_tokens"] for o in out)


@pytest.mark.parametrize("kwargs, words", [
    ({"tp_size": 0}, ["tp_size", "0"]),
    ({"tp_size": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "127.0.0.1:1234"}, ["node_rank", "[0, 1]"]),
    ({"tp_size": 3, "nnodes": 2, "dist_init_addr": "127.0.0.1:1234"}, ["tp_size (3)", "nnodes (2)"]),
    ({"tp_size": 2, "nnodes": 2}, ["dist_init_addr"]),
    ({"tp_size": 2, "dist_init_addr": "nohost"}, ["host:port"]),
    ({"tp_size": 2, "dist_timeout": 0}, ["dist_timeout"]),
])
def test_bad_parallel_flags(kwargs, words):
    with pytest.raises(ValueError) as e:
        EngineConfig(**kwargs)
    for w in words:
        assert w in str(e.value)


def test_heads_not_divisible_is_a_clear_error_before_any_rank_starts(tiny_model_path):
    with pytest.raises(ValueError, match=r"num_attention_heads \(4\) is not divisible by tp_size \(3\)"):
        Engine(tiny_model_path, tp_size=3, **KW)


def test_tp_flag_alias():
    from sglpy.runtime.server.config import config_from_args

    cfg = config_from_args(["--tp", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", "10.0.0.1:5000"])
    assert (cfg.engine.tp_size, cfg.engine.nnodes, cfg.engine.node_rank) == (2, 2, 1)
    assert config_from_args(["--tp-size", "4"]).engine.tp_size == 4


def test_two_nodes_on_loopback(tiny_model_path, engines):
    one, _ = engines
    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--model", tiny_model_path, "--tp", "2",
                              "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr, "--num-threads", "1",
                              "--max-total-tokens", "4096", "--quantization", "none"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with Engine(tiny_model_path, tp_size=2, nnodes=2, node_rank=0, dist_init_addr=addr, **KW) as e:
            assert e.runner.rank_pids() == []  # rank 1 lives on the other "node"
            assert _ids(e.generate(PROMPTS, GREEDY)) == _ids(one.generate(PROMPTS, GREEDY))
        assert node1.wait(60) == 0  # rank 0 stopped the group: the node exits cleanly
    finally:
        if node1.poll() is None:
            node1.kill()
        node1.wait()


def test_mismatched_node_flags_fail_clearly(tiny_model_path):
    addr = f"127.0.0.1:{free_port()}"
    node1 = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--model", tiny_model_path, "--tp", "2",
                              "--nnodes", "2", "--node-rank", "1", "--dist-init-addr", addr, "--num-threads", "1",
                              "--max-total-tokens", "1024", "--engine-restart-attempts", "0"],
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        with pytest.raises(ValueError, match="max_total_tokens"):
            Engine(tiny_model_path, tp_size=2, nnodes=2, node_rank=0, dist_init_addr=addr, **KW)
        assert node1.wait(60) == 1
    finally:
        if node1.poll() is None:
            node1.kill()
        node1.wait()


def test_killed_rank_fails_the_engine_without_a_hang(tiny_model_path):
    e = Engine(tiny_model_path, tp_size=2, **{**KW, "dist_timeout": 30, "max_total_tokens": 16384})
    try:
        result = {}

        def load():
            result["outs"] = e.generate([f"load {i}" for i in range(8)], {"max_new_tokens": 1500, "temperature": 0,
                                                                          "ignore_eos": True})

        t = threading.Thread(target=load)
        t.start()
        deadline = time.monotonic() + 60
        while e.progress().steps < 20 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert e.is_alive() and t.is_alive()
        e.runner.ranks.procs[0][1].kill()  # rank 1 dies mid-load
        t.join(60)
        assert not t.is_alive(), "generate hung after a rank died"
        reasons = [o["meta_info"]["finish_reason"] for o in result["outs"]]
        assert all(r["type"] == "abort" and "tensor-parallel" in r["message"] for r in reasons), reasons
        assert not e.is_alive()
        with pytest.raises(RuntimeError, match="not running"):
            e.generate("after", {"max_new_tokens": 2})
    finally:
        e.shutdown()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.lists(st.integers(0, 50), max_size=12), st.integers(0, 12)),
                max_size=30))
def test_row_mirror_keeps_the_worker_table_equal(steps):
    """Whatever rank 0's rows hold from step to step, the mirror's table matches on every position read."""
    mirror, table = RowMirror(), torch.full((4, 16), -1, dtype=torch.int32)
    for row, slots, n in steps:
        n = min(n, len(slots))
        update = mirror.updates(row, slots, n)
        msg = StepMessage.forward([], [], [], [], [], [], 0, [], [update] if update else [])
        msg.apply_row_updates(table)
        assert table[row, :n].tolist() == slots[:n]


@pytest.mark.slow
def test_default_model_tp3_equals_tp1(default_model_path):
    """The default model has 9 heads and 3 KV heads: 3 is the smallest split it allows (2 is refused)."""
    prompts = ["The capital of France is", "Write a haiku about the sea."]
    sp = {"max_new_tokens": 24, "temperature": 0}
    a = _run(default_model_path, 1, prompts, sp, chunked_prefill_size=1024, debug_invariants=False)
    b = _run(default_model_path, 3, prompts, sp, chunked_prefill_size=1024, debug_invariants=False)
    assert _ids(a) == _ids(b)
    with pytest.raises(ValueError, match=r"num_attention_heads \(9\) is not divisible by tp_size \(2\)"):
        Engine(default_model_path, tp_size=2, num_threads=1)

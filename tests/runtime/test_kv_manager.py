"""The KV manager is the one owner of KV slots: unit behaviour, and no other module allocates or frees."""

import ast
import inspect
import pathlib

import pytest
import torch

from sglpy.runtime.sampling_params import SamplingParams
from sglpy.runtime.core import Req
from sglpy.runtime.memory.kv_manager import KVManager
from sglpy.runtime.memory.kv_pool import KVPool, ReqToTokenPool
from sglpy.runtime.memory.radix_cache import RadixCache

RUNTIME = pathlib.Path(__file__).resolve().parents[2] / "runtime"
POOL_MUTATORS = {"_alloc", "_free", "_reset", "_alloc_row", "_free_row", "_write"}
CACHE_MUTATORS = {"match_prefix", "insert", "cache_unfinished", "lock", "unlock", "evict", "reset"}


def _manager(slots=8, rows=2, disable_cache=False) -> KVManager:
    cpu = torch.device("cpu")
    return KVManager(KVPool(1, slots, 1, 1, torch.float32, cpu), ReqToTokenPool(rows, 32, cpu),
                     RadixCache(disable=disable_cache))


def _req(rid, ids, out=()) -> Req:
    return Req(rid=rid, input_ids=list(ids), sampling=SamplingParams(max_new_tokens=4), output_ids=list(out))


def _calls(tree: ast.AST, names: set[str]):
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names:
            yield node


def test_no_module_but_the_kv_manager_touches_the_pool_or_mutates_the_cache():
    offenders = []
    for path in RUNTIME.rglob("*.py"):
        rel = path.relative_to(RUNTIME).as_posix()
        if rel in ("memory/kv_manager.py", "memory/kv_pool.py", "memory/radix_cache.py"):
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for call in _calls(tree, POOL_MUTATORS):
            offenders.append(f"{rel}:{call.lineno} .{call.func.attr}()")
        for call in _calls(tree, CACHE_MUTATORS):
            receiver = ast.unparse(call.func.value)
            if receiver.endswith("cache"):
                offenders.append(f"{rel}:{call.lineno} {receiver}.{call.func.attr}()")
    assert offenders == [], offenders


def test_grow_evicts_cached_kv_and_release_returns_everything():
    kv = _manager(slots=8)
    a = _req("a", [1, 2, 3, 4, 5])
    assert kv.assign_row(a) and kv.grow(a, 5)
    kv.release(a)  # finished: its 5 slots now live in the cache, unlocked
    assert kv.stats().evictable == 5 and kv.stats().free == 3
    b = _req("b", [9, 9, 9, 9, 9, 9])
    kv.match_prefix(b, b.input_ids[:-1])
    assert kv.assign_row(b) and kv.grow(b, 6)  # needs 3 evicted slots
    s = kv.stats()
    assert s.free + s.evictable + s.protected + len(b.slots) == s.total
    kv.check_invariants([b])
    kv.release(b)
    kv.check_invariants([])
    assert kv.stats().used == 0


def test_grow_fails_without_taking_anything_when_short():
    kv = _manager(slots=4)
    a = _req("a", [1, 2, 3])
    assert kv.assign_row(a) and kv.grow(a, 3)
    before = kv.stats()
    assert not kv.grow(a, 2) and kv.stats() == before and len(a.slots) == 3


def test_rollback_frees_request_owned_slots_but_never_cache_owned_ones():
    kv = _manager(slots=8)
    a = _req("a", [1, 2, 3], out=[4, 5])
    assert kv.assign_row(a) and kv.grow(a, 5)
    kv.cache_unfinished(a)  # the tree now owns all 5 slots (locked for the request)
    assert a.locked_len == 5
    assert not kv.rollback(a, 3) and a.kv_len == 5
    assert kv.grow(a, 2)
    free = kv.stats().free
    assert kv.rollback(a, 6) and a.kv_len == 6 and kv.stats().free == free + 1
    kv.check_invariants([a])


def test_flush_empties_cache_and_pool():
    kv = _manager(slots=6)
    a = _req("a", [1, 2, 3])
    assert kv.assign_row(a) and kv.grow(a, 3)
    kv.release(a)
    kv.flush()
    assert kv.stats() == type(kv.stats())(6, 6, 0, 0)


@pytest.mark.timeout(300)
def test_engine_frees_and_allocates_only_through_the_kv_manager(tiny_model_path, monkeypatch):
    """Preemption, eviction, jump-forward rollback and release: every pool call comes from kv_manager.py."""
    from sglpy.runtime.engine import Engine

    callers = set()
    for name in ("_alloc", "_free", "_reset"):
        original = getattr(KVPool, name)

        def spy(self, *args, _original=original, **kwargs):
            callers.add(pathlib.Path(inspect.stack()[1].filename).name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(KVPool, name, spy)
    eng = Engine(tiny_model_path, max_total_tokens=256, max_running_requests=8, debug_invariants=True, seed=3)
    try:
        prompts = [f"Request {i}: " + "tell me more " * (6 + i) for i in range(6)]
        eng.generate(prompts, {"max_new_tokens": 24, "ignore_eos": True, "temperature": 0.8})
        schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                  "required": ["name", "age"]}
        eng.generate(["Person:"] * 3, {"json_schema": schema, "max_new_tokens": 32, "temperature": 0.7})
        assert eng.flush_cache()
        info = eng.get_server_info()
    finally:
        eng.shutdown()
    assert info["total_retractions"] > 0  # the small pool forced preemption
    assert callers == {"kv_manager.py"}, callers

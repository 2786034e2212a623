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
POOL_MUTATORS = {"_alloc", "_alloc_each", "_free", "_reset", "_alloc_row", "_free_row", "_write", "_write_each"}
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


def test_requests_growing_side_by_side_keep_one_contiguous_run_each():
    """CPU decode attention reads a contiguous run in place and gathers anything else: placement keeps runs whole."""
    m = _manager(slots=400, rows=4)
    reqs = [_req(f"r{i}", range(10 + i, 40 + i)) for i in range(3)]
    for r in reqs:
        assert m.assign_row(r) and m.grow(r, 30)  # prompts, admitted one after another
    for _ in range(40):  # then decode, one token each per step
        for r in reqs:
            assert m.grow(r, 1)
    for r in reqs:
        assert r.slots == list(range(r.slots[0], r.slots[0] + 70)), r.slots
    gpu_like = KVPool(1, 64, 1, 1, torch.float32, torch.device("cpu"), contiguous=False)
    assert gpu_like._alloc(3, fresh=True).slots == [0, 1, 2]  # no placement where layout does not matter


def test_pool_hands_out_every_slot_once_under_any_mix_of_runs_and_frees():
    from hypothesis import given, settings, strategies as st

    ops = st.lists(st.tuples(st.sampled_from(["fresh", "after", "any", "free"]), st.integers(1, 9),
                             st.integers(0, 10**6)), max_size=60)

    @settings(max_examples=150, deadline=None)
    @given(ops)
    def run(seq):
        pool = KVPool(1, 48, 1, 1, torch.float32, torch.device("cpu"))
        held: list[list[int]] = []
        for kind, n, pick in seq:
            if kind == "free":
                if held:
                    pool._free(held.pop(pick % len(held)))
                continue
            after = held[pick % len(held)][-1] if kind == "after" and held else None
            before = pool.available()
            res = pool._alloc(n, after=after, fresh=kind == "fresh")
            if not res.ok:
                assert n > before and res.slots == []
                continue
            assert len(res.slots) == n and pool.available() == before - n
            if after is not None and all(0 <= after + 1 + i < 48 for i in range(n)) and \
                    not any(after + 1 + i in s for s in held for i in range(n)):
                assert res.slots == list(range(after + 1, after + 1 + n))  # the run extends when it can
            held.append(res.slots)
            taken = [x for s in held for x in s]
            assert len(taken) == len(set(taken)) and all(0 <= x < 48 for x in taken)
            assert pool.available() == 48 - len(taken) == sum(pool._is_free)
            cached, pool._runs = pool._runs, None  # runs kept across placements == runs scanned afresh
            if cached is not None:
                assert [list(a) for a in cached] == [list(a) for a in pool._free_runs()]
                pool._runs = cached

    run()


def test_grow_each_takes_the_slots_grow_would_take_one_by_one():
    """A decode step's growth in one call: the same slots and req_to_token as grow(req, 1) per request."""
    import random

    rng = random.Random(0)
    one, each = _manager(slots=96, rows=6), _manager(slots=96, rows=6)
    reqs = {m: [_req(str(i), range(1, 2 + i)) for i in range(6)] for m in (one, each)}
    for m in (one, each):
        for r in reqs[m]:
            assert m.assign_row(r) and m.grow(r, len(r.input_ids))
        m.release(reqs[m][2])  # a gap in the pool, and a request whose run is cached (fresh placement)
        m.cache_unfinished(reqs[m][3])
    for step in range(10):
        live = [i for i in range(6) if i != 2]
        rng.shuffle(live)
        for i in live:
            assert one.grow(reqs[one][i], 1)
        assert each.grow_each([reqs[each][i] for i in live])
        for i in live:
            assert reqs[one][i].slots == reqs[each][i].slots, (step, i)
    assert torch.equal(one.buffers.req_to_token, each.buffers.req_to_token)
    assert one.stats() == each.stats()
    short = _manager(slots=8, rows=2)
    a, b = _req("a", [1, 2, 3]), _req("b", [4, 5, 6, 7])
    for r in (a, b):
        assert short.assign_row(r) and short.grow(r, len(r.input_ids))
    assert short.grow_each([a]) and not short.grow_each([a, b])  # one free slot left: nothing taken
    assert short.stats().free == 0 and (a.kv_len, b.kv_len) == (4, 4)


def test_indexed_writes_without_numpy_match_the_numpy_path():
    """The device path of ReqToTokenPool's writes (one staged copy of rows, positions and slots; CUDA's) gives the
    numpy path's table, checked here on a CPU tensor with the numpy view set aside."""
    from sglpy.runtime.memory.kv_pool import ReqToTokenPool

    a, b = ReqToTokenPool(4, 16, torch.device("cpu")), ReqToTokenPool(4, 16, torch.device("cpu"))
    b._np = None
    for pool in (a, b):
        pool._write(1, 0, [5, 6, 7])
        pool._write_each([0, 1, 3], [2, 3, 15], [40, 41, 42])
        pool._write_each([], [], [])
    assert torch.equal(a.req_to_token, b.req_to_token)
    assert b.req_to_token[1, :4].tolist() == [5, 6, 7, 41] and b.req_to_token[3, 15] == 42

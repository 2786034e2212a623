"""Radix cache: deterministic unit tests plus a hypothesis state machine against a dict model."""

import itertools

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from sglpy.runtime.memory.radix_cache import RadixCache, TreeNode


def path_of(node: TreeNode) -> list[int]:
    """Full token path from the root down to ``node``."""
    parts = []
    while node is not None:
        parts.append(node.key)
        node = node.parent
    return [t for key in reversed(parts) for t in key]


class Freed(list):
    """A ``free_fn`` that records every freed slot."""

    def __call__(self, slots):
        self.extend(slots)


# ---------------------------------------------------------------------------- unit tests
def test_partial_match_splits_node_and_keeps_slots():
    c = RadixCache()
    c.insert([1, 2, 3, 4], [10, 11, 12, 13])
    m = c.match_prefix([1, 2, 9])
    assert m.slots == [10, 11]
    assert m.node.key == [1, 2] and path_of(m.node) == [1, 2]
    (ns,) = c.root.children.values()
    (top,) = ns.children.values()
    assert top is m.node and list(top.children.values())[0].key == [3, 4]
    assert c.match_prefix([1, 2, 3, 4, 5]).slots == [10, 11, 12, 13]
    c.check_invariants()


def test_match_ending_inside_an_edge_splits_there():
    c = RadixCache()
    c.insert([5, 6, 7], [0, 1, 2])
    m = c.match_prefix([5, 6])
    assert m.slots == [0, 1] and m.node.key == [5, 6]
    assert c.total_size() == 3
    c.check_invariants()


def test_insert_reports_duplicates_but_not_slots_from_match():
    c = RadixCache()
    assert c.insert([1, 2, 3], [10, 11, 12]).already_cached_len == 0
    r = c.insert([1, 2, 3, 4], [20, 21, 22, 23])
    assert r.already_cached_len == 3 and r.duplicate_slots == [20, 21, 22]
    assert path_of(r.node) == [1, 2, 3, 4]
    # The engine's flow: reuse the matched slots, allocate only the rest.
    m = c.match_prefix([1, 2])
    r = c.insert([1, 2, 3, 5], m.slots + [30, 31])
    assert r.already_cached_len == 3 and r.duplicate_slots == [30]
    assert c.match_prefix([1, 2, 3, 5]).slots == [10, 11, 12, 31]
    assert c.total_size() == 5
    c.check_invariants()


def test_extra_key_namespaces_never_share():
    c = RadixCache()
    c.insert([1, 2, 3], [0, 1, 2])
    r = c.insert([1, 2, 3], [5, 6, 7], extra_key="salt")
    assert r.already_cached_len == 0 and r.duplicate_slots == []
    assert c.match_prefix([1, 2, 3]).slots == [0, 1, 2]
    assert c.match_prefix([1, 2, 3], extra_key="salt").slots == [5, 6, 7]
    assert c.match_prefix([1, 2, 3], extra_key="other").slots == []
    assert c.peek_prefix_len([1, 2], extra_key=("lora", 1)) == 0
    with pytest.raises(ValueError, match="hashable"):
        c.match_prefix([1], extra_key=["unhashable"])
    c.check_invariants()


def test_lru_evicts_least_recently_used_leaf_first():
    c = RadixCache()
    c.insert([1, 1, 1], [0, 1, 2])
    c.insert([2, 2], [3, 4])
    c.insert([3], [5])
    c.match_prefix([1, 1, 1])  # touch A: B is now the oldest
    freed = Freed()
    assert c.evict(1, freed).num_evicted == 2
    assert freed == [3, 4]
    assert c.evict(1, freed).num_evicted == 1
    assert freed == [3, 4, 5]
    c.check_invariants()


def test_parent_that_becomes_a_leaf_is_evicted_too():
    c = RadixCache()
    c.insert([1, 2, 3], [0, 1, 2])
    c.insert([1, 2, 4], [0, 1, 3])
    c.insert([9], [9])
    c.match_prefix([9])
    freed = Freed()
    assert c.evict(4, freed).num_evicted == 4
    assert sorted(freed[:2]) == [2, 3] and sorted(freed[2:]) == [0, 1]
    assert c.total_size() == 1 and c.match_prefix([9]).slots == [9]
    c.check_invariants()


def test_locked_path_survives_eviction_and_split():
    c = RadixCache()
    leaf = c.insert([1, 2, 3, 4], [0, 1, 2, 3]).node
    c.insert([7, 8], [7, 8])
    c.lock(leaf)
    assert (c.protected_size, c.evictable_size) == (4, 2)
    mid = c.match_prefix([1, 2]).node  # splits the locked node
    assert mid.lock_ref == 1 and (c.protected_size, c.evictable_size) == (4, 2)
    freed = Freed()
    assert c.evict(100, freed).num_evicted == 2 and freed == [7, 8]
    assert c.match_prefix([1, 2, 3, 4]).slots == [0, 1, 2, 3]
    c.unlock(leaf)
    assert (c.protected_size, c.evictable_size) == (0, 4)
    assert c.evict(100, freed).num_evicted == 4
    assert sorted(freed) == [0, 1, 2, 3, 7, 8]
    assert c.root.children == {}  # the emptied namespace is dropped
    c.check_invariants()
    with pytest.raises(ValueError, match="evicted"):
        c.lock(leaf)


def test_unlocked_child_of_locked_node_is_evictable():
    c = RadixCache()
    top = c.insert([1, 2], [0, 1]).node
    c.insert([1, 2, 3], [0, 1, 2])
    c.lock(top)
    freed = Freed()
    assert c.evict(10, freed).num_evicted == 1 and freed == [2]
    c.check_invariants()


def test_cache_unfinished_publishes_kv_and_moves_the_lock():
    c = RadixCache()
    c.insert([1, 2, 3], [10, 11, 12])
    m = c.match_prefix([1, 2])
    c.lock(m.node)
    # The request computed tokens 3 and 4 itself; another request had cached token 3 meanwhile.
    r = c.cache_unfinished([1, 2, 3, 4], m.slots + [20, 21], m.node)
    assert r.slots == [10, 11, 12, 21] and r.duplicate_slots == [20]
    assert path_of(r.node) == [1, 2, 3, 4] and r.node.lock_ref == 1
    assert (c.protected_size, c.evictable_size) == (4, 0)
    c.unlock(r.node)
    assert (c.protected_size, c.evictable_size) == (0, 4)
    c.check_invariants()
    off = RadixCache(disable=True)
    r = off.cache_unfinished([1, 2], [5, 6], off.root)
    assert r.slots == [5, 6] and r.duplicate_slots == [] and r.node is off.root


def test_bad_calls_raise_clear_errors():
    c = RadixCache()
    node = c.insert([1], [0]).node
    with pytest.raises(ValueError, match="not locked"):
        c.unlock(node)
    with pytest.raises(ValueError, match="2 tokens but 1 slots"):
        c.insert([1, 2], [0])
    with pytest.raises(ValueError, match="num_tokens"):
        c.evict(-1, Freed())


def test_disabled_cache_stores_nothing():
    c = RadixCache(disable=True)
    r = c.insert([1, 2, 3], [4, 5, 6])
    assert r.already_cached_len == 0 and r.duplicate_slots == [4, 5, 6]
    m = c.match_prefix([1, 2, 3])
    assert m.slots == [] and m.node is c.root
    c.lock(m.node)
    c.unlock(m.node)
    assert c.evict(10, Freed()).num_evicted == 0
    assert c.total_size() == c.evictable_size == c.protected_size == 0


def test_reset_drops_everything_and_detaches_nodes():
    c = RadixCache()
    node = c.insert([1, 2], [0, 1]).node
    c.lock(node)
    c.reset()
    assert c.total_size() == c.evictable_size == c.protected_size == 0
    assert c.match_prefix([1, 2]).slots == []
    with pytest.raises(ValueError, match="reset"):
        c.unlock(node)
    c.check_invariants()


def test_peek_is_read_only():
    c = RadixCache()
    c.insert([1, 2, 3, 4], [0, 1, 2, 3])
    before = c.format_tree()
    p = c.peek_prefix([1, 2, 9])
    assert p.length == 2 and p.node.key == [1, 2, 3, 4]
    assert c.format_tree() == before


# ---------------------------------------------------------------------------- property test
TOKENS = st.lists(st.integers(0, 2), max_size=7)
EXTRA = st.sampled_from([None, "salt"])


class RadixModelMachine(RuleBasedStateMachine):
    """Random operations on a RadixCache, checked against a dict of (extra_key, prefix) -> slot."""

    def __init__(self):
        super().__init__()
        self.cache = RadixCache()
        self.model: dict[tuple, int] = {}
        self.locks: list[tuple[TreeNode, object, tuple]] = []
        self.next_slot = itertools.count()
        self.allocated: set[int] = set()
        self.freed: list[int] = []  # freed by the caller (duplicates) or by free_fn (evicted)
        self.dropped: set[int] = set()  # released by reset()

    def _alloc(self, n):
        slots = [next(self.next_slot) for _ in range(n)]
        self.allocated.update(slots)
        return slots

    def _model_match(self, tokens, extra):
        slots = []
        while len(slots) < len(tokens) and (extra, tuple(tokens[: len(slots) + 1])) in self.model:
            slots.append(self.model[(extra, tuple(tokens[: len(slots) + 1]))])
        return slots

    def _model_insert(self, tokens, slots, extra):
        duplicates = []
        for i, slot in enumerate(slots):
            key = (extra, tuple(tokens[: i + 1]))
            if key in self.model:
                if self.model[key] != slot:
                    duplicates.append(slot)
            else:
                self.model[key] = slot
        return duplicates

    @rule(tokens=TOKENS, extra=EXTRA)
    def match(self, tokens, extra):
        expected = self._model_match(tokens, extra)
        before = self.cache.format_tree()
        assert self.cache.peek_prefix_len(tokens, extra) == len(expected)
        assert self.cache.format_tree() == before
        m = self.cache.match_prefix(tokens, extra)
        assert m.slots == expected
        assert path_of(m.node) == tokens[: len(expected)]

    @rule(tokens=TOKENS, extra=EXTRA)
    def insert_fresh(self, tokens, extra):
        slots = self._alloc(len(tokens))
        expected_dups = self._model_insert(tokens, slots, extra)
        r = self.cache.insert(tokens, slots, extra)
        assert r.duplicate_slots == expected_dups
        assert r.duplicate_slots == slots[: r.already_cached_len]
        if tokens:
            assert path_of(r.node) == tokens
        self.freed.extend(r.duplicate_slots)

    @rule(tokens=TOKENS, extra=EXTRA, cut=st.integers(0, 7))
    def insert_after_match(self, tokens, extra, cut):
        m = self.cache.match_prefix(tokens[:cut], extra)
        fresh = self._alloc(len(tokens) - len(m.slots))
        slots = m.slots + fresh
        expected_dups = self._model_insert(tokens, slots, extra)
        r = self.cache.insert(tokens, slots, extra)
        assert r.duplicate_slots == expected_dups
        assert r.duplicate_slots == slots[len(m.slots) : r.already_cached_len]
        self.freed.extend(r.duplicate_slots)

    @rule(tokens=TOKENS, extra=EXTRA, cut=st.integers(0, 7))
    def cache_unfinished(self, tokens, extra, cut):
        # A request locks its matched prefix, computes the rest, then publishes it mid-flight.
        m = self.cache.match_prefix(tokens[:cut], extra)
        self.cache.lock(m.node)
        slots = m.slots + self._alloc(len(tokens) - len(m.slots))
        expected_dups = self._model_insert(tokens, slots, extra)
        r = self.cache.cache_unfinished(tokens, slots, m.node, extra)
        assert r.duplicate_slots == expected_dups
        assert r.slots == self._model_match(tokens, extra)
        assert path_of(r.node) == tokens
        self.freed.extend(r.duplicate_slots)
        self.locks.append((r.node, extra, tuple(tokens)))

    @rule(tokens=TOKENS, extra=EXTRA)
    def lock(self, tokens, extra):
        m = self.cache.match_prefix(tokens, extra)
        self.cache.lock(m.node)
        self.locks.append((m.node, extra, tuple(tokens[: len(m.slots)])))

    @rule(index=st.integers(0, 50))
    def unlock(self, index):
        if self.locks:
            node, _, _ = self.locks.pop(index % len(self.locks))
            self.cache.unlock(node)

    @rule(num_tokens=st.integers(0, 12))
    def evict(self, num_tokens):
        evictable = self.cache.evictable_size
        protected = self._protected_keys()
        freed = Freed()
        result = self.cache.evict(num_tokens, freed)
        assert result.num_evicted == len(freed)
        # Unlocked subtrees hold no locked nodes, so everything evictable can go.
        assert result.num_evicted >= min(num_tokens, evictable)
        if evictable < num_tokens:
            assert result.num_evicted == evictable
        owner = {slot: key for key, slot in self.model.items()}
        for slot in freed:
            assert slot in owner, f"evicted slot {slot} was not owned by the tree"
            assert owner[slot] not in protected, "a locked token was evicted"
            del self.model[owner[slot]]
        for extra, prefix in self.model:  # what is left is still prefix-closed
            assert len(prefix) == 1 or (extra, prefix[:-1]) in self.model
        self.freed.extend(freed)

    @rule()
    def reset(self):
        self.dropped.update(self.model.values())
        self.model.clear()
        self.locks.clear()
        self.cache.reset()

    def _protected_keys(self):
        return {(e, p[: i + 1]) for _, e, p in self.locks for i in range(len(p))}

    @invariant()
    def sizes_and_ownership_add_up(self):
        self.cache.check_invariants()
        assert self.cache.total_size() == len(self.model)
        assert self.cache.protected_size == len(self._protected_keys())
        assert self.cache.evictable_size + self.cache.protected_size == self.cache.total_size()
        owned = set(self.model.values())
        assert len(owned) == len(self.model), "a slot is stored under two keys"
        assert len(set(self.freed)) == len(self.freed), "a slot was freed twice"
        assert not owned & set(self.freed), "a freed slot is still in the tree"
        assert owned | set(self.freed) | self.dropped == self.allocated, "a slot leaked"


RadixModelMachine.TestCase.settings = settings(
    max_examples=300,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_radix_cache_matches_model = RadixModelMachine.TestCase

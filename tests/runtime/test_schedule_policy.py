"""Waiting-queue policies: fcfs / lpm / dfs-weight orderings and in-batch sharing deferral."""

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.runtime.memory.radix_cache import RadixCache, TreeNode
from sglpy.runtime.engine.schedule_policy import (
    LPM_MAX_WAITING,
    SchedulePolicy,
    order_waiting,
    split_in_batch_sharing,
)


@dataclass
class Waiting:
    input_ids: list
    arrival: int
    extra_key: object = None


def cache_with(*seqs, extra_key=None):
    c = RadixCache()
    slot = 0
    for seq in seqs:
        c.insert(seq, list(range(slot, slot + len(seq))), extra_key)
        slot += len(seq)
    return c


A, B = [1] * 4, [5] * 4


def hand_built():
    """Cache: A -> {A+[2,2], A+[3,3]}, B.  Six waiting requests in arrival order."""
    cache = cache_with(A + [2, 2], A + [3, 3], B)
    waiting = [
        Waiting(B + [9], 0),  # ends at B
        Waiting(A + [2, 2, 7], 1),  # ends at A+[2,2]
        Waiting(A + [3, 3, 8], 2),  # ends at A+[3,3]
        Waiting(A + [2, 2, 6], 3),  # ends at A+[2,2]
        Waiting([8, 8], 4),  # no match
        Waiting(A + [4], 5),  # ends at A
    ]
    return cache, waiting


def arrivals(items):
    return [w.arrival for w in items]


def test_parse_policy_names():
    assert SchedulePolicy.parse("lpm") is SchedulePolicy.LPM
    assert SchedulePolicy.parse("dfs-weight") is SchedulePolicy.DFS_WEIGHT
    assert SchedulePolicy.parse(SchedulePolicy.FCFS) is SchedulePolicy.FCFS
    with pytest.raises(ValueError, match="lpm, dfs-weight, fcfs"):
        SchedulePolicy.parse("random")


def test_fcfs_is_arrival_order():
    cache, waiting = hand_built()
    assert arrivals(order_waiting("fcfs", waiting[::-1], cache)) == [0, 1, 2, 3, 4, 5]


def test_lpm_sorts_by_matched_length_then_arrival():
    cache, waiting = hand_built()
    assert arrivals(order_waiting("lpm", waiting[::-1], cache)) == [1, 2, 3, 0, 5, 4]


def test_dfs_weight_hand_built_example():
    # A's subtree holds four requests, so it goes first; inside it A+[2,2] (two requests, in
    # token order 6 before 7) precedes A+[3,3]; A's own request follows its children; then B;
    # the unmatched request is last.
    cache, waiting = hand_built()
    assert arrivals(order_waiting("dfs-weight", waiting, cache)) == [3, 1, 2, 5, 0, 4]


def test_ordering_does_not_modify_the_cache():
    cache, waiting = hand_built()
    waiting.append(Waiting(A + [2], 6))  # ends inside an edge: a real match would split it
    before = cache.format_tree()
    for policy in SchedulePolicy:
        order_waiting(policy, waiting, cache)
    split_in_batch_sharing(waiting, cache)
    assert cache.format_tree() == before


def test_cache_aware_policies_degrade_to_fcfs():
    cache, waiting = hand_built()
    disabled = RadixCache(disable=True)
    for policy in ("lpm", "dfs-weight"):
        assert arrivals(order_waiting(policy, waiting[::-1], disabled)) == [0, 1, 2, 3, 4, 5]
        assert arrivals(order_waiting(policy, waiting[::-1], None)) == [0, 1, 2, 3, 4, 5]
    many = [Waiting(A + [i % 3], LPM_MAX_WAITING + 1 - i) for i in range(LPM_MAX_WAITING + 1)]
    assert arrivals(order_waiting("lpm", many, cache)) == sorted(w.arrival for w in many)


def test_extra_key_requests_do_not_count_as_matches():
    cache, _ = hand_built()
    salted = Waiting(A + [2, 2], 0, extra_key="salt")
    plain = Waiting([1], 1)
    assert arrivals(order_waiting("lpm", [salted, plain], cache)) == [1, 0]


def test_in_batch_sharing_defers_all_but_one_of_a_group():
    prefix = list(range(100, 140))
    cache = cache_with(list(range(500, 540)))
    waiting = [
        Waiting(prefix + [1], 0),
        Waiting(prefix + [2], 1),
        Waiting(prefix[:20] + [3], 2),  # shares only 20 tokens: admitted
        Waiting(prefix + [4], 3, extra_key="salt"),  # other namespace: admitted
        Waiting(list(range(500, 540)) + [5], 4),  # prefix already cached: not checked
        Waiting(list(range(500, 540)) + [6], 5),
    ]
    split = split_in_batch_sharing(waiting, cache)
    assert arrivals(split.first) == [0, 2, 3, 4, 5]
    assert arrivals(split.deferred) == [1]
    assert split_in_batch_sharing(waiting, RadixCache(disable=True)).deferred == []
    with pytest.raises(ValueError):
        split_in_batch_sharing(waiting, cache, share_threshold=0)


def _subtree_nodes(node):
    out = [node]
    for child in node.children.values():
        out.extend(_subtree_nodes(child))
    return out


SEQS = st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=6), max_size=6)


@settings(max_examples=150, deadline=None)
@given(cached=SEQS, prompts=SEQS)
def test_orders_are_permutations_and_dfs_groups_subtrees(cached, prompts):
    cache = cache_with(*cached)
    waiting = [Waiting(p, i) for i, p in enumerate(prompts)]
    for policy in SchedulePolicy:
        out = order_waiting(policy, waiting, cache)
        assert sorted(arrivals(out)) == list(range(len(waiting)))
    lengths = [cache.peek_prefix_len(w.input_ids) for w in order_waiting("lpm", waiting, cache)]
    assert lengths == sorted(lengths, reverse=True)
    # DFS order: the requests inside any subtree of the cache form one contiguous run.
    out = order_waiting("dfs-weight", waiting, cache)
    where = [cache.peek_prefix(w.input_ids).node for w in out]
    for node in _subtree_nodes(cache.root):
        inside = {id(n) for n in _subtree_nodes(node)}
        positions = [i for i, n in enumerate(where) if id(n) in inside]
        if positions:
            assert positions == list(range(positions[0], positions[-1] + 1)), node


def test_tree_node_is_usable_as_dict_key():
    a, b = TreeNode(), TreeNode()
    assert len({a: 1, b: 2}) == 2

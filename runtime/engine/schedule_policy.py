"""Waiting-queue ordering policies: fcfs, lpm (longest prefix match) and dfs-weight.

A waiting item is anything with ``.input_ids: list[int]``, ``.extra_key`` (hashable or None) and
``.arrival: int`` (a monotonically increasing counter). Ordering never modifies the cache: it uses
``RadixCache.peek_prefix``, which neither splits nodes nor touches LRU times.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

from ..memory.radix_cache import RadixCache, TreeNode

# SGLang's numbers: above this many waiting requests lpm costs more than it saves.
LPM_MAX_WAITING = 128
# In-batch sharing: only requests with at most this many cached tokens are checked, and one is
# deferred when it shares at least this many tokens with a request ahead of it in the queue.
IN_BATCH_CHECK_THRESHOLD = 32
IN_BATCH_SHARE_THRESHOLD = 32


class SchedulePolicy(str, enum.Enum):
    """Names accepted by ``--schedule-policy``."""

    LPM = "lpm"
    DFS_WEIGHT = "dfs-weight"
    FCFS = "fcfs"

    @classmethod
    def parse(cls, name: str | SchedulePolicy) -> SchedulePolicy:
        """The policy called ``name``; ``ValueError`` listing the valid names otherwise."""
        if isinstance(name, SchedulePolicy):
            return name
        try:
            return cls(name)
        except ValueError:
            valid = ", ".join(p.value for p in cls)
            raise ValueError(f"unknown schedule policy {name!r}; choose one of: {valid}") from None


@dataclass(frozen=True)
class InBatchSplit:
    """Waiting items to admit now (``first``) and those to hold back one round (``deferred``)."""

    first: list[Any]
    deferred: list[Any]


def order_waiting(
    policy: str | SchedulePolicy, waiting: Sequence[Any], cache: RadixCache | None
) -> list[Any]:
    """Return ``waiting`` in the order the policy wants them admitted (a new list)."""
    policy = SchedulePolicy.parse(policy)
    items = list(waiting)
    cache_off = cache is None or cache.disable
    if policy is SchedulePolicy.FCFS or cache_off or len(items) <= 1:
        return _fcfs(items)
    if policy is SchedulePolicy.LPM:
        if len(items) > LPM_MAX_WAITING:
            return _fcfs(items)
        return _lpm(items, cache)
    return _dfs_weight(items, cache)


def split_in_batch_sharing(
    ordered: Sequence[Any],
    cache: RadixCache | None,
    check_threshold: int = IN_BATCH_CHECK_THRESHOLD,
    share_threshold: int = IN_BATCH_SHARE_THRESHOLD,
) -> InBatchSplit:
    """Hold back requests whose uncached prefix an earlier waiting request will compute first.

    Of a group of waiting requests sharing >= ``share_threshold`` tokens that are not cached,
    only the first is admitted; the rest find the prefix in the cache a round later (once the
    engine has inserted the first one's prompt) instead of all prefilling it at once.
    """
    if check_threshold < 0 or share_threshold < 1:
        raise ValueError("check_threshold must be >= 0 and share_threshold >= 1")
    items = list(ordered)
    if cache is None or cache.disable:
        return InBatchSplit(items, [])
    # A scratch tree of the prompts admitted so far; the slot values are placeholders.
    seen = RadixCache()
    first: list[Any] = []
    deferred: list[Any] = []
    for item in items:
        ids = item.input_ids
        if cache.peek_prefix_len(ids, item.extra_key) <= check_threshold:
            if seen.peek_prefix_len(ids, item.extra_key) >= share_threshold:
                deferred.append(item)
                continue
            seen.insert(ids, range(len(ids)), item.extra_key)
        first.append(item)
    return InBatchSplit(first, deferred)


def _fcfs(items: list[Any]) -> list[Any]:
    return sorted(items, key=lambda r: r.arrival)


def _lpm(items: list[Any], cache: RadixCache) -> list[Any]:
    """Longest cached prefix first; ties by arrival."""
    lengths = [cache.peek_prefix_len(r.input_ids, r.extra_key) for r in items]
    order = sorted(range(len(items)), key=lambda i: (-lengths[i], items[i].arrival))
    return [items[i] for i in order]


def _dfs_weight(items: list[Any], cache: RadixCache) -> list[Any]:
    """The SGLang paper's DFS order over the radix tree, heaviest subtree first.

    Each request sits at the deepest node its prompt reaches (a partially matched edge counts:
    the request shares tokens with that subtree). A node's weight is the number of requests in
    its subtree. Children are visited by descending weight (ties: earliest arrival), and a node's
    own requests come after its children's, so requests with longer cached prefixes go first.
    Requests at the same node are sorted by their token ids, which is the DFS order of the
    uncached remainder of their prompts (shared continuations end up adjacent).
    """
    bucket: dict[TreeNode, list[Any]] = {}
    weight: dict[TreeNode, int] = {}
    first_arrival: dict[TreeNode, int] = {}
    kids: dict[TreeNode, list[TreeNode]] = {}
    for item in items:
        node: TreeNode | None = cache.peek_prefix(item.input_ids, item.extra_key).node
        bucket.setdefault(node, []).append(item)
        child, child_is_new = None, False
        while node is not None:
            node_is_new = node not in weight
            if node_is_new:
                weight[node], first_arrival[node], kids[node] = 0, item.arrival, []
            if child_is_new:
                kids[node].append(child)
            weight[node] += 1
            first_arrival[node] = min(first_arrival[node], item.arrival)
            child, child_is_new, node = node, node_is_new, node.parent

    out: list[Any] = []
    stack: list[tuple[TreeNode, bool]] = [(cache.root, False)]
    while stack:
        node, expanded = stack.pop()
        if expanded:
            out.extend(sorted(bucket.get(node, []), key=lambda r: (list(r.input_ids), r.arrival)))
            continue
        stack.append((node, True))
        ordered_kids = sorted(kids.get(node, []), key=lambda c: (-weight[c], first_arrival[c]))
        stack.extend((c, False) for c in reversed(ordered_kids))
    return out

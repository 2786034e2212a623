"""Radix-tree prefix cache (RadixAttention): token ids -> KV slot indices, LRU eviction.

Pure Python (no torch): keys and slot indices are plain ``list[int]``; the engine converts the
slots it gets back into tensors.

Layout: ``root`` -> one namespace node per ``extra_key`` (key and value empty) -> token nodes.
Requests with different ``extra_key`` therefore never share a node. A token node's ``key`` holds
the token ids of its edge and ``value`` the KV slot of each of those tokens (same length).

Ownership: every slot stored in the tree is owned by the tree until ``evict`` hands it back through
``free_fn`` (exactly once). ``reset`` drops the tree *without* calling ``free_fn``: the engine
flushes its KV allocator at the same time.

Locks: ``lock(node)`` adds one reference to ``node`` and every ancestor; a node with
``lock_ref > 0`` is protected and never evicted. ``evictable_size + protected_size ==
total_size()`` always holds (counted in tokens).
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable, Hashable, Iterator, Sequence


@dataclass(eq=False)
class TreeNode:
    """One edge of the radix tree: ``key`` token ids and the KV ``value`` slot of each."""

    key: list[int] = field(default_factory=list)
    value: list[int] = field(default_factory=list)
    parent: TreeNode | None = None
    children: dict[int, TreeNode] = field(default_factory=dict)
    lock_ref: int = 0
    last_access_time: int = 0
    # Namespace nodes (one per extra_key) and the root hold no tokens and are never evicted.
    is_namespace: bool = False
    extra_key: Hashable = None
    detached: bool = False

    def __repr__(self) -> str:
        head = self.key[:4]
        more = "..." if len(self.key) > 4 else ""
        return f"TreeNode(len={len(self.key)}, key={head}{more}, lock_ref={self.lock_ref})"


@dataclass(frozen=True)
class MatchResult:
    """Slots of the longest cached prefix of the query and the node where that prefix ends."""

    slots: list[int]
    node: TreeNode


@dataclass(frozen=True)
class PeekResult:
    """Read-only match: matched length and the deepest node the match touched (maybe partially)."""

    length: int
    node: TreeNode


@dataclass(frozen=True)
class InsertResult:
    """Outcome of ``insert``; the caller must free exactly ``duplicate_slots``.

    ``already_cached_len``: how many leading tokens were in the tree before this insert.
    ``duplicate_slots``: the caller's slots the tree did not take, i.e. those of
    ``slots[:already_cached_len]`` that differ from the tree's own slot at the same position
    (slots obtained from ``match_prefix`` are the tree's and are not listed). When the cache is
    disabled the tree takes nothing and ``duplicate_slots`` is every slot.
    ``node``: the node where the inserted sequence ends (lock it to protect the whole path).
    """

    already_cached_len: int
    duplicate_slots: list[int]
    node: TreeNode


@dataclass(frozen=True)
class RecacheResult:
    """Outcome of ``cache_unfinished``: the request's new slot list, what to free, its new lock."""

    slots: list[int]
    duplicate_slots: list[int]
    node: TreeNode


@dataclass(frozen=True)
class EvictResult:
    """Number of tokens whose slots were handed to ``free_fn``."""

    num_evicted: int


def _common_len(key: list[int], tokens: list[int], start: int) -> int:
    """Length of the common prefix of ``key`` and ``tokens[start:]``."""
    n = min(len(key), len(tokens) - start)
    if tokens[start : start + n] == key[:n]:
        return n
    i = 0
    while i < n and key[i] == tokens[start + i]:
        i += 1
    return i


class RadixCache:
    """Radix tree over token ids whose nodes own the KV slots of their tokens."""

    def __init__(self, disable: bool = False) -> None:
        self.disable = bool(disable)
        self._clock = itertools.count(1)
        self.reset()

    # ------------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Drop every cached entry without calling ``free_fn`` (the allocator is flushed too)."""
        if getattr(self, "root", None) is not None:
            for node in self._iter_nodes():
                node.detached = True
        self.root = TreeNode(is_namespace=True)
        self.root.lock_ref = 1  # the root is permanently protected; it holds no tokens
        self.evictable_size = 0
        self.protected_size = 0

    def total_size(self) -> int:
        """Number of cached tokens (computed by walking the tree)."""
        return sum(len(n.value) for n in self._iter_nodes())

    # ------------------------------------------------------------------ match / insert
    def match_prefix(self, tokens: Sequence[int], extra_key: Hashable = None) -> MatchResult:
        """Longest cached prefix of ``tokens``; splits a node on a partial edge match; touches LRU.

        The engine should match ``tokens[:-1]`` when the last prompt token's logits are needed.
        """
        if self.disable:
            return MatchResult([], self.root)
        tokens = list(tokens)
        node = self._namespace(extra_key, create=False)
        if node is None:
            return MatchResult([], self.root)
        path, _ = self._walk(node, tokens, next(self._clock))
        slots: list[int] = []
        for child in path:
            slots.extend(child.value)
        return MatchResult(slots, path[-1] if path else node)

    def _walk(self, node: TreeNode, tokens: list[int], now: int) -> tuple[list[TreeNode], int]:
        """Follow ``tokens`` down from ``node``, splitting a partially matched edge and touching LRU.

        Returns the fully matched nodes below ``node`` (in order) and the number of tokens they cover.
        """
        node.last_access_time = now
        path: list[TreeNode] = []
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_len(child.key, tokens, pos)
            if n < len(child.key):
                child = self._split(child, n)
            child.last_access_time = now
            path.append(child)
            pos += n
            node = child
        return path, pos

    def peek_prefix(self, tokens: Sequence[int], extra_key: Hashable = None) -> PeekResult:
        """Read-only match (no split, no LRU update), for scheduling decisions."""
        if self.disable:
            return PeekResult(0, self.root)
        tokens = list(tokens)
        node = self._namespace(extra_key, create=False)
        if node is None:
            return PeekResult(0, self.root)
        pos = 0
        while pos < len(tokens):
            child = node.children.get(tokens[pos])
            if child is None:
                break
            n = _common_len(child.key, tokens, pos)
            pos += n
            node = child
            if n < len(child.key):
                break
        return PeekResult(pos, node)

    def peek_prefix_len(self, tokens: Sequence[int], extra_key: Hashable = None) -> int:
        """Length of the longest cached prefix of ``tokens``, without modifying the tree."""
        return self.peek_prefix(tokens, extra_key).length

    def insert(
        self, tokens: Sequence[int], slots: Sequence[int], extra_key: Hashable = None
    ) -> InsertResult:
        """Cache ``tokens`` -> ``slots``; the tree takes ownership of every slot it stores.

        The caller must free ``result.duplicate_slots`` (its own slots for the already-cached
        prefix that are not the tree's); all other slots in ``slots`` now belong to the tree.
        """
        tokens = list(tokens)
        slots = list(slots)
        if len(tokens) != len(slots):
            raise ValueError(f"insert: {len(tokens)} tokens but {len(slots)} slots")
        if self.disable:
            return InsertResult(0, slots, self.root)
        if not tokens:
            ns = self._namespace(extra_key, create=False)
            return InsertResult(0, [], ns if ns is not None else self.root)
        ns = self._namespace(extra_key, create=True)
        now = next(self._clock)
        path, already = self._walk(ns, tokens, now)
        cached = [slot for child in path for slot in child.value]
        duplicates = [mine for mine, theirs in zip(slots, cached) if mine != theirs]
        node = path[-1] if path else ns
        pos = already
        if pos < len(tokens):
            leaf = TreeNode(key=tokens[pos:], value=slots[pos:], parent=node, last_access_time=now)
            node.children[tokens[pos]] = leaf
            self.evictable_size += len(leaf.key)
            node = leaf
        return InsertResult(already, duplicates, node)

    def cache_unfinished(
        self,
        tokens: Sequence[int],
        slots: Sequence[int],
        locked_node: TreeNode | None,
        extra_key: Hashable = None,
    ) -> RecacheResult:
        """Publish a running request's computed KV (e.g. right after prefill) and move its lock.

        Inserts ``tokens -> slots``, locks the new end node and unlocks ``locked_node`` (the node
        the request locked before, or None). The caller frees ``duplicate_slots`` and switches to
        ``slots`` (its prefix now points at the tree's slots). Disabled cache: a no-op.
        """
        if self.disable:
            return RecacheResult(list(slots), [], locked_node)
        res = self.insert(tokens, slots, extra_key)
        canonical = self._path_slots(res.node)
        self.lock(res.node)
        if locked_node is not None:
            self.unlock(locked_node)
        return RecacheResult(canonical, res.duplicate_slots, res.node)

    # ------------------------------------------------------------------ locks
    def lock(self, node: TreeNode) -> None:
        """Protect ``node`` and its ancestors from eviction (reference counted)."""
        self._check_attached(node)
        while node is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
                self.protected_size += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def unlock(self, node: TreeNode) -> None:
        """Release one ``lock`` of ``node``; raises ``ValueError`` if it is not locked."""
        self._check_attached(node)
        if node.lock_ref <= 0:
            raise ValueError(f"unlock: {node!r} is not locked")
        while node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
                self.protected_size -= len(node.key)
            node = node.parent

    # ------------------------------------------------------------------ eviction
    def evict(self, num_tokens: int, free_fn: Callable[[list[int]], None]) -> EvictResult:
        """Free at least ``num_tokens`` (if possible) from least-recently-used unlocked leaves."""
        if num_tokens < 0:
            raise ValueError(f"evict: num_tokens must be >= 0, got {num_tokens}")
        if self.disable or num_tokens == 0:
            return EvictResult(0)
        order = itertools.count()
        heap = [
            (n.last_access_time, next(order), n)
            for n in self._iter_nodes()
            if not n.children and n.lock_ref == 0 and not n.is_namespace
        ]
        heapq.heapify(heap)
        evicted = 0
        while evicted < num_tokens and heap:
            _, _, node = heapq.heappop(heap)
            free_fn(node.value)
            evicted += len(node.value)
            self.evictable_size -= len(node.key)
            parent = node.parent
            del parent.children[node.key[0]]
            node.detached = True
            if parent.children or parent.lock_ref > 0:
                continue
            if parent.is_namespace:
                # Empty, unlocked namespaces are dropped so cache salts cannot accumulate.
                if parent is not self.root:
                    del self.root.children[parent.extra_key]  # type: ignore[index]
                    parent.detached = True
            else:
                heapq.heappush(heap, (parent.last_access_time, next(order), parent))
        return EvictResult(evicted)

    # ------------------------------------------------------------------ debugging
    def check_invariants(self) -> None:
        """Raise ``AssertionError`` if the tree or its size counters are inconsistent."""
        evictable = protected = 0
        seen: set[int] = set()
        for key, ns in self.root.children.items():
            assert ns.is_namespace and ns.extra_key == key and ns.parent is self.root
        for node in self._iter_nodes():
            assert not node.detached, f"{node!r} is in the tree but marked detached"
            assert len(node.key) == len(node.value), f"{node!r}: key/value lengths differ"
            if node.is_namespace:
                assert not node.key and node.parent is self.root, "misplaced namespace node"
            else:
                assert node.key, f"{node!r}: empty token node"
            child_locks = 0
            for first, child in node.children.items():
                assert child.parent is node, f"{child!r} has a wrong parent"
                assert not child.is_namespace, "namespace node below the root"
                assert child.key[0] == first, f"{child!r} is filed under token {first}"
                child_locks += child.lock_ref
            assert node.lock_ref >= child_locks, f"{node!r}: lock_ref below its children's"
            dup = seen.intersection(node.value)
            assert not dup, f"slots {sorted(dup)} are stored twice"
            seen.update(node.value)
            if node.lock_ref > 0:
                protected += len(node.key)
            else:
                evictable += len(node.key)
        assert evictable == self.evictable_size, f"evictable {evictable} != {self.evictable_size}"
        assert protected == self.protected_size, f"protected {protected} != {self.protected_size}"

    def format_tree(self) -> str:
        """The tree as indented text, one node a line."""
        lines: list[str] = []

        def walk(node: TreeNode, depth: int) -> None:
            for child in node.children.values():
                if child.is_namespace:
                    label = f"[extra_key={child.extra_key!r}]"
                else:
                    label = f"{child.key} -> {child.value}"
                lines.append(f"{'  ' * depth}{label} lock={child.lock_ref} t={child.last_access_time}")
                walk(child, depth + 1)

        walk(self.root, 0)
        return "\n".join(lines) if lines else "(empty)"

    def pretty_print(self) -> None:
        """Print ``format_tree()`` and the size counters (for debugging)."""
        print(self.format_tree())
        print(f"total={self.total_size()} evictable={self.evictable_size} protected={self.protected_size}")

    # ------------------------------------------------------------------ internals
    def _namespace(self, extra_key: Hashable, create: bool) -> TreeNode | None:
        try:
            ns = self.root.children.get(extra_key)  # type: ignore[arg-type]
        except TypeError:
            raise ValueError(f"extra_key must be hashable, got {type(extra_key).__name__}") from None
        if ns is None and create:
            ns = TreeNode(parent=self.root, is_namespace=True, extra_key=extra_key)
            self.root.children[extra_key] = ns  # type: ignore[index]
        return ns

    def _split(self, child: TreeNode, n: int) -> TreeNode:
        """Split ``child`` after ``n`` tokens; the new parent node holds the first ``n`` tokens.

        ``child`` keeps its identity (and so its full token path), which keeps node references
        held by callers valid; the new node inherits ``child``'s lock count.
        """
        parent = child.parent
        new = TreeNode(
            key=child.key[:n],
            value=child.value[:n],
            parent=parent,
            lock_ref=child.lock_ref,
            last_access_time=child.last_access_time,
        )
        child.key = child.key[n:]
        child.value = child.value[n:]
        child.parent = new
        new.children[child.key[0]] = child
        parent.children[new.key[0]] = new
        return new

    @staticmethod
    def _path_slots(node: TreeNode) -> list[int]:
        """Slots of every token from the root down to ``node``."""
        parts = []
        while node is not None:
            parts.append(node.value)
            node = node.parent
        return [slot for value in reversed(parts) for slot in value]

    def _check_attached(self, node: TreeNode) -> None:
        if node.detached:
            raise ValueError(f"{node!r} was evicted or reset; match the prefix again")

    def _iter_nodes(self) -> Iterator[TreeNode]:
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

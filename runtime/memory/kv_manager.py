"""KVManager: the one owner of KV slots and request rows (allocate, match + lock, release, roll back, flush).

Every slot and row moves through here: the scheduler asks for them, jump-forward rolls them back through
`rollback`, and the model runner sees only `buffers` (a read-only view for the forward). The pool's and
the row table's mutators are underscore methods called from this module alone (tests/runtime checks it).

Accounting invariant (checked by `check_invariants`): free + evictable + protected + request-owned slots
== pool size, where a request owns `slots[locked_len:]` (its prefix up to locked_len belongs to the tree).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable

from .kv_pool import KVPool, ReqToTokenPool
from .radix_cache import RadixCache

if TYPE_CHECKING:
    import torch

    from ..core import Req


@dataclass(frozen=True)
class KVBuffers:
    """What a forward reads and writes through slot ids (never the free lists)."""

    k_buffer: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    v_buffer: torch.Tensor  # [layers, slots, kv_heads, head_dim]
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32


@dataclass(frozen=True)
class KVStats:
    """Slot counts at one moment: total = free + evictable (cached, unlocked) + protected + request-owned."""

    total: int
    free: int
    evictable: int
    protected: int

    @property
    def used(self) -> int:
        """Slots not reclaimable now: held by requests or locked in the cache for them."""
        return self.total - self.free - self.evictable


class KVManager:
    """Owns the KV pool, the request-to-token rows and the radix cache; the scheduler asks it for slots."""

    def __init__(self, pool: KVPool, rows: ReqToTokenPool, cache: RadixCache):
        self._pool, self._rows, self._cache = pool, rows, cache
        self.buffers = KVBuffers(pool.k_buffer, pool.v_buffer, rows.req_to_token)
        rows.req_to_token[rows.padding_row].fill_(pool.padding_slot)

    @property
    def padding(self) -> tuple[int, int]:
        """(slot, row) that padded decode rows use: never allocated, so their writes touch no request's KV."""
        return self._pool.padding_slot, self._rows.padding_row

    # ------------------------------------------------------------------ read access
    @property
    def num_slots(self) -> int:
        """Pool size in tokens."""
        return self._pool.num_slots

    @property
    def cache(self) -> RadixCache:
        """The radix cache, for read-only lookups (schedule policies peek; nothing outside mutates it)."""
        return self._cache

    def available(self) -> int:
        """Slots obtainable now: free plus evictable."""
        return self._pool.available() + self._cache.evictable_size

    def free_slots(self) -> int:
        """Slots free now, without evicting cached KV (speculative drafts take only these)."""
        return self._pool.available()

    def has_free_row(self) -> bool:
        """Whether another request can get a row in the request-to-token table."""
        return self._rows.available() > 0

    def peek_prefix_len(self, tokens: list[int], extra_key) -> int:
        """Cached prefix length of `tokens` without touching the tree (scheduling estimates)."""
        return self._cache.peek_prefix_len(tokens, extra_key)

    def stats(self) -> KVStats:
        """Current slot counts."""
        return KVStats(self._pool.num_slots, self._pool.available(), self._cache.evictable_size,
                       self._cache.protected_size)

    # ------------------------------------------------------------------ a request's KV
    def match_prefix(self, req: Req, tokens: list[int]) -> int:
        """Reuse the longest cached prefix of `tokens` for `req` (locked until release); returns its length."""
        m = self._cache.match_prefix(tokens, req.extra_key)
        self._cache.lock(m.node)
        req.cache_node, req.slots, req.locked_len = m.node, list(m.slots), len(m.slots)
        return len(m.slots)

    def assign_row(self, req: Req) -> bool:
        """Give `req` a row holding its current slots; False when every row is taken."""
        row = self._rows._alloc_row()
        if row is None:
            return False
        req.row = row
        self._rows._write(row, 0, req.slots)
        return True

    def grow(self, req: Req, n: int) -> bool:
        """Append n new slots to `req` (evicting cached KV if needed); False and nothing taken when short."""
        # extend the request's own run (its last slot), or start one in a roomy place if it has none yet
        own = len(req.slots) > req.locked_len
        after, fresh = (req.slots[-1] if req.slots else None), not own
        res = self._pool._alloc(n, after, fresh)
        if not res.ok and self._cache.evictable_size > 0:
            self._cache.evict(n - self._pool.available(), self._free_evicted)
            res = self._pool._alloc(n, after, fresh)
        if not res.ok:
            return False
        self._rows._write(req.row, req.kv_len, res.slots)
        req.slots.extend(res.slots)
        return True

    def grow_each(self, reqs: list[Req]) -> bool:
        """One new slot for each request (a decode step), taken and written to their rows in one call.

        The same slots as grow(req, 1) request by request when the pool has them free; False and nothing taken
        when it does not (the caller then grows them one at a time, evicting or preempting as it goes)."""
        if self._pool.available() < len(reqs):
            return False
        slots = self._pool._alloc_each([(r.slots[-1] if r.slots else None, len(r.slots) <= r.locked_len)
                                        for r in reqs])
        self._rows._write_each([r.row for r in reqs], [len(r.slots) for r in reqs], slots)
        for r, s in zip(reqs, slots):
            r.slots.append(s)
        return True

    def release(self, req: Req) -> None:
        """A request leaves (finished, aborted or preempted): its computed KV goes to the cache, its row is freed."""
        if req.slots:
            res = self._cache.insert(req.all_ids[: req.kv_len], req.slots, req.extra_key)
            if res.duplicate_slots:
                self._pool._free(res.duplicate_slots)
        if req.cache_node is not None:
            self._cache.unlock(req.cache_node)
        req.cache_node, req.slots, req.locked_len = None, [], 0
        if req.row is not None:
            self._rows._free_row(req.row)
            req.row = None

    def cache_unfinished(self, req: Req, upto: int | None = None) -> None:
        """Publish a running request's computed KV so waiting requests can share it; the request keeps a lock.

        upto: publish only all_ids[:upto] (overlap scheduling: the next token's slot is already taken, and
        jump-forward must stay free to roll that token back)."""
        n = req.kv_len if upto is None else min(upto, req.kv_len)
        if self._cache.disable or not req.slots or req.locked_len >= n:
            return
        res = self._cache.cache_unfinished(req.all_ids[:n], req.slots[:n], req.cache_node, req.extra_key)
        if res.duplicate_slots:
            self._pool._free(res.duplicate_slots)  # identical KV computed twice: keep the tree's copy
        req.cache_node, req.slots = res.node, list(res.slots) + req.slots[n:]
        req.locked_len = len(res.slots)
        self._rows._write(req.row, 0, req.slots[:n])

    def rollback(self, req: Req, kv_len: int) -> bool:
        """Drop `req`'s KV beyond kv_len (jump-forward re-tokenization); False when the cache owns those slots."""
        if kv_len < req.locked_len:
            return False
        if kv_len < req.kv_len:
            self._pool._free(req.slots[kv_len:])
            del req.slots[kv_len:]
        return True

    def _free_evicted(self, slots: list[int]) -> None:
        """The radix cache hands back the slots of an evicted node (it calls this from evict)."""
        self._pool._free(slots)

    # ------------------------------------------------------------------ whole-pool operations
    def flush(self) -> None:
        """Drop the cache and mark every slot and row free; only valid when no request holds KV."""
        self._cache.reset()
        self._pool._reset()

    def check_invariants(self, reqs: Iterable[Req]) -> None:
        """free + evictable + protected + request-owned slots == pool size, and the tree is consistent."""
        owned = sum(len(r.slots) - r.locked_len for r in reqs)
        s = self.stats()
        if s.free + s.evictable + s.protected + owned != s.total:
            raise AssertionError(f"KV accounting broken: free {s.free} + evictable {s.evictable} + protected "
                                 f"{s.protected} + owned {owned} != {s.total}")
        self._cache.check_invariants()

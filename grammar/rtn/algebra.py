"""Boolean algebra (and / or / diff) on modules without flattening them: pairs of configurations, shared calls.

The product walks both modules side by side. A side is a local state of its top module (0 = dead) or an
item `(module, state, continuation)` once it entered a call. When both sides sit in the same callee at the
same state, they read the same bytes until it returns together, so the product calls that callee too (the
pair of continuations becomes the return state); likewise when one side is inside a `universal` module
(one that accepts every value the compiler generates, such as the over-approximations' `loose`) and the
other inside any callee, for `and`, and for `diff` when the universal side is subtracted. Everything else
is stepped pair by pair, so the result is exact (up to the universal modules' premise) and deterministic.
"""

from __future__ import annotations

import numpy as np

from ..budget import CompileBudget
from ..regex.dfa import DEAD
from ..errors import too_large
from .module import Entry, Module, finish_module, refine_classes

_OPS = ("and", "or", "diff")


def _norm(item):
    """Pop finished calls: an item whose callee accepted continues as its continuation (callees are prefix-free)."""
    while type(item) is tuple and item[0].accepting[item[1]]:
        item = item[2]
    return item


def module_product(a: Module, b: Module, op: str, max_states: int, budget: CompileBudget | None = None,
                   what: str = "a combination of subschemas") -> Module:
    """Minimal module of L(a) op L(b), op in and / or / diff."""
    if op not in _OPS:
        raise ValueError(f"unknown product op {op!r}")
    class_of, reps = refine_classes([a.classes, b.classes])
    n_classes = len(reps)
    tops = (a, b)
    cell_cache: dict = {}
    moves_cache: dict = {}

    def cells(m: Module, x: int) -> list:
        key = (id(m), x)
        got = cell_cache.get(key)
        if got is None:
            row = m.trans[x, reps]
            nz = np.flatnonzero(row)
            got = cell_cache[key] = list(zip(nz.tolist(), row[nz].tolist()))
        return got

    def moves(side: int, item) -> tuple[dict, set]:
        """class -> next side value for the live cells of one side, and the classes that enter a call."""
        key = (side, item)
        got = moves_cache.get(key)
        if got is not None:
            return got
        out, fresh = {}, set()
        m, x, cont = (tops[side], item, None) if type(item) is int else item
        for c, v in cells(m, x):
            if v > 0:
                out[c] = v if cont is None else _norm((m, v, cont))
            else:
                e = m.entries[-v - 1]
                out[c] = _norm((e.callee, e.at, e.ret if cont is None else _norm((m, e.ret, cont))))
                fresh.add(c)
        got = moves_cache[key] = (out, fresh)
        return got

    def alive(x) -> bool:
        return type(x) is tuple or x != DEAD

    def accepts(side: int, x) -> bool:
        return type(x) is int and x != DEAD and bool(tops[side].accepting[x])

    ids: dict[tuple, int] = {}
    rows: list[list[int]] = [[DEAD] * n_classes]
    acc: list[bool] = [False]
    work: list[tuple] = []
    entries: list[Entry] = []
    entry_ids: dict[tuple, int] = {}

    def intern(pair: tuple) -> int:
        sid = ids.get(pair)
        if sid is None:
            if len(rows) > max_states:
                raise too_large(what, max_states)
            if budget is not None and len(rows) % 256 == 0:
                budget.check(what)
            sid = ids[pair] = len(rows)
            x, y = pair
            ax, ay = accepts(0, x), accepts(1, y)
            acc.append(ax and ay if op == "and" else ax or ay if op == "or" else ax and not ay)
            rows.append([DEAD] * n_classes)
            work.append(pair)
        return sid

    def call(m: Module, at: int, ret: tuple) -> int:
        r = intern(ret)
        key = (id(m), at, r)
        k = entry_ids.get(key)
        if k is None:
            k = entry_ids[key] = len(entries)
            entries.append(Entry(m, at, r))
        return -(k + 1)

    def target(x, y, both_fresh: bool) -> int:
        lx, ly = alive(x), alive(y)
        if not lx and not ly or (op in ("and", "diff") and not lx) or (op == "and" and not ly):
            return DEAD
        tx, ty = type(x) is tuple, type(y) is tuple
        if tx and ty:
            if x[0] is y[0] and x[1] == y[1] and x[0].callable:
                return call(x[0], x[1], (x[2], y[2]))
            # a universal module accepts whatever value the other side's callee reads, if both start here
            if both_fresh and y[0].universal and op in ("and", "diff") and x[0].callable and x[0].value:
                return call(x[0], x[1], (x[2], y[2]))
            if both_fresh and x[0].universal and op == "and" and y[0].callable and y[0].value:
                return call(y[0], y[1], (x[2], y[2]))
        elif tx and not ly and x[0].callable:  # the other side is dead for good: only this one reads the callee
            return call(x[0], x[1], (x[2], DEAD))
        elif ty and not lx and y[0].callable:
            return call(y[0], y[1], (DEAD, y[2]))
        return intern((x, y))

    initial = intern((a.initial, b.initial))
    steps = 0
    while work:
        steps += 1
        if budget is not None and steps % 64 == 0:
            budget.check(what)
        pair = work.pop()
        row = rows[ids[pair]]
        x, y = pair
        mx, fx = moves(0, x) if alive(x) else ({}, set())
        my, fy = moves(1, y) if alive(y) else ({}, set())
        classes = mx.keys() if op in ("and", "diff") else mx.keys() | my.keys()
        for c in classes:
            row[c] = target(mx.get(c, DEAD), my.get(c, DEAD), c in fx and c in fy)
    ctrans = np.array(rows, dtype=np.int64).reshape(len(rows), n_classes)
    return finish_module(ctrans, np.array(acc, dtype=bool), initial, entries, class_of, budget, what)

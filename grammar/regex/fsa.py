"""Boolean algebra on byte DFAs: intersection, union, difference (product construction), then trim + minimise."""

from __future__ import annotations

import numpy as np

from ..budget import CompileBudget
from .dfa import DEAD, ByteDFA, trim_minimise

_OPS = {
    "and": lambda a, b: a & b,
    "or": lambda a, b: a | b,
    "diff": lambda a, b: a & ~b,
}


def empty_dfa() -> ByteDFA:
    """The automaton of the empty language (only the dead state)."""
    return ByteDFA(np.zeros((1, 256), np.int32), np.zeros(1, bool), DEAD)


def is_empty(dfa: ByteDFA) -> bool:
    """No string is accepted (DFAs from this package are trimmed, so acceptance = some accepting state)."""
    return not bool(dfa.accepting.any())


_W = np.random.default_rng(7).integers(1, 2**63, size=(2, 1 << 16), dtype=np.uint64) | np.uint64(1)


def _joint_classes(a: ByteDFA, b: ByteDFA) -> tuple[np.ndarray, np.ndarray]:
    """One representative byte per class of bytes on which both automata behave alike, and the class of each byte."""
    cols = np.concatenate([a.trans, b.trans], axis=0)  # [na+nb, 256]
    n = cols.shape[0]
    if n > _W.shape[1]:
        _, first, class_of = np.unique(cols.T, axis=0, return_index=True, return_inverse=True)
        return first, class_of.reshape(-1)
    c = cols.astype(np.uint64)
    keys = np.stack([(c * _W[0, :n, None]).sum(axis=0), (c * _W[1, :n, None]).sum(axis=0)], axis=1)  # [256, 2]
    _, first, class_of = np.unique(keys, axis=0, return_index=True, return_inverse=True)
    class_of = class_of.reshape(-1)
    if not (cols == cols[:, first[class_of]]).all():  # a hash collision merged different columns: redo exactly
        _, first, class_of = np.unique(cols.T, axis=0, return_index=True, return_inverse=True)
        class_of = class_of.reshape(-1)
    return first, class_of


def product(a: ByteDFA, b: ByteDFA, op: str, max_states: int = 20_000, budget: CompileBudget | None = None,
            what: str = "a combination of subschemas") -> ByteDFA:
    """Minimal DFA of L(a) op L(b) for op in and / or / diff, exploring only reachable state pairs."""
    if op not in _OPS:
        raise ValueError(f"unknown product op {op!r}")
    if op == "and" and (is_empty(a) or is_empty(b)):
        return empty_dfa()
    if op == "diff" and is_empty(b):
        return a
    if op == "or" and is_empty(b):
        return a
    if op == "or" and is_empty(a):
        return b
    reps, class_of = _joint_classes(a, b)
    ta, tb = a.trans[:, reps].astype(np.int64), b.trans[:, reps].astype(np.int64)  # [states, classes]
    nb = np.int64(tb.shape[0])
    need_a = op in ("and", "diff")  # a DEAD left side makes the pair dead
    need_b = op == "and"
    ids: dict[int, int] = {0: DEAD}  # pair key p * nb + q -> product state
    keys = [0, int(a.initial) * int(nb) + int(b.initial)]
    ids[keys[1]] = 1
    rows: list[np.ndarray] = [np.zeros(len(reps), np.int64)]
    frontier = np.array([keys[1]], np.int64)
    while len(frontier):  # breadth-first, one vectorised step per layer of new pairs
        if budget is not None:
            budget.check(what)
        nxt = ta[frontier // nb] * nb + tb[frontier % nb]  # [frontier, classes] successor pair keys
        dead = np.zeros(nxt.shape, bool)
        if need_a:
            dead |= ta[frontier // nb] == DEAD
        if need_b:
            dead |= tb[frontier % nb] == DEAD
        nxt[dead] = 0
        new = []
        for k in np.unique(nxt).tolist():
            if k not in ids:
                ids[k] = len(keys)
                keys.append(k)
                new.append(k)
        if len(keys) > max_states + 1:
            raise_too_large(max_states, what)
        lookup = np.array(list(ids.keys()), np.int64)
        order = np.argsort(lookup)
        vals = np.array(list(ids.values()), np.int64)[order]
        rows.append(vals[np.searchsorted(lookup[order], nxt)])
        frontier = np.array(new, np.int64)
    # rows[0] is the dead row, then one block per layer in the order states were numbered
    ctrans = np.concatenate([r.reshape(-1, len(reps)) for r in rows]).astype(np.int32)
    karr = np.array(keys, np.int64)
    pa, pb = karr // nb, karr % nb
    accepting = _OPS[op](a.accepting[pa], b.accepting[pb])
    accepting[DEAD] = False
    ctrans, accepting, initial = trim_minimise(ctrans, accepting, 1, budget, what)
    return ByteDFA(np.ascontiguousarray(ctrans[:, class_of]), accepting, initial)


def raise_too_large(max_states: int, what: str) -> None:
    from ..errors import too_large

    raise too_large(what, max_states)


def intersect_all(dfas: list[ByteDFA], max_states: int = 20_000, budget: CompileBudget | None = None,
                  what: str = "allOf") -> ByteDFA:
    """Intersection of several automata (smallest first, so empty results are found early)."""
    if not dfas:
        raise ValueError("intersect_all needs at least one automaton")
    order = sorted(dfas, key=lambda d: d.num_states)
    out = order[0]
    for d in order[1:]:
        if is_empty(out):
            break
        out = product(out, d, "and", max_states, budget, what)
    return out


def union_all(dfas: list[ByteDFA], max_states: int = 20_000, budget: CompileBudget | None = None,
              what: str = "anyOf") -> ByteDFA:
    """Union of several automata."""
    out = empty_dfa()
    for d in dfas:
        out = product(out, d, "or", max_states, budget, what)
    return out

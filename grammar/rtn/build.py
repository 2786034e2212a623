"""Subset construction for NFAs that embed modules: callable sub-automata become call cells, not copies.

NFA states may embed a module (regex.nfa `atoms`): "run this module from its initial state, then continue
at `end`". Subsets hold NFA states and module items `(module, state, continuation)`, where the
continuation is an item again. Whenever every item left after a byte sits in the same state of one
callable module, the cell becomes a call entry landing there, and the subset of continuations becomes the
caller's return state: the callee's states are never copied. Anything else (modules too small to call,
branches that cannot tell their modules apart yet) is stepped through the subset as usual, so the
result is deterministic and exact.
"""

from __future__ import annotations

import numpy as np

from ..budget import CompileBudget
from ..regex.dfa import DEAD
from ..errors import too_large
from ..regex.native import kernel_of, native_subset
from ..regex.nfa import NFA
from .module import Entry, Module, finish_module, refine_classes


def _nfa_classes(nfa: NFA, modules: list[Module]) -> tuple[np.ndarray, np.ndarray]:
    cuts = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = np.array(sorted(cuts), dtype=np.int64)
    own = (np.searchsorted(bounds, np.arange(256), side="right") - 1).astype(np.int32)
    return refine_classes([own] + [m.classes for m in modules])


def nfa_to_module(nfa: NFA, max_states: int, budget: CompileBudget | None = None,
                  what: str = "the automaton") -> Module:
    """Deterministic module of an NFA with embedded modules (see the module docstring)."""
    built = native_subset(nfa, max_states, budget, what)
    if built is not None:  # the same construction in native code (the budget carries the kernel)
        mods, res = built
        entries = tuple(Entry(mods[c], a, r) for c, a, r in res.entries.tolist())
        return Module(np.ascontiguousarray(res.table[:, res.class_of]), res.accepting, res.initial, entries,
                      res.class_of)
    embedded = {id(m): m for es in nfa.embeds.values() for m, _ in es}
    class_of, reps = _nfa_classes(nfa, list(embedded.values()))
    n_classes = len(reps)
    # refined classes are not byte intervals: each edge lists the classes its byte range covers
    span: dict[tuple[int, int], tuple] = {}
    class_list = class_of.tolist()

    def classes_in(lo: int, hi: int) -> tuple:
        got = span.get((lo, hi))
        if got is None:
            got = span[(lo, hi)] = tuple(sorted(set(class_list[lo:hi + 1])))
        return got

    cedges = [[(classes_in(lo, hi), t) for lo, hi, t in es] for es in nfa.edges]
    eps, accept, embeds = nfa.eps, nfa.accept, nfa.embeds
    row_cache: dict[tuple[int, int], list[tuple[int, int]]] = {}
    # per module (by id): acceptance and has-an-exit as Python lists, and whether it is worth a call
    # (numpy scalar indexing and the `callable` property cost more than the closure's own work)
    accepting_of = {id(m): m.accepting.tolist() for m in embedded.values()}
    exit_of = {id(m): m.has_exit.tolist() for m in embedded.values()}
    callable_of = {id(m): m.callable for m in embedded.values()}

    def module_lists(m: Module) -> None:
        if id(m) not in accepting_of:  # a callee of an embedded module, met while stepping through it
            accepting_of[id(m)], exit_of[id(m)], callable_of[id(m)] = (m.accepting.tolist(), m.has_exit.tolist(),
                                                                     m.callable)

    def cells(m: Module, x: int) -> list[tuple[int, int]]:
        key = (id(m), x)
        got = row_cache.get(key)
        if got is None:
            row = m.trans[x, reps]
            nz = np.flatnonzero(row)
            got = row_cache[key] = list(zip(nz.tolist(), row[nz].tolist()))
        return got

    def closure(seeds) -> tuple[frozenset, bool]:
        seen = set()
        stack = list(seeds)
        while stack:
            it = stack.pop()
            if it in seen:
                continue
            seen.add(it)
            if type(it) is int:
                stack.extend(eps[it])
                for m, end in embeds.get(it, ()):
                    if m.initial != DEAD:
                        stack.append((m, m.initial, end))
            elif accepting_of[id(it[0])][it[1]]:
                stack.append(it[2])
        kept = frozenset(it for it in seen if (cedges[it] if type(it) is int else exit_of[id(it[0])][it[1]]))
        return kept, accept in seen

    ids: dict[tuple[frozenset, bool], int] = {}
    rows: list[list[int]] = [[DEAD] * n_classes]
    acc: list[bool] = [False]
    work: list[tuple[frozenset, bool]] = []
    entries: list[Entry] = []
    entry_ids: dict[tuple[int, int, int], int] = {}

    def intern(key) -> int:
        sid = ids.get(key)
        if sid is None:
            if len(rows) > max_states:
                raise too_large(what, max_states)
            if budget is not None and len(rows) % 256 == 0:
                budget.check(what)
            sid = ids[key] = len(rows)
            rows.append([DEAD] * n_classes)
            acc.append(key[1])
            work.append(key)
        return sid

    def target(items: frozenset) -> int:
        kept, accepting = closure(items)
        if not kept and not accepting:
            return DEAD
        if not accepting:
            first = next(iter(kept))
            if type(first) is not int and callable_of[id(first[0])] and all(
                    type(it) is not int and it[0] is first[0] and it[1] == first[1] for it in kept):
                ret = intern(closure([it[2] for it in kept]))
                key = (id(first[0]), first[1], ret)
                k = entry_ids.get(key)
                if k is None:
                    k = entry_ids[key] = len(entries)
                    entries.append(Entry(first[0], first[1], ret))
                return -(k + 1)
        return intern((kept, accepting))

    initial = intern(closure([nfa.start]))
    steps = 0
    while work:
        steps += 1
        if budget is not None and steps % 64 == 0:
            budget.check(what)
        key = work.pop()
        row = rows[ids[key]]
        moves: dict[int, list] = {}
        for it in key[0]:
            if type(it) is int:
                for cs, t in cedges[it]:
                    for c in cs:
                        moves.setdefault(c, []).append(t)
                continue
            m, x, cont = it
            for c, v in cells(m, x):
                if v > 0:
                    moves.setdefault(c, []).append((m, v, cont))
                else:
                    e = m.entries[-v - 1]
                    module_lists(e.callee)
                    moves.setdefault(c, []).append((e.callee, e.at, (m, e.ret, cont)))
        cache: dict[frozenset, int] = {}
        for c, targets in moves.items():
            ft = frozenset(targets)
            got = cache.get(ft)
            if got is None:
                got = cache[ft] = target(ft)
            row[c] = got
    ctrans = np.array(rows, dtype=np.int64).reshape(len(rows), n_classes)
    return finish_module(ctrans, np.array(acc, dtype=bool), initial, entries, class_of, budget, what)


def regex_to_module(pattern: str, max_states: int, budget: CompileBudget | None = None, atoms: dict | None = None,
                    what: str = "the automaton") -> Module:
    """A regex whose atom markers stand for modules / fragments / DFAs (regex.nfa.build_nfa) as one module."""
    from ..regex.dfa import nfa_to_dfa
    from ..regex.nfa import build_nfa
    from .module import module_of

    nfa = build_nfa(pattern, max_nfa_states=min(500_000, max(100_000, 50 * max_states)), atoms=atoms,
                    budget=budget)
    if nfa.embeds or kernel_of(budget) is not None:  # natively, the module keeps the kernel's byte classes
        return nfa_to_module(nfa, max_states, budget, what)
    return module_of(nfa_to_dfa(nfa, max_states, budget=budget, what=what))

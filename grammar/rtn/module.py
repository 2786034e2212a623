"""Modules: byte DFAs whose cells may call other modules (a recursive transition network); trim, minimise, flatten.

A schema's automaton is a DAG of modules instead of one flat DFA: a definition used at N places is one
module called from N cells, not N copies. A cell (state, byte) either moves inside the module (a local
state, 0 = dead) or is a call entry `(callee, at, ret)`: the byte lands in the callee's state `at`, and
when the callee reaches one of its accepting states the caller continues at its own state `ret`.
Callees are prefix-free (their accepting states have no exits), so that return is deterministic and
the whole network reads bytes deterministically with a stack of return states.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..budget import CompileBudget
from ..regex.dfa import DEAD, ByteDFA, coreachable, group_rows, trim_minimise
from ..regex.native import native_finish
from ..errors import GrammarError, too_large

CALL_MIN = 24  # modules smaller than this are inlined into their callers (a call costs a stack frame)


@dataclass(frozen=True)
class Entry:
    """A call: the byte lands in `callee` state `at`; when the callee accepts, the caller continues at `ret`."""

    callee: "Module"
    at: int
    ret: int


@dataclass(frozen=True, eq=False)
class Module:
    """A byte DFA with call cells: trans >= 0 is a local state (DEAD = 0), < 0 is call entry -(k + 1)."""

    trans: np.ndarray  # [states, 256] int32
    accepting: np.ndarray  # [states] bool
    initial: int
    entries: tuple = ()  # Entry per call index
    classes: np.ndarray = field(default=None, repr=False)  # [256] byte class ids refining this module and its callees
    universal: bool = False  # accepts every value the compiler generates (rtn.algebra may call it unchecked)
    value: bool = False  # its strings are whole JSON values (set by the schema converter: see mark_value)

    def __post_init__(self):
        if self.classes is None:
            object.__setattr__(self, "classes", column_classes(self.trans))
        live = self.trans != DEAD
        object.__setattr__(self, "has_exit", live.any(axis=1))
        fin = self.accepting.copy()
        fin[DEAD] = False
        object.__setattr__(self, "prefix_free", not bool(live[fin].any()))

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    @property
    def callable(self) -> bool:
        """Worth a call (a stack frame) rather than a copy: prefix-free, and large or itself calling others."""
        return self.prefix_free and (self.num_states >= CALL_MIN or bool(self.entries)) and self.initial != DEAD

    def modules(self) -> list["Module"]:
        """This module and every module it calls, transitively (callees after their callers)."""
        seen: dict[int, Module] = {}
        order: list[Module] = []
        stack = [self]
        while stack:
            m = stack.pop()
            if id(m) in seen:
                continue
            seen[id(m)] = m
            order.append(m)
            stack.extend(e.callee for e in m.entries)
        return order

    def total_states(self) -> int:
        return sum(m.num_states for m in self.modules())


def mark_value(mod: Module) -> Module:
    """Record that every string of `mod` is one whole JSON value (what the universal-module shortcut needs)."""
    object.__setattr__(mod, "value", True)
    return mod


def module_of(dfa: ByteDFA) -> Module:
    """A plain DFA as a module without calls."""
    return Module(dfa.trans, dfa.accepting, dfa.initial)


def column_classes(trans: np.ndarray) -> np.ndarray:
    """Byte class id per byte: bytes whose columns agree in every row share a class.

    Columns are grouped by two random 64-bit hashes, then checked against their class's first column
    (exact); np.unique over whole columns is the fallback (it costs seconds on 10,000-state tables)."""
    n = trans.shape[0]
    mix = np.random.default_rng(n).integers(1, 2**62, size=(n, 1), dtype=np.int64)
    h = (trans * mix).sum(axis=0)  # [256] int64 (wrapping); no BLAS: it spins on a loaded box
    _, first, cls = np.unique(h, return_index=True, return_inverse=True)
    cls = cls.reshape(-1)
    if (trans[:, first[cls]] == trans).all():
        return cls.astype(np.int32)
    return np.unique(trans.T, axis=0, return_inverse=True)[1].reshape(-1).astype(np.int32)


def refine_classes(parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Common refinement of byte partitions: (class id per byte [256], one representative byte per class)."""
    if not parts:
        return np.zeros(256, np.int32), np.zeros(1, np.int64)
    _, reps, class_of = np.unique(np.stack(parts).T, axis=0, return_index=True, return_inverse=True)
    return class_of.reshape(-1).astype(np.int32), reps.astype(np.int64)


# ---- trim / minimise over class-compressed tables with call cells ------------------------------------------


def _successors(ctrans: np.ndarray, rets: np.ndarray) -> np.ndarray:
    """For liveness: a call cell leads (through the callee, which always can return) to its entry's ret."""
    if not len(rets):
        return ctrans
    return np.where(ctrans >= 0, ctrans, rets[np.where(ctrans < 0, -ctrans - 1, 0)])


def trim_module(ctrans: np.ndarray, accepting: np.ndarray, initial: int, entries: list):
    """Drop states that cannot reach acceptance (call cells count as edges to their ret); renumber."""
    n = ctrans.shape[0]
    rets = np.array([e.ret for e in entries], np.int64)
    start = accepting.copy()
    start[DEAD] = False
    live = coreachable(_successors(ctrans, rets), start)
    if not live[initial]:
        return np.zeros((1, ctrans.shape[1]), np.int32), np.zeros(1, bool), DEAD, []
    live[DEAD] = True
    keep = np.flatnonzero(live)
    remap = np.zeros(n, np.int64)
    remap[keep] = np.arange(len(keep))
    # entries whose ret died are dropped (their cells become DEAD); the others are renumbered
    new_entries, emap = [], np.zeros(len(entries) + 1, np.int64)  # emap[k + 1] = new cell value
    for k, e in enumerate(entries):
        if live[e.ret] and e.ret != DEAD:
            emap[k + 1] = -(len(new_entries) + 1)
            new_entries.append(Entry(e.callee, e.at, int(remap[e.ret])))
    kept = ctrans[keep]
    out = np.where(kept >= 0, remap[np.maximum(kept, 0)], emap[np.where(kept < 0, -kept, 0)])
    return out.astype(np.int32), accepting[keep], int(remap[initial]), new_entries


def minimise_module(ctrans: np.ndarray, accepting: np.ndarray, initial: int, entries: list,
                    budget: CompileBudget | None = None, what: str = "the automaton"):
    """Moore refinement (dfa._minimise) over the table extended with one pseudo-state per call entry.

    A pseudo-state's row leads to the entry's ret everywhere and its initial block is its (callee, at), so
    two call cells end up equivalent exactly when they call the same place and return to equivalent states.
    """
    from ..regex.dfa import _minimise

    n, k = ctrans.shape
    e_count = len(entries)
    ext = np.zeros((n + e_count, k), np.int64)
    ext[:n] = np.where(ctrans >= 0, ctrans, n - ctrans - 1)
    start = np.zeros(n + e_count, np.int64)
    start[:n] = accepting.astype(np.int64) + 1
    start[DEAD] = 0
    if e_count:
        ext[n:] = np.array([e.ret for e in entries], np.int64)[:, None]
        codes, _ = group_rows(np.array([[id(e.callee), e.at] for e in entries], np.int64))
        start[n:] = 3 + codes
    acc = np.concatenate([accepting, np.zeros(e_count, bool)])
    blocks: list = []
    t, a, init = _minimise(ext.astype(np.int32), acc, initial, budget, what, start=start, blocks=blocks)
    block = blocks[0]
    # pseudo-states never share a block with real states (distinct initial blocks), and blocks are numbered
    # in order of their first state, so the real states' blocks come first
    n_real = int(block[:n].max()) + 1
    pseudo = block[n:]
    new_entries = [None] * (t.shape[0] - n_real)
    for i, e in enumerate(entries):
        j = int(pseudo[i]) - n_real
        if new_entries[j] is None:
            new_entries[j] = Entry(e.callee, e.at, int(t[pseudo[i], 0]))
    rows = t[:n_real].astype(np.int64)
    out = np.where(rows < n_real, rows, n_real - 1 - rows)  # pseudo block n_real + j -> call -(j + 1)
    return out.astype(np.int32), a[:n_real], init, new_entries


def finish_module(ctrans, accepting, initial, entries, class_of, budget=None, what="the automaton") -> Module:
    """Trim, minimise and expand a class-compressed table into a Module."""
    built = native_finish(ctrans, accepting, initial, entries, budget, what)
    if built is not None:  # the same trim and minimisation in native code (the budget carries the kernel)
        callees, res = built
        ctrans, accepting, initial = res.table, res.accepting, res.initial
        entries = [Entry(callees[c], a, r) for c, a, r in res.entries.tolist()]
    else:
        ctrans, accepting, initial, entries = trim_module(ctrans, accepting, initial, entries)
        if initial != DEAD:
            ctrans, accepting, initial, entries = minimise_module(ctrans, accepting, initial, entries, budget, what)
    return Module(np.ascontiguousarray(ctrans[:, class_of]).astype(np.int32), accepting, initial, tuple(entries),
                  class_of.astype(np.int32))


# ---- flattening (for DFA algebra) ------------------------------------------------------------------------


def flatten(mod: Module, max_states: int, budget: CompileBudget | None = None, what: str = "the automaton",
            cache: dict | None = None) -> ByteDFA:
    """The plain DFA of a module: every call replaced by a copy of the callee (one copy per (callee, ret)).

    States keep their ids (the module's own states first), so flat ids of callee states are offset + id.
    """
    cache = {} if cache is None else cache
    got = cache.get(id(mod))
    if got is not None:
        if got[1] is None:
            raise GrammarError(f"automaton too large: {what} nests without bound (a recursive module)")
        return got[1]
    cache[id(mod)] = (mod, None)  # in progress
    if not mod.entries:
        out = ByteDFA(mod.trans, mod.accepting, mod.initial)
        cache[id(mod)] = (mod, out)
        return out
    n = mod.num_states
    blocks = [np.where(mod.trans >= 0, mod.trans, 0).astype(np.int32)]
    acc = [mod.accepting]
    total = n
    copies: dict[tuple[int, int], int] = {}
    rows, cols = np.nonzero(mod.trans < 0)
    targets = np.zeros(len(rows), np.int64)
    for i, (q, b) in enumerate(zip(rows.tolist(), cols.tolist())):
        e = mod.entries[-int(mod.trans[q, b]) - 1]
        key = (id(e.callee), e.ret)
        off = copies.get(key)
        if off is None:
            if budget is not None:
                budget.check(what)
            sub = flatten(e.callee, max_states, budget, what, cache)
            fin = sub.accepting.copy()
            fin[DEAD] = False
            t = sub.trans
            blocks.append(np.where(fin[t], e.ret, np.where(t == DEAD, DEAD, t + total)).astype(np.int32))
            acc.append(np.zeros(sub.num_states, bool))  # the callee's acceptance is the caller's ret
            off = copies[key] = total
            total += sub.num_states
            if total > max_states:
                raise too_large(what, max_states)
        targets[i] = off + e.at
    trans = np.concatenate(blocks)
    trans[rows, cols] = targets
    out = ByteDFA(trans, np.concatenate(acc), mod.initial)
    cache[id(mod)] = (mod, out)
    return out


def flat_minimal(mod: Module, max_states: int, budget: CompileBudget | None = None,
                 what: str = "the automaton") -> ByteDFA:
    """flatten() followed by trimming and minimisation."""
    d = flatten(mod, max_states, budget, what)
    if not mod.entries:
        return d
    t, a, i = trim_minimise(d.trans, d.accepting, d.initial, budget, what)
    return ByteDFA(np.ascontiguousarray(t), a, i)

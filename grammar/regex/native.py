"""Automata built by a native kernel (sglpy.kernels.automata, handed in through the compile budget): the NFA and
its embedded modules (rtn.module.Module, read by duck typing: rtn builds on regex) flattened into arrays.

The Python constructions (regex/dfa.py, rtn/build.py, rtn/module.py) stay the reference: the kernel implements the
same subset construction, trim and Moore minimisation, so the results are the same automata up to state numbering.
Every function here returns None when the budget carries no kernel (the caller then runs the Python path);
the callers turn the kernel's class tables back into DFAs (regex/dfa.py) and modules (rtn/).
"""

from __future__ import annotations

from itertools import chain
from typing import Any

import numpy as np

from ..budget import CompileBudget
from ..errors import too_large

TOO_LARGE = 1  # = kernels.automata.TOO_LARGE


def kernel_of(budget: CompileBudget | None) -> Any:
    """The budget's native automata kernel when it is loaded, else None."""
    kernel = None if budget is None else budget.native
    return kernel if kernel is not None and kernel.ready() else None


def _csr(lists: list, width: int = 1) -> tuple[np.ndarray, np.ndarray]:
    """(offsets [n + 1] int32, flat int32 values) of a list of lists (of `width`-tuples when width > 1)."""
    n = len(lists)
    off = np.zeros(n + 1, np.int32)
    np.cumsum(np.fromiter(map(len, lists), np.int64, n), out=off[1:])
    flat = chain.from_iterable(lists)
    if width > 1:
        flat = chain.from_iterable(flat)
    vals = np.fromiter(flat, np.int32, int(off[-1]) * width)
    return off, vals


def _module_arrays(embedded: list) -> tuple[list, dict]:
    """The modules an NFA embeds and all their callees (embedded first), as the kernel's module arrays."""
    mods: list = []
    index: dict[int, int] = {}
    stack = list(embedded)
    while stack:
        m = stack.pop(0) if len(mods) < len(embedded) else stack.pop()
        if id(m) in index:
            continue
        index[id(m)] = len(mods)
        mods.append(m)
        stack.extend(e.callee for e in m.entries)
    refine = np.zeros(len(mods), np.uint8)
    refine[[index[id(m)] for m in embedded]] = 1
    entry_off = np.zeros(len(mods) + 1, np.int32)
    np.cumsum([len(m.entries) for m in mods], out=entry_off[1:])
    ents = [(index[id(e.callee)], e.at, e.ret) for m in mods for e in m.entries]
    ents_arr = np.array(ents, np.int32).reshape(-1, 3)
    arrays = {
        "trans": [np.ascontiguousarray(m.trans, np.int32) for m in mods],
        "accepting": [np.ascontiguousarray(m.accepting, np.bool_) for m in mods],
        "exit": [np.ascontiguousarray(m.has_exit, np.bool_) for m in mods],
        "initial": np.array([m.initial for m in mods], np.int32),
        "callable": np.array([m.callable for m in mods], np.uint8),
        "refine": refine,
        "classes": np.ascontiguousarray(np.stack([m.classes for m in mods]).astype(np.int32, copy=False))
        if mods else np.zeros((0, 256), np.int32),
        "entry_off": entry_off,
        "entry_callee": np.ascontiguousarray(ents_arr[:, 0]),
        "entry_at": np.ascontiguousarray(ents_arr[:, 1]),
        "entry_ret": np.ascontiguousarray(ents_arr[:, 2]),
    }
    return mods, arrays


def native_subset(nfa, max_states: int, budget: CompileBudget | None, what: str):
    """(modules in the kernel's callee order, the kernel's NativeAutomaton) of `nfa` and the modules it embeds:
    the trimmed minimal class table; None without a kernel. Raises GrammarError past max_states, and the
    budget's errors."""
    kernel = kernel_of(budget)
    if kernel is None:
        return None
    eps_off, eps_dst = _csr(nfa.eps)
    edge_off, flat = _csr(nfa.edges, 3)
    flat = flat.reshape(-1, 3)
    embedded = list({id(m): m for es in nfa.embeds.values() for m, _ in es}.values())
    mods, marrays = _module_arrays(embedded)
    mod_index = {id(m): i for i, m in enumerate(mods)}
    n = len(nfa.eps)
    emb_off = np.zeros(n + 1, np.int32)
    emb_flat = np.zeros((0, 2), np.int32)
    if nfa.embeds:
        states = sorted(nfa.embeds)
        counts = np.zeros(n, np.int64)
        counts[states] = [len(nfa.embeds[s]) for s in states]
        np.cumsum(counts, out=emb_off[1:])
        emb_flat = np.array([(mod_index[id(m)], end) for s in states for m, end in nfa.embeds[s]], np.int32)
    arrays = {"n": len(nfa.eps), "start": nfa.start, "accept": nfa.accept, "eps_off": eps_off, "eps_dst": eps_dst,
              "edge_off": edge_off, "edge_lo": np.ascontiguousarray(flat[:, 0]),
              "edge_hi": np.ascontiguousarray(flat[:, 1]), "edge_dst": np.ascontiguousarray(flat[:, 2]),
              "emb_off": emb_off, "emb_mod": np.ascontiguousarray(emb_flat[:, 0]),
              "emb_end": np.ascontiguousarray(emb_flat[:, 1])}
    res = kernel.subset(arrays, marrays, max_states, (lambda: budget.check(what)))
    if res.status == TOO_LARGE:
        raise too_large(what, max_states)
    return mods, res


def native_finish(ctrans: np.ndarray, accepting: np.ndarray, initial: int, entries: list,
                  budget: CompileBudget | None, what: str):
    """(callees in code order, NativeAutomaton) of a class table with call entries (rtn.module.Entry) trimmed and
    minimised natively, as rtn.module.trim_module + minimise_module give them (columns unchanged: the result's
    entries are (callee code, at, ret)); None without a kernel."""
    kernel = kernel_of(budget)
    if kernel is None:
        return None
    callees: dict[int, int] = {}
    by_code: list = []
    codes = []
    for e in entries:
        c = callees.get(id(e.callee))
        if c is None:
            c = callees[id(e.callee)] = len(by_code)
            by_code.append(e.callee)
        codes.append((c, e.at, e.ret))
    ents = np.array(codes, np.int32).reshape(-1, 3)
    res = kernel.finish(np.ascontiguousarray(ctrans, np.int32), np.ascontiguousarray(accepting, np.bool_),
                        int(initial), ents, (lambda: budget.check(what)))
    return by_code, res

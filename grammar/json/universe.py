"""The generated universe: any-value automata (bounded nesting) and `loose`, the recursive universal module."""

from __future__ import annotations

import functools

import numpy as np

from . import formats as F
from .formats import ANY_NUMBER_RE
from ..regex import DEAD, ByteDFA, regex_to_dfa
from ..regex.nfa import ATOM_BASE
from ..rtn.module import Entry, Module


@functools.lru_cache(maxsize=64)
def any_dfa(layout: tuple, depth: int, numbers: bool = True) -> ByteDFA:
    """Any JSON value nested at most `depth` levels, in a layout (open/close object/array, comma, colon).

    numbers=False: not a number at the top level (nested values still may be).
    """
    oo, co, oa, ca, comma, colon = layout
    alts = [F.STRING, ANY_NUMBER_RE, F.BOOLEAN, F.NULL] if numbers else [F.STRING, F.BOOLEAN, F.NULL]
    atoms = {}
    if depth > 0:
        atoms[ATOM_BASE] = any_dfa(layout, depth - 1)
        inner = chr(ATOM_BASE)
        alts.append(oa + f"(?:{inner}(?:{comma}{inner})*)?" + ca)
        pair = F.STRING + colon + inner
        alts.append(oo + f"(?:{pair}(?:{comma}{pair})*)?" + co)
    return regex_to_dfa("(?:" + "|".join(alts) + ")", 1 << 20, atoms=atoms, what="any value")


@functools.lru_cache(maxsize=64)
def any_module(layout: tuple, depth: int) -> Module:
    """Any non-number JSON value nested at most `depth` levels; nested values call any_module(depth - 1).

    Prefix-free; large ones are called rather than copied, and their nested calls pair with `loose`'s.
    """
    from ..rtn.module import mark_value
    from ..rtn.build import regex_to_module

    oo, co, oa, ca, comma, colon = layout
    alts = [F.STRING, F.BOOLEAN, F.NULL]
    atoms = {}
    if depth > 0:
        atoms[ATOM_BASE] = any_module(layout, depth - 1)
        inner = f"(?:{chr(ATOM_BASE)}|{ANY_NUMBER_RE})"
        alts.append(oa + f"(?:{inner}(?:{comma}{inner})*)?" + ca)
        pair = F.STRING + colon + inner
        alts.append(oo + f"(?:{pair}(?:{comma}{pair})*)?" + co)
    return mark_value(regex_to_module("(?:" + "|".join(alts) + ")", 1 << 20, atoms=atoms, what="any value"))


_SLOT = 0xFF  # a byte no JSON text contains: marks where a nested value goes while the automaton is built


@functools.lru_cache(maxsize=16)
def loose_module(layout: tuple) -> Module:
    """Every non-number value the compiler can generate, and more (a superset, for over-approximations).

    Strings, true/false/null, and brackets `{`/`[` holding items (an optional key before each) closed by
    `}`/`]` (not matched by kind), to any depth: nested non-number values are calls of this module itself,
    numbers are inline. Prefix-free and marked universal, so rtn.algebra may pair it with any value callee.
    """
    oo, co, oa, ca, comma, colon = layout
    trans = np.zeros((3, 256), np.int32)
    trans[1, _SLOT] = 2
    slot_dfa = ByteDFA(trans, np.array([False, False, True]), 1)
    inner = f"(?:{chr(ATOM_BASE)}|{ANY_NUMBER_RE})"
    item = f"(?:{F.STRING}(?:{colon}{inner})?|{inner})"
    scalar = "|".join([F.STRING, F.BOOLEAN, F.NULL])
    d = regex_to_dfa(f"(?:{scalar}|(?:{oo}|{oa})(?:{item}(?:{comma}{item})*)?(?:{co}|{ca}))", 1 << 20,
                     atoms={ATOM_BASE: slot_dfa}, what="the universe of JSON values")
    t = d.trans.copy()
    starts = [b for b in range(256) if b != _SLOT and d.trans[d.initial, b] != DEAD]
    entries: list[Entry] = []
    for q in np.flatnonzero(d.trans[:, _SLOT] != DEAD).tolist():
        ret = int(d.trans[q, _SLOT])
        for b in starts:
            if t[q, b] != DEAD:  # an item may start with a key: strings are read inline there
                if b != ord('"'):
                    raise AssertionError("loose_module: a value slot overlaps another transition")
                continue
            entries.append((b, ret))
            t[q, b] = -len(entries)
    t[:, _SLOT] = DEAD
    mod = Module(t, d.accepting, d.initial, universal=True, value=True)
    # the calls land in this very module (right after the value's first byte)
    object.__setattr__(mod, "entries", tuple(Entry(mod, int(d.trans[d.initial, b]), ret) for b, ret in entries))
    return mod

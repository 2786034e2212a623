"""Recursive positions as modules that call themselves, instead of copies unrolled level by level.

When `under` meets an instance position whose subschemas are already being built further up (a definition
reached again through its own properties or items), it returns a *pending* module standing for that outer
position's language. Once the outer position is built, the pending module takes its automaton, so the
inner occurrence calls the outer one and nesting is bounded only by the generation's own length. Any
language `under` builds for a list of subschemas is valid wherever those subschemas apply, so using the
outer position's language at the inner one is sound (the automaton accepts the least fixpoint: finite
documents whose every part is valid).

A pending module knows only its first bytes (from the position's types and enum): reading it, a byte lands
in a state that leads nowhere but through POISON. A build that can call it (the module alone after that
byte: a property value, an array item) is exact; a build that has to step through it (an alternation of
branches starting with the same byte) carries a POISON cell into its result, which `check` turns into
`Unresolved`: the outer position is then built again with its recursion unrolled (`max_recursion_depth`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import numpy as np

from ..regex.dfa import DEAD
from ..regex.nfa import ATOM_BASE, OptionalSlots
from ..rtn.module import CALL_MIN, Module, mark_value, refine_classes
from .normal import TYPES

POISON = 0xFF  # a byte no UTF-8 JSON text holds
_FIRST = {"object": b"{", "array": b"[", "string": b'"', "integer": b"-0123456789", "number": b"-0123456789",
          "boolean": b"tf", "null": b"n"}
_CACHES = ("sub_cache", "module_cache", "combine_cache", "dfa_cache", "flat_cache")


class Unresolved(Exception):
    """A pending module could not stand for its position (`keys`: the positions to build unrolled instead)."""

    def __init__(self, keys: frozenset, first: bytes | None = None):
        super().__init__("recursive position needs unrolling")
        self.keys, self.first = keys, first


@dataclass
class Frame:
    """One position being built: its order of entry, the caches' sizes then, its pending module if recursed."""

    order: int
    marks: dict
    norm: object  # the position's normal form
    first: bytes | None = None  # first bytes its pending module announces (None: from the normal form)
    pending: Module | None = None
    atom: str = ""


def first_bytes(conv, norm, depth: int = 0) -> bytes:
    """The bytes a value under `norm` can start with (from its types, enum and anyOf / oneOf branches; a superset)."""
    if norm.enum is not None:
        out = {json.dumps(v, ensure_ascii=False).encode()[0] for v in norm.enum}
    else:
        types = TYPES if norm.types is None else [t for t in TYPES if t in norm.types]
        out = {b for t in types for b in _FIRST[t]}
    for kind, payload in norm.apps if depth < 4 else ():
        if kind in ("anyOf", "oneOf"):
            out &= {b for sub in payload for b in first_bytes(conv, conv.norm([sub]), depth + 1)}
    return bytes(sorted(out))


def pending_module(first: bytes) -> Module:
    """A callable module reading one of `first`, then only POISON (see the module docstring)."""
    n = max(CALL_MIN, len(first) + 3)
    trans = np.zeros((n, 256), np.int32)
    acc = np.zeros(n, bool)
    z = len(first) + 2  # accepting after POISON
    acc[z] = True
    for i, b in enumerate(first):
        trans[1, b] = 2 + i
        trans[2 + i, POISON] = z
    return Module(trans, acc, 1)


def resolve(conv, frame: Frame, key, m: Module | None) -> None:
    """Give the pending module of `frame` the automaton `m` of its position's language (None: empty)."""
    p = frame.pending
    if m is None:
        raise Unresolved(frozenset([key]))
    first = bytes(np.flatnonzero(m.trans[m.initial] != DEAD).tolist())
    if not m.prefix_free:
        raise Unresolved(frozenset([key]))
    announced = bytes(np.flatnonzero(p.trans[1] != DEAD).tolist())
    after = [int(m.trans[m.initial, b]) for b in announced]
    if any(t <= DEAD for t in after):  # an announced byte m rejects, or m calls on its first byte
        raise Unresolved(frozenset([key]), first if all(t >= DEAD for t in after) else None)
    # layout: DEAD, initial, one state per announced byte (the callers land there), then m's own states
    h = 2 + len(announced)
    mt = m.trans.astype(np.int64)
    shifted = np.where(mt > 0, mt + h - 1, mt)
    rows = [np.zeros(256, np.int64), shifted[m.initial]] + [shifted[t] for t in after]
    trans = np.concatenate([np.stack(rows), shifted[1:]])
    for i, b in enumerate(announced):
        trans[1, b] = 2 + i
    acc = np.concatenate([[False, bool(m.accepting[m.initial])], m.accepting[after], m.accepting[1:]])
    entries = tuple(type(e)(e.callee, e.at, e.ret + h - 1) for e in m.entries)
    for name, value in (("trans", trans.astype(np.int32)), ("accepting", acc), ("initial", 1), ("entries", entries),
                        ("classes", m.classes)):
        object.__setattr__(p, name, value)
    p.__post_init__()  # has_exit, prefix_free
    if m.value:
        mark_value(p)
    _refine_callers(conv, p)


def _refine_callers(conv, p: Module) -> None:
    """Modules that reach `p` were built with its provisional byte classes: refine theirs with its final ones."""
    mods = {id(m): m for m in _known_modules(conv)}
    mods[id(p)] = p
    callers: dict[int, list[Module]] = {}
    for m in mods.values():
        for e in m.entries:
            callers.setdefault(id(e.callee), []).append(m)
    seen, stack = set(), [p]
    while stack:
        m = stack.pop()
        for c in callers.get(id(m), ()):
            if id(c) not in seen:
                seen.add(id(c))
                stack.append(c)
    for c in [mods[i] for i in seen if i != id(p)]:
        object.__setattr__(c, "classes", refine_classes([c.classes, p.classes])[0])


def _known_modules(conv) -> list[Module]:
    out = [m for m in conv.module_cache.values() if isinstance(m, Module)]
    out += [m for m in conv.atoms.values() if isinstance(m, Module)]
    return out


def check(conv, mod: Module, texts: tuple) -> Module:
    """Raise Unresolved when `mod` stepped through a pending module (it holds a POISON cell)."""
    if not conv.pending or not (mod.trans[:, POISON] != DEAD).any():
        return mod
    reach = _reached(conv, texts)
    pending = {k: f for k, f in conv.frames.items() if f.pending is not None}
    raise Unresolved(frozenset(k for k, f in pending.items() if id(f.pending) in reach) or frozenset(pending))


def _reached(conv, texts: tuple) -> set:
    """Ids of the modules the atoms in `texts` reach."""
    seen_atoms, ids, stack = set(), set(), list(texts)
    while stack:
        text = stack.pop()
        for ch in {c for c in text if ord(c) >= ATOM_BASE}:
            if ch in seen_atoms:
                continue
            seen_atoms.add(ch)
            obj = conv.atoms.get(ord(ch))
            if isinstance(obj, OptionalSlots):
                stack += obj.slots + [obj.sep] + [t for t in (obj.tail_some, obj.tail_none) if t]
            elif isinstance(obj, Module):
                ids.update(id(m) for m in obj.modules())
    return ids


def marks(conv) -> dict:
    """The converter's cache sizes (their keys are kept in insertion order)."""
    return {name: len(getattr(conv, name)) for name in _CACHES}


def rollback(conv, saved: dict) -> None:
    """Forget what was cached since `saved` (it may hold pending modules that will not be resolved)."""
    for name, n in saved.items():
        cache = getattr(conv, name)
        for k in list(cache)[n:]:
            del cache[k]

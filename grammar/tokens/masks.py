"""Lazy token masks of a byte automaton (a module network or a plain DFA): one state's row on its first visit.

A token read from state g either stays in g's frame (it may call other modules and return from them inside
the token, or end exactly where g's module returns): those tokens are g's mask, the same whatever called g's
module. A token that goes on after g's module returned depends on the caller: those few (`"},`, `}]`, ...)
are listed per state as (token, bytes read inside the frame), and the guide checks them against the actual
stack. Nothing is indexed at compile time: a `MaskTable` computes the row of a state when a generation first
reaches it (the token trie walked through the automaton in native code by the TokenizerInfo's walker, which the
runtime passes in from kernels/trie_walk.py, or by the numpy reference below) and keeps it for every later request of the same grammar.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..regex.dfa import DEAD
from .index import _csr_expand
from .vocab import TokenizerInfo

_MAX_ROWS = 1 << 16  # rows kept per grammar (a grammar visited further starts its memo again: bounded memory)
_STRING_BYTES = [b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)]
# UTF-8 sequences of one character: lead byte range, then the continuation byte ranges (RFC 3629)
_UTF8 = [((0xC2, 0xDF), [(0x80, 0xBF)]), ((0xE0, 0xE0), [(0xA0, 0xBF), (0x80, 0xBF)]),
         ((0xE1, 0xEC), [(0x80, 0xBF)] * 2), ((0xED, 0xED), [(0x80, 0x9F), (0x80, 0xBF)]),
         ((0xEE, 0xEF), [(0x80, 0xBF)] * 2), ((0xF0, 0xF0), [(0x90, 0xBF)] + [(0x80, 0xBF)] * 2),
         ((0xF1, 0xF3), [(0x80, 0xBF)] * 3), ((0xF4, 0xF4), [(0x80, 0x8F)] + [(0x80, 0xBF)] * 2)]


@dataclass(frozen=True, eq=False)
class WalkTables:
    """What a token walk reads: trans[state, class_of[byte]] is DEAD, a state (> 0) or a call -(entry + 1) that
    pushes rets[entry] and lands in ats[entry]; pop[state]: a called module accepts there and returns at once."""

    trans: np.ndarray  # [states, classes] int32
    class_of: np.ndarray  # [256] int32
    pop: np.ndarray  # [states] uint8
    rets: np.ndarray  # [entries] int32
    ats: np.ndarray  # [entries] int32
    final: np.ndarray  # [states] bool: the document may end here (EOS allowed)

    @property
    def num_states(self) -> int:
        return self.trans.shape[0]

    @classmethod
    def of_program(cls, prog) -> "WalkTables":
        """Tables of a module network (grammar/rtn/program.py)."""
        final = prog.accepting & (prog.module_of == 0)
        final[DEAD] = False
        return cls(np.ascontiguousarray(prog.trans, np.int32), np.ascontiguousarray(prog.class_of, np.int32),
                   prog.pop.astype(np.uint8), np.ascontiguousarray(prog.rets, np.int32),
                   np.ascontiguousarray(prog.ats, np.int32), final)

    @classmethod
    def of_dfa(cls, dfa) -> "WalkTables":
        """Tables of a plain byte DFA (no calls, no returns)."""
        final = dfa.accepting.copy()
        final[DEAD] = False
        empty = np.zeros(0, np.int32)
        return cls(np.ascontiguousarray(dfa.trans, np.int32), np.arange(256, dtype=np.int32),
                   np.zeros(dfa.num_states, np.uint8), empty, empty, final)


@dataclass(frozen=True)
class StateRow:
    """One state's row: packed mask (EOS included if final) and the tokens that leave its frame."""

    mask: np.ndarray  # [words] int32, read-only
    has_token: bool  # some non-EOS token stays inside the frame
    cross_tok: np.ndarray  # [n] int32
    cross_off: np.ndarray  # [n] int32: bytes of the token read inside the frame


def _string_classes(class_of: np.ndarray) -> tuple[list, list]:
    """(classes of the ASCII string characters, per UTF-8 form the classes at each of its byte positions)."""
    cls = class_of.tolist()

    def classes(lo: int, hi: int) -> list:
        return sorted(set(cls[lo: hi + 1]))

    forms = [[classes(lo, hi)] + [classes(a, b) for a, b in conts] for (lo, hi), conts in _UTF8]
    return sorted({cls[b] for b in _STRING_BYTES}), forms


def is_string_loop(tables: WalkTables, g: int, classes: tuple[list, list]) -> bool:
    """Every character of `[^"\\\x00-\x1f]` leads from g back to g without a call (g is inside a free string)."""
    row = tables.trans[g]
    ascii_cls, forms = classes
    if not (row[ascii_cls] == g).all():
        return False
    t = tables.trans
    for form in forms:
        cur = {g}
        for cls in form:  # the set of states every path of this form can reach: all of them must come back to g
            cur = {int(x) for s in cur for x in t[s, cls].tolist()}
            if any(x <= 0 for x in cur):
                return False
        if cur != {g}:
            return False
    return True


def eos_bits(info: TokenizerInfo) -> np.ndarray:
    """Packed uint32 mask of the EOS tokens."""
    eos = np.array(info.eos_token_ids, dtype=np.int64)
    bits = np.zeros(info.mask_words, np.uint32)
    np.bitwise_or.at(bits, eos >> 5, np.uint32(1) << (eos & 31).astype(np.uint32))
    return bits


def native_walker(info: TokenizerInfo):
    """The TokenizerInfo's native walker when it loads (kernels/trie_walk.py, passed in by the runtime), else None."""
    w = info.walker
    return w if w is not None and w.ready() else None


class MaskTable:
    """Rows of the states that generations reach, each computed on first visit and kept for every request of the
    grammar. Thread-safe without a lock: a row is an immutable value and `dict.setdefault` is atomic, so two threads
    that meet a new state at once compute the same row and keep one. Pickles with the rows computed so far."""

    def __init__(self, tables: WalkTables, info: TokenizerInfo, native: bool | None = None):
        """native: None = the TokenizerInfo's native walker where it loads, else the numpy reference; True = native
        or ValueError; False = the numpy reference."""
        self.tables, self.info = tables, info
        self._native = native
        self._setup()

    def _setup(self) -> None:
        self._rows: dict[int, StateRow] = getattr(self, "_rows", {})
        self._masks: dict[bytes, np.ndarray] = {}  # identical masks stored once
        for r in self._rows.values():
            self._masks.setdefault(r.mask.tobytes(), r.mask)
        self._classes = None  # the string-loop test's byte classes, on the first row
        self._eos = eos_bits(self.info)

    def __getstate__(self):
        return {"tables": self.tables, "info": self.info, "_native": self._native, "_rows": dict(self._rows)}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._setup()

    def __len__(self) -> int:
        return len(self._rows)

    @property
    def native(self) -> bool | None:
        """What the table was asked to walk with (None: native where it loads)."""
        return self._native

    def row(self, g: int) -> StateRow:
        """The row of state g (computed now if no request reached g before)."""
        r = self._rows.get(g)
        if r is None:
            if len(self._rows) >= _MAX_ROWS:
                self._rows, self._masks = {}, {}
            r = self._rows.setdefault(g, self._compute(g))
        return r

    def _compute(self, g: int) -> StateRow:
        info, tables = self.info, self.tables
        if self._classes is None:
            self._classes = _string_classes(tables.class_of)
        loop = is_string_loop(tables, g, self._classes)
        walker = native_walker(info) if self._native is not False else None
        if walker is None and self._native:
            raise ValueError("the native trie walk is not available (TokenizerInfo.walker)")
        if walker is not None:
            trie = info.string_slice_flat if loop else info.flat_trie
            mask, ct, co = walker.walk(trie, tables, g, info.mask_words)
        else:
            mask, ct, co = walk_state_reference(tables, info, g, loop)
        if loop:
            mask |= info.string_slice[0].view(np.uint32)
        has = bool(mask.any())
        if tables.final[g]:
            mask |= self._eos
        mask = mask.view(np.int32)
        mask = self._masks.setdefault(mask.tobytes(), mask)
        mask.setflags(write=False)
        return StateRow(mask, has, ct, co)


def walk_state_reference(tables: WalkTables, info: TokenizerInfo, g: int, loop: bool = False):
    """The numpy reference of kernels/trie_walk.py: (uint32 mask without EOS, int32 crossing token ids, int32 offsets);
    loop=True walks only the tokens that are not whole string characters (the caller ORs in the others)."""
    trie = info.string_slice[1] if loop else info.trie
    m, (_, ct, co) = _walk(tables, info, np.array([g], np.int64), trie)
    return m[0], ct.astype(np.int32), co.astype(np.int32)


def _subtree_tokens(trie, depth: int, nodes: np.ndarray, owners: np.ndarray):
    """(owner, token) for every token strictly below each trie node (nodes at `depth`)."""
    out_o, out_t = [], []
    lo, hi, own = nodes, nodes + 1, owners
    d = depth
    while len(lo) and d < trie.depth:
        cs, cc = trie.child_start[d], trie.child_count[d]
        nlo = cs[lo]
        nhi = cs[hi - 1] + cc[hi - 1]
        keep = nhi > nlo
        lo, hi, own = nlo[keep], nhi[keep], own[keep]
        d += 1
        if not len(lo):
            break
        ts, tc = trie.tok_start[d], trie.tok_count[d]
        a = ts[lo]
        b = ts[hi - 1] + tc[hi - 1]
        o, k = _csr_expand(b - a)
        if len(o):
            out_o.append(own[o])
            out_t.append(trie.tok_ids[d][a[o] + k])
    if not out_o:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(out_o), np.concatenate(out_t)


def _walk(tables: WalkTables, info: TokenizerInfo, states: np.ndarray, trie):
    """Inner masks [len(states), words] and the crossing tokens (row, token, bytes inside) of the given states,
    over the tokens of `trie` (a level-by-level grammar.tokens.vocab.TokenTrie), all states at once per trie level."""
    flat = tables.trans
    cls = tables.class_of.astype(np.int64)
    pop = tables.pop.astype(bool)
    rets, ats = tables.rets.astype(np.int64), tables.ats.astype(np.int64)
    words = info.mask_words
    masks = np.zeros((len(states), words), dtype=np.uint32)
    cross_k, cross_t, cross_o = [], [], []
    g_count = np.int64(tables.num_states)
    st = states
    allowed = np.zeros((len(st), words * 32), dtype=bool)
    parent, ret = [0], [0]  # local stacks: node 0 = empty (the start frame itself)
    ids: dict[int, int] = {}
    k_idx = np.repeat(np.arange(len(st)), len(trie.byte[1]))
    node = np.tile(np.arange(len(trie.byte[1])), len(st))
    cur = np.repeat(st, len(trie.byte[1]))
    stk = np.zeros(len(k_idx), np.int64)
    byte = trie.byte[1][node]
    d = 1
    while len(k_idx):
        t = flat[cur, cls[byte]].astype(np.int64)
        calls = t < 0
        if calls.any():  # push the caller's return state, land in the callee
            e = -t[calls] - 1
            keys = stk[calls] * g_count + rets[e]
            uk, inv = np.unique(keys, return_inverse=True)
            new_ids = np.empty(len(uk), np.int64)
            for i, key in enumerate(uk.tolist()):
                got = ids.get(key)
                if got is None:
                    got = ids[key] = len(parent)
                    parent.append(key // int(g_count))
                    ret.append(key % int(g_count))
                new_ids[i] = got
            stk[calls] = new_ids[inv.reshape(-1)]
            t[calls] = ats[e]
        alive = t != DEAD
        k_idx, node, t, stk = k_idx[alive], node[alive], t[alive], stk[alive]
        exited = np.zeros(len(k_idx), bool)
        par, rt = np.array(parent, np.int64), np.array(ret, np.int64)
        popping = pop[t]
        while popping.any():  # the callee accepted: it returns (nested calls may end together)
            top = popping & (stk == 0)
            exited |= top
            inner = popping & ~top
            t[inner] = rt[stk[inner]]
            stk[inner] = par[stk[inner]]
            popping = inner & pop[t]
        tc = trie.tok_count[d][node]
        has = tc > 0
        if has.any():
            owner, off = _csr_expand(tc[has])
            toks = trie.tok_ids[d][trie.tok_start[d][node[has]][owner] + off]
            allowed[k_idx[has][owner], toks] = True
        if exited.any():  # the start frame returned: longer tokens go on in the caller
            o, tk = _subtree_tokens(trie, d, node[exited], k_idx[exited])
            if len(o):
                cross_k.append(o)
                cross_t.append(tk)
                cross_o.append(np.full(len(o), d, np.int64))
            keep = ~exited
            k_idx, node, t, stk = k_idx[keep], node[keep], t[keep], stk[keep]
        if d == trie.depth:
            break
        cnt = trie.child_count[d][node]
        owner, off = _csr_expand(cnt)
        child = trie.child_start[d][node][owner] + off
        k_idx, node, cur, stk = k_idx[owner], child, t[owner], stk[owner]
        byte = trie.byte[d + 1][node]
        d += 1
    masks[:] = np.packbits(allowed, axis=1, bitorder="little").view("<u4")
    if cross_k:
        cross = (np.concatenate(cross_k), np.concatenate(cross_t), np.concatenate(cross_o))
    else:
        cross = (np.zeros(0, np.int64),) * 3
    return masks, cross


def vocabulary_check(tables: WalkTables, info: TokenizerInfo) -> np.ndarray:
    """Live, non-final, non-returning states in which no usable token can even start (every byte they accept
    starts no token): empty unless the vocabulary lacks bytes. Cheap; the exact test needs the walks."""
    starts = info.first_byte_masks.any(axis=1)
    if starts.all():
        return np.zeros(0, np.int64)
    class_ok = np.zeros(tables.trans.shape[1], bool)
    np.logical_or.at(class_ok, tables.class_of, starts)
    live = tables.trans != DEAD
    stuck = ~(live & class_ok).any(axis=1) & ~tables.final & ~tables.pop.astype(bool)
    stuck[DEAD] = False
    return np.flatnonzero(stuck)

"""Lazy token masks of a byte automaton (a module network or a plain DFA): one state's row on its first visit.

A token read from state g either stays in g's frame (it may call other modules and return from them inside
the token, or end exactly where g's module returns): those tokens are g's mask, the same whatever called g's
module. A token that goes on after g's module returned depends on the caller: those few (`"},`, `}]`, ...)
are listed per state as (token, bytes read inside the frame), and the guide checks them against the actual
stack. Nothing is indexed at compile time: a `MaskTable` computes the row of a state when a generation first
reaches it and keeps it for every later request of the same grammar. The row is the token trie walked through
the automaton, in native code by the TokenizerInfo's walker (the runtime passes one in from kernels/trie_walk.py)
or by the numpy reference below; inside JSON strings, the short ASCII string tokens come from the chain of states
the string's characters lead through (no walk), so dense string states walk only the other ~2% of the vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..regex.dfa import DEAD
from .index import _csr_expand
from .vocab import STRING_CHARS, TokenizerInfo

_MAX_ROWS = 1 << 16  # rows kept per grammar (a grammar visited further starts its memo again: bounded memory)
_STRING_BYTES = [b for b in range(0x20, 0x80) if b not in (0x22, 0x5C)]


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


def _string_classes(class_of: np.ndarray) -> list:
    """The byte classes of the ASCII string characters."""
    cls = class_of.tolist()
    return sorted({cls[b] for b in _STRING_BYTES})


def string_steps(tables: WalkTables, states: np.ndarray, ascii_cls: list) -> np.ndarray:
    """Per state, the one state that every ASCII string character (0x20-0x7f but `"` and backslash) leads it to,
    DEAD when every such character dies, -1 otherwise (they go to different places, into a call, or return)."""
    nxt = tables.trans[states][:, ascii_cls].astype(np.int64)
    one = nxt[:, 0]
    ok = (nxt == one[:, None]).all(axis=1) & (one >= 0)
    ok &= ~tables.pop[np.maximum(one, 0)].astype(bool)
    return np.where(ok, one, -1)


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
        self._classes = None  # the string test's byte classes, on the first row
        self._step: dict[int, int] = {}  # string_step of the states met (chains are followed through it)
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

    def _chars(self, g: int) -> int | None:
        """j when every ASCII string character leads from g through a chain of j states and then dies (j < k), or
        through k states (j = k = STRING_CHARS): the tokens of row j of `TokenizerInfo.string_tokens` are allowed
        and the others of row k are not. None when some character goes elsewhere (every token is walked)."""
        if self._classes is None:
            self._classes = _string_classes(self.tables.class_of)
        step, t, a = self._step, self.tables.trans, self._classes[0]
        chain, s = [], g  # the candidate chain, by the first ASCII class; its steps are checked together
        while len(chain) <= STRING_CHARS and s > 0 and s not in step:
            chain.append(s)
            s = int(t[s, a])
        if chain:
            for c, nxt in zip(chain, string_steps(self.tables, np.array(chain, np.int64), self._classes).tolist()):
                step[c] = nxt
        j, s = 0, g
        while j < STRING_CHARS:
            nxt = step.get(s)
            if nxt is None:  # (past the candidate chain: only when a memo entry was dropped)
                nxt = step[s] = int(string_steps(self.tables, np.array([s], np.int64), self._classes)[0])
            if nxt < 0:
                return None
            if nxt == DEAD:
                return j
            if nxt == s:  # a loop (free strings): every character stays
                return STRING_CHARS
            j, s = j + 1, nxt
        return STRING_CHARS

    def _compute(self, g: int) -> StateRow:
        info, tables = self.info, self.tables
        chars = self._chars(g)
        walker = native_walker(info) if self._native is not False else None
        if walker is None and self._native:
            raise ValueError("the native trie walk is not available (TokenizerInfo.walker)")
        if walker is not None:  # whole-character tokens are known from the chain: only the others are walked
            trie = info.string_rest if chars is not None else info.flat_trie
            mask, ct, co = walker.walk(trie, tables, g, info.mask_words)
        else:
            mask, ct, co = walk_state_reference(tables, info, g, chars is not None)
        if chars is not None:
            mask |= info.string_tokens[0][chars]
        has = bool(mask.any())
        if tables.final[g]:
            mask |= self._eos
        mask = mask.view(np.int32)
        mask = self._masks.setdefault(mask.tobytes(), mask)
        mask.setflags(write=False)
        return StateRow(mask, has, ct, co)


def walk_state_reference(tables: WalkTables, info: TokenizerInfo, g: int, rest: bool = False):
    """The numpy reference of kernels/trie_walk.py: (uint32 mask without EOS, int32 crossing token ids, int32 offsets);
    rest=True walks only the tokens that are not whole string characters (the caller adds the others)."""
    trie = info.string_rest_levels if rest else info.trie
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
    if trie.depth == 0:  # no tokens to walk
        return masks, (np.zeros(0, np.int64),) * 3
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

"""Context-free grammars (lark EBNF): an LALR(1) parse table driven byte by byte, masks via terminal indexes."""

from __future__ import annotations

import bisect
import re
import threading
from typing import Hashable

import numpy as np

from ..regex import DEAD, ByteDFA, regex_to_dfa
from .imports import bundled_loader
from ..errors import GrammarError
from ..guide import Guide
from ..tokens.index import build_index
from ..tokens.vocab import TokenizerInfo

TERMINATED = ("$terminated",)
_MAX_FORCED = 4096
_CACHE_LIMIT = 20_000

# State: (stack, lex). stack = tuple of LALR states; lex = tuple of (terminal index, DFA state) for the
# terminals still matching the current lexeme, () at a lexeme boundary. Lexing is greedy (maximal munch).
State = tuple


def _case_insensitive(literal: str) -> str:
    return "".join(f"[{c.lower()}{c.upper()}]" if c.lower() != c.upper() else re.escape(c) for c in literal)


class _Terminal:
    """One grammar terminal: its byte DFA, token index, live-byte table and mid-token break candidates."""

    def __init__(self, term, info: TokenizerInfo, max_states: int, budget=None):
        self.name = term.name
        pat = term.pattern
        self.is_str = pat.type == "str"
        self.priority = term.priority
        flags = set(pat.flags)
        if self.is_str:
            regex = _case_insensitive(pat.value) if "i" in flags else re.escape(pat.value)
        else:
            if flags - {"s", "x", "u"}:
                raise GrammarError(f"terminal {term.name}: regex flags {sorted(flags)} are not supported")
            regex = pat.to_regexp()
        try:
            self.dfa: ByteDFA = regex_to_dfa(regex, max_states, budget=budget, what=f"terminal {term.name}",
                                               lookahead=False)
        except GrammarError as e:
            raise GrammarError(f"terminal {term.name}: {e}") from None
        if self.dfa.accepting[self.dfa.initial]:
            raise GrammarError(f"terminal {term.name} matches the empty string")
        self.trans = self.dfa.trans.tolist()
        self.accepting = self.dfa.accepting.tolist()
        self.live = self.dfa.trans != DEAD  # [states, 256]
        idx = build_index(self.dfa, info, with_eos=False, budget=budget)
        self.inside = idx.masks.view(np.uint32)[idx.mask_of[:-1]]  # [states, words]
        self.breaks = _break_candidates(self.dfa, info)


def _break_candidates(dfa: ByteDFA, info: TokenizerInfo) -> list[list[tuple[bytes, np.ndarray]]]:
    """Per DFA state: tokens that complete the terminal strictly inside themselves and then continue.

    Grouped by the prefix up to and including the first byte after the break, so that one walk of the
    prefix can reject a whole group (e.g. every " word" token after the terminal ", ").
    """
    trie = info.trie
    toks, ids = info.sorted_tokens
    n = dfa.num_states
    full, acc = dfa.trans, dfa.accepting
    found: list[list] = [[] for _ in range(n)]
    st = np.arange(1, n, dtype=np.int64)
    if len(st) == 0:
        return [[] for _ in range(n)]
    nxt = full[st][:, trie.byte[1]]
    k_idx, node = np.nonzero(nxt != DEAD)
    cur = nxt[k_idx, node]
    d = 1
    while len(k_idx) and d < trie.depth:
        cnt = trie.child_count[d][node]
        owner = np.repeat(np.arange(len(node)), cnt)
        off = np.arange(int(cnt.sum())) - (np.cumsum(cnt) - cnt)[owner]
        child = trie.child_start[d][node][owner] + off
        ns = full[cur[owner], trie.byte[d + 1][child]]
        brk = (ns == DEAD) & acc[cur[owner]]
        for k, c in zip(k_idx[owner][brk].tolist(), child[brk].tolist()):
            prefix = trie.nodes[d + 1][c]
            lo = bisect.bisect_left(toks, prefix)
            hi = lo
            while hi < len(toks) and toks[hi].startswith(prefix):
                hi += 1
            found[int(st[k])].append((prefix, ids[lo:hi]))
        alive = ns != DEAD
        k_idx, node, cur = k_idx[owner][alive], child[alive], ns[alive]
        d += 1
    return found


class EBNFGuide(Guide):
    """Guide for a lark grammar (LALR(1)); states are immutable tuples, masks cached per state."""

    def __init__(self, grammar: str, info: TokenizerInfo, start: str = "start", max_states: int = 20_000,
                 budget=None):
        try:
            from lark import Lark
            from lark.exceptions import LarkError
        except ImportError as e:  # pragma: no cover
            raise GrammarError("EBNF constraints need the `lark` package") from e
        try:
            lk = Lark(grammar, parser="lalr", start=start, import_paths=[bundled_loader])  # never the filesystem
        except LarkError as e:
            raise GrammarError(f"invalid EBNF grammar: {str(e).strip()[:400]}") from None
        self.info, self.source = info, grammar
        table = lk.parser.parser.parser.parse_table
        self._end_state = table.end_states[start]
        self._actions: dict[int, dict[str, tuple]] = {}
        for s, acts in table.states.items():
            row = {}
            for name, (action, arg) in acts.items():
                if action.name == "Shift":
                    row[name] = (True, arg, 0)
                else:
                    row[name] = (False, arg.origin.name, len(arg.expansion))
            self._actions[s] = row
        self._ignore = set(lk.ignore_tokens)
        self._terms = [_Terminal(t, info, max_states, budget) for t in lk.terminals]
        self._fb = info.first_byte_masks
        self._eos_bits = np.zeros(info.mask_words, np.uint32)
        for e in info.eos_token_ids:
            self._eos_bits[e >> 5] |= np.uint32(1 << (e & 31))
        self._eos = frozenset(info.eos_token_ids)
        self._feed_cache: dict = {}
        self._lex_cache: dict = {}
        self._mask_cache: dict = {}
        self._forced_cache: dict = {}
        self._lock = threading.Lock()
        self.initial_state: State = ((table.start_states[start],), ())
        if not self._next_bytes(self.initial_state).any() and not self._accepts_end(self.initial_state):
            raise GrammarError("EBNF grammar: no terminal can start the input")

    def __repr__(self) -> str:
        return f"EBNFGuide(terminals={len(getattr(self, '_terms', ()))}, source={self.source[:40]!r})"

    # ---- parser ------------------------------------------------------------------------------------
    def _feed(self, stack: tuple, name: str) -> tuple | None:
        """LALR step on one terminal (reductions included); None = syntax error."""
        key = (stack, name)
        hit = self._feed_cache.get(key, False)
        if hit is not False:
            return hit
        res = None
        st = stack
        while True:
            act = self._actions[st[-1]].get(name)
            if act is None:
                break
            shift, arg, n = act
            if shift:
                res = st + (arg,)
                break
            st = st[: len(st) - n] if n else st
            goto = self._actions[st[-1]].get(arg)
            if goto is None:
                break
            st = st + (goto[1],)
            if name == "$END" and st[-1] == self._end_state:
                res = st
                break
        if len(self._feed_cache) > _CACHE_LIMIT:
            self._feed_cache.clear()
        self._feed_cache[key] = res
        return res

    def _initial_lex(self, stack: tuple) -> tuple:
        got = self._lex_cache.get(stack)
        if got is None:
            lex = [(i, t.dfa.initial) for i, t in enumerate(self._terms)
                   if t.name in self._ignore or self._feed(stack, t.name) is not None]
            got = tuple(lex)
            if len(self._lex_cache) > _CACHE_LIMIT:
                self._lex_cache.clear()
            self._lex_cache[stack] = got
        return got

    def _end_lexeme(self, stack: tuple, lex: tuple) -> tuple | None:
        """Parser stack after the current lexeme ends here (None: it cannot end here)."""
        best = None
        for i, d in lex:
            t = self._terms[i]
            if t.accepting[d]:
                rank = (t.is_str, t.priority, -i)
                if best is None or rank > best[0]:
                    best = (rank, t)
        if best is None:
            return None
        t = best[1]
        return stack if t.name in self._ignore else self._feed(stack, t.name)

    def _step(self, state: State, b: int) -> State | None:
        stack, lex = state
        lex0 = lex or self._initial_lex(stack)
        ext = []
        for i, d in lex0:
            nd = self._terms[i].trans[d][b]
            if nd != DEAD:
                ext.append((i, nd))
        if ext:
            return (stack, tuple(ext))
        if not lex:
            return None
        stack2 = self._end_lexeme(stack, lex)
        if stack2 is None:
            return None
        return self._step((stack2, ()), b)

    def _walk(self, state: State, data: bytes) -> State | None:
        for b in data:
            state = self._step(state, b)
            if state is None:
                return None
        return state

    def _accepts_end(self, state: State) -> bool:
        stack, lex = state
        if lex:
            stack = self._end_lexeme(stack, lex)
            if stack is None:
                return False
        return self._feed(stack, "$END") is not None

    def _next_bytes(self, state: State) -> np.ndarray:
        stack, lex = state
        lex0 = lex or self._initial_lex(stack)
        live = np.zeros(256, bool)
        for i, d in lex0:
            live |= self._terms[i].live[d]
        if lex:
            stack2 = self._end_lexeme(stack, lex)
            if stack2 is not None:
                live |= self._next_bytes((stack2, ()))
        return live

    # ---- masks -------------------------------------------------------------------------------------
    def _mask(self, state: State) -> np.ndarray:
        got = self._mask_cache.get(state)
        if got is not None:
            return got
        stack, lex = state
        lex0 = lex or self._initial_lex(stack)
        m = np.zeros(self.info.mask_words, np.uint32)
        for i, d in lex0:
            m |= self._terms[i].inside[d]
        if lex:
            stack2 = self._end_lexeme(stack, lex)
            if stack2 is not None:
                dead = np.ones(256, bool)
                for i, d in lex:
                    dead &= ~self._terms[i].live[d]
                if dead.any():
                    m |= self._mask((stack2, ())).view(np.uint32) & np.bitwise_or.reduce(self._fb[dead], axis=0)
        tb = self.info.token_bytes
        for i, d in lex0:
            for prefix, group in self._terms[i].breaks[d]:
                sp = self._walk(state, prefix)
                if sp is None:
                    continue
                n = len(prefix)
                for t in group.tolist():
                    if not (m[t >> 5] >> (t & 31)) & 1 and self._walk(sp, tb[t][n:]) is not None:
                        m[t >> 5] |= np.uint32(1 << (t & 31))
        if self._accepts_end(state):
            m |= self._eos_bits
        m = m.view(np.int32)
        m.setflags(write=False)
        with self._lock:
            if len(self._mask_cache) > _CACHE_LIMIT:
                self._mask_cache.clear()
            self._mask_cache[state] = m
        return m

    # ---- Guide interface ---------------------------------------------------------------------------
    def _check(self, state) -> State:
        if state == TERMINATED:
            return state
        if not (isinstance(state, tuple) and len(state) == 2 and isinstance(state[0], tuple) and state[0]):
            raise ValueError(f"invalid EBNF guide state {state!r}")
        return state

    def allowed(self, state) -> np.ndarray:
        if self._check(state) == TERMINATED:
            return self._eos_bits.view(np.int32)
        return self._mask(state)

    def advance(self, state, token_id: int) -> Hashable:
        state = self._check(state)
        if token_id in self._eos:
            if self.is_final(state):
                return TERMINATED
            raise ValueError(f"EOS token {token_id} not allowed: the grammar is not complete here")
        if state == TERMINATED:
            raise ValueError(f"token {token_id} after EOS: the guide is terminated")
        tb = self.info.token_bytes
        if not 0 <= token_id < len(tb):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(tb)})")
        if not tb[token_id]:
            raise ValueError(f"token {token_id} is special/added/padding/empty: never allowed in a constraint")
        nxt = self._walk(state, tb[token_id])
        if nxt is None:
            raise ValueError(f"token {token_id} ({tb[token_id]!r}) not allowed by the grammar here")
        return nxt

    def advance_bytes(self, state, data: bytes) -> Hashable:
        state = self._check(state)
        if not data:
            return state
        if state == TERMINATED:
            raise ValueError("bytes after EOS: the guide is terminated")
        nxt = self._walk(state, data)
        if nxt is None:
            raise ValueError(f"bytes {data!r} are not allowed by the grammar here")
        return nxt

    def is_final(self, state) -> bool:
        state = self._check(state)
        return state == TERMINATED or self._accepts_end(state)

    def is_terminated(self, state) -> bool:
        return self._check(state) == TERMINATED

    def can_continue(self, state) -> bool:
        if self._check(state) == TERMINATED:
            return False
        m = self._mask(state).view(np.uint32) & ~self._eos_bits
        return bool(m.any())

    def forced_bytes(self, state) -> bytes:
        state = self._check(state)
        if state == TERMINATED:
            return b""
        got = self._forced_cache.get(state)
        if got is not None:
            return got
        start = state
        out = bytearray()
        while len(out) < _MAX_FORCED and not self._accepts_end(state):
            live = np.flatnonzero(self._next_bytes(state))
            if len(live) != 1:
                break
            b = int(live[0])
            nxt = self._step(state, b)
            if nxt is None:
                break
            out.append(b)
            state = nxt
        got = bytes(out)
        with self._lock:
            if len(self._forced_cache) > _CACHE_LIMIT:
                self._forced_cache.clear()
            self._forced_cache[start] = got
        return got

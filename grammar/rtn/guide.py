"""StackGuide: the Guide of a module network; states are stacks (tuples of global state ids, bottom to top)."""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from ..regex.dfa import DEAD
from ..guide import Guide, SchemaInfo
from .module import Module
from .index import ProgramIndex, StateIndex, build_program_index, index_state
from .program import Program
from ..tokens.vocab import TokenizerInfo

_MAX_FORCED = 4096
_MASK_CACHE = 512  # masks of stacks whose crossing tokens were checked (the common case needs no cache)
_LAZY_ROWS = 4096  # rows of lazily indexed states kept per guide (~6 KiB each at 49k tokens)
TERMINATED = (-1,)


class StackGuide(Guide):
    """Masks come from the top state's precomputed row; tokens that leave the top frame are checked against
    the stack below it once per stack (cached), so a step costs a dict lookup in the common case."""

    def __init__(self, root: Module, info: TokenizerInfo, source: str = "", budget=None, schema_info=None,
                 program: Program | None = None, index: ProgramIndex | None = None):
        self.info, self.source, self.schema_info = info, source, schema_info
        self.program = program or Program(root)
        self.index = index or build_program_index(self.program, info, budget)
        self.initial_state: tuple = self.program.initial
        self.num_states = self.program.num_states
        self._init_tables()

    def _init_tables(self) -> None:
        ix, prog = self.index, self.program
        self._masks, self._mask_of = ix.masks, ix.mask_of.tolist()
        self._cross_start = ix.cross_start.tolist()
        self._cross_tok, self._cross_off = ix.cross_tok.tolist(), ix.cross_off.tolist()
        self._final = (prog.accepting & (prog.module_of == 0)).tolist()
        self._has_token = ix.has_token.tolist()
        self._token_bytes = self.info.token_bytes
        self._eos = frozenset(self.info.eos_token_ids)
        live = prog.trans != DEAD  # [states, classes]
        single = np.full(prog.num_states, -1, np.int64)
        counts = live[:, prog.class_of].sum(axis=1)  # live bytes per state
        one = np.flatnonzero((counts == 1) & ~np.array(self._final))
        if len(one):
            single[one] = live[one][:, prog.class_of].argmax(axis=1)
        single[DEAD] = -1
        self._single = single.tolist()
        self._cache: OrderedDict = OrderedDict()
        self._forced: dict = {}
        self._lazy: dict[int, StateIndex] = {}  # rows of states the compile left to their first visit

    def __getstate__(self):
        """Pickle the network and its index; derived tables and caches are rebuilt on load."""
        return {"info": self.info, "source": self.source, "schema_info": self.schema_info,
                "program": self.program, "index": self.index}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self.initial_state = self.program.initial
        self.num_states = self.program.num_states
        self._init_tables()

    def save(self, path: str) -> None:
        """Write the network's tables and the token index to an .npz file (see `load`)."""
        import json

        p, ix = self.program, self.index
        tables = {f"p_{k}": np.asarray(getattr(p, k)) for k in p._TABLES}
        tables.update({f"i_{k}": getattr(ix, k) for k in ProgramIndex.__dataclass_fields__})
        meta = None if self.schema_info is None else list(self.schema_info.__dict__.values())
        np.savez(path, kind=np.array("stack"), source=np.array(self.source), info_key=np.array(self.info.key),
                 schema_info=np.array(json.dumps(meta)), **tables)

    @classmethod
    def load(cls, path: str, info: TokenizerInfo) -> "StackGuide":
        """Read a guide written by `save` for the same tokenizer (ValueError if the tokenizer differs)."""
        import json

        with np.load(path) as z:
            if str(z["info_key"]) != info.key:
                raise ValueError(f"{path}: compiled for another tokenizer")
            prog = Program.__new__(Program)
            state = {k: z[f"p_{k}"] for k in Program._TABLES}
            for k in ("num_states", "num_entries", "num_modules"):
                state[k] = int(state[k])
            state["initial"] = tuple(int(x) for x in state["initial"])
            prog.__setstate__(state)
            fields = {k: z[f"i_{k}"] for k in ProgramIndex.__dataclass_fields__}
            fields["masks"].setflags(write=False)
            meta = json.loads(str(z["schema_info"]))
            g = cls(None, info, str(z["source"]), program=prog, index=ProgramIndex(**fields))
        if meta is not None:
            g.schema_info = SchemaInfo(meta[0], *(tuple(m) for m in meta[1:]))
        return g

    def __repr__(self) -> str:
        lazy = int((self.index.mask_of < 0).sum()) - len(self._lazy)
        return (f"StackGuide(states={self.num_states}, modules={self.program.num_modules}, "
                f"masks={len(self._masks)}, lazy={lazy}, source={self.source[:40]!r})")

    def _check(self, state) -> tuple:
        if not isinstance(state, tuple) or not state or (state != TERMINATED and not all(
                isinstance(g, int) and 0 < g < self.num_states for g in state)):
            raise ValueError(f"invalid guide state {state!r}")
        return state

    def allowed(self, state) -> np.ndarray:
        state = self._check(state)
        if state == TERMINATED:
            return self._eos_mask()
        top = state[-1]
        k = self._mask_of[top]
        if k >= 0:
            lo, hi = self._cross_start[top], self._cross_start[top + 1]
            base = self._masks[k]
            toks, offs = self._cross_tok, self._cross_off
        else:
            row = self._lazy_row(top)
            lo, hi, base, toks, offs = 0, len(row.cross_tok), row.mask, row.cross_tok, row.cross_off
        if lo == hi or len(state) == 1:
            return base
        got = self._cache.get(state)
        if got is not None:
            self._cache.move_to_end(state)
            return got
        extra = [t for t, off in zip(toks[lo:hi], offs[lo:hi]) if self._crosses(state, t, off)]
        if extra:
            got = base.copy()
            ids = np.array(extra, np.int64)
            np.bitwise_or.at(got.view(np.uint32), ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))
            got.setflags(write=False)
        else:
            got = base
        self._cache[state] = got
        if len(self._cache) > _MASK_CACHE:
            self._cache.popitem(last=False)
        return got

    def _lazy_row(self, g: int) -> StateIndex:
        """The row of a state the compile did not index (one trie walk on first visit, then cached)."""
        row = self._lazy.get(g)
        if row is None:
            if len(self._lazy) >= _LAZY_ROWS:
                self._lazy.pop(next(iter(self._lazy)))  # the oldest first (bounded memory in long-lived guides)
            row = self._lazy[g] = index_state(self.program, self.info, self.index, g)
        return row

    def _crosses(self, state: tuple, token: int, off: int) -> bool:
        """Token `token` leaves the top frame after `off` bytes: do the rest fit the frames below?"""
        stack = list(state[:-1])  # the top frame returned: its caller continues at the stored state
        pop = self.program._pop
        while len(stack) > 1 and pop[stack[-1]]:
            stack.pop()
        step = self.program.step
        for b in self._token_bytes[token][off:]:
            if not stack or not step(stack, b):
                return False
        return bool(stack)

    def _eos_mask(self) -> np.ndarray:
        words = self.info.mask_words
        m = np.zeros(words, np.uint32)
        for e in self._eos:
            m[e >> 5] |= np.uint32(1 << (e & 31))
        return m.view(np.int32)

    def advance(self, state, token_id: int):
        state = self._check(state)
        if token_id in self._eos:
            if self.is_final(state):
                return TERMINATED
            raise ValueError(f"EOS token {token_id} not allowed: state {state} is not accepting")
        if state == TERMINATED:
            raise ValueError(f"token {token_id} after EOS: the guide is terminated")
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(self._token_bytes)})")
        data = self._token_bytes[token_id]
        if not data:
            raise ValueError(f"token {token_id} is special/added/padding/empty: never allowed in a constraint")
        out = self.program.walk(state, data)
        if out is None:
            raise ValueError(f"token {token_id} ({data!r}) not allowed in state {state}")
        return out

    def advance_bytes(self, state, data: bytes):
        state = self._check(state)
        if data and state == TERMINATED:
            raise ValueError("bytes after EOS: the guide is terminated")
        out = self.program.walk(state, data)
        if out is None:
            raise ValueError(f"bytes {data!r} leave the language from state {state}")
        return out

    def is_final(self, state) -> bool:
        state = self._check(state)
        return state == TERMINATED or (len(state) == 1 and self._final[state[0]])

    def can_continue(self, state) -> bool:
        state = self._check(state)
        if state == TERMINATED:
            return False
        top = state[-1]
        if self._has_token[top] or (self._mask_of[top] < 0 and self._lazy_row(top).has_token):
            return True
        m = self.allowed(state).view(np.uint32).copy()
        for e in self._eos:
            m[e >> 5] &= ~np.uint32(1 << (e & 31))
        return bool(m.any())

    def is_terminated(self, state) -> bool:
        return self._check(state) == TERMINATED

    def forced_bytes(self, state) -> bytes:
        state = self._check(state)
        if state == TERMINATED:
            return b""
        got = self._forced.get(state)
        if got is None:
            out = bytearray()
            stack = list(state)
            while len(out) < _MAX_FORCED:
                b = self._single[stack[-1]]
                if b < 0 or (len(stack) == 1 and self._final[stack[0]]):
                    break
                out.append(b)
                self.program.step(stack, b)
            got = bytes(out)
            if len(self._forced) < 4096:
                self._forced[state] = got
        return got

    def fill_bitmask(self, state, out_row: np.ndarray) -> None:
        out_row[...] = self.allowed(state)

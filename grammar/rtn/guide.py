"""StackGuide: the Guide of a module network; states are stacks (tuples of global state ids, bottom to top)."""

from __future__ import annotations

import numpy as np

from ..regex.dfa import DEAD
from ..guide import Guide, SchemaInfo
from .module import Module
from ..tokens.masks import MaskTable, StateRow, WalkTables, native_walker
from .program import Program
from ..tokens.vocab import TokenizerInfo

_MAX_FORCED = 4096
_MASK_CACHE = 4096  # masks of stacks whose crossing tokens were checked (the common case needs no cache)
TERMINATED = (-1,)


class StackGuide(Guide):
    """Masks come from the top state's row (computed on the state's first visit, then kept: `MaskTable`); tokens that
    leave the top frame are checked against the stack below it once per stack (cached), so a step costs a dict
    lookup in the common case. One guide serves every request of its grammar (the compiler's cache shares it)."""

    def __init__(self, root: Module, info: TokenizerInfo, source: str = "", budget=None, schema_info=None,
                 program: Program | None = None, table: MaskTable | None = None):
        self.info, self.source, self.schema_info = info, source, schema_info
        self.program = program or Program(root)
        if budget is not None:
            budget.check("the module network")
        self.table = table or MaskTable(WalkTables.of_program(self.program), info)
        self.initial_state: tuple = self.program.initial
        self.num_states = self.program.num_states
        self._init_tables()

    def _init_tables(self) -> None:
        prog = self.program
        self._walk_tables = self.table.tables
        self._final = self.table.tables.final.tolist()
        self._token_bytes = self.info.token_bytes
        self._eos = frozenset(self.info.eos_token_ids)
        self._cache: dict = {}
        self._forced: dict = {}
        self._single: dict[int, int] = {}
        self._classes = prog.class_of

    def __getstate__(self):
        """Pickle the network and the rows computed so far; caches are rebuilt on load."""
        return {"info": self.info, "source": self.source, "schema_info": self.schema_info,
                "program": self.program, "table": self.table}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self.initial_state = self.program.initial
        self.num_states = self.program.num_states
        self._init_tables()

    def save(self, path: str) -> None:
        """Write the network's tables to an .npz file (see `load`); masks are computed again on first visit."""
        import json

        p = self.program
        tables = {f"p_{k}": np.asarray(getattr(p, k)) for k in p._TABLES}
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
            meta = json.loads(str(z["schema_info"]))
            g = cls(None, info, str(z["source"]), program=prog)
        if meta is not None:
            g.schema_info = SchemaInfo(meta[0], *(tuple(m) for m in meta[1:]))
        return g

    def __repr__(self) -> str:
        return (f"StackGuide(states={self.num_states}, modules={self.program.num_modules}, "
                f"visited={len(self.table)}, source={self.source[:40]!r})")

    def _check(self, state) -> tuple:
        if not isinstance(state, tuple) or not state or (state != TERMINATED and not all(
                isinstance(g, int) and 0 < g < self.num_states for g in state)):
            raise ValueError(f"invalid guide state {state!r}")
        return state

    def allowed(self, state) -> np.ndarray:
        state = self._check(state)
        if state == TERMINATED:
            return self._eos_mask()
        row = self.table.row(state[-1])
        if not len(row.cross_tok) or len(state) == 1:
            return row.mask
        got = self._cache.get(state)
        if got is None:
            got = self._cache[state] = self._with_crossing(state, row)
            if len(self._cache) > _MASK_CACHE:
                self._cache = {}  # bounded; a dict swap, never a resize under another thread's lookup
        return got

    def _with_crossing(self, state: tuple, row: StateRow) -> np.ndarray:
        """The top row's mask plus the crossing tokens that the frames below the top accept."""
        walker = native_walker(self.info) if self.table.native is not False else None
        if walker is not None:
            below = np.array(state[:-1], np.int32)
            fit = walker.cross_check(self.info.packed_bytes, row.cross_tok, row.cross_off, below,
                              self._walk_tables)
            ids = row.cross_tok[fit].astype(np.int64)
        else:
            ids = np.array([t for t, off in zip(row.cross_tok.tolist(), row.cross_off.tolist())
                            if self._crosses(state, t, off)], np.int64)
        if not len(ids):
            return row.mask
        got = row.mask.copy()
        np.bitwise_or.at(got.view(np.uint32), ids >> 5, np.uint32(1) << (ids & 31).astype(np.uint32))
        got.setflags(write=False)
        return got

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
        if self.table.row(state[-1]).has_token:
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
                b = self._single_byte(stack[-1])
                if b < 0 or (len(stack) == 1 and self._final[stack[0]]):
                    break
                out.append(b)
                self.program.step(stack, b)
            got = bytes(out)
            if len(self._forced) < 4096:
                self._forced[state] = got
        return got

    def _single_byte(self, g: int) -> int:
        """The one byte state g accepts, or -1 (several, none, or g is final)."""
        b = self._single.get(g)
        if b is None:
            live = np.flatnonzero(self.program.trans[g][self._classes] != DEAD)
            b = self._single[g] = int(live[0]) if len(live) == 1 and not self._final[g] else -1
        return b

    def fill_bitmask(self, state, out_row: np.ndarray) -> None:
        out_row[...] = self.allowed(state)

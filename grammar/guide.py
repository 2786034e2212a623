"""Guides: the per-token interface the sampler uses (allowed mask, advance, final, forced string)."""

from __future__ import annotations

import json
from array import array
from dataclasses import dataclass
from typing import Any, Hashable

import numpy as np

from .regex.dfa import DEAD, ByteDFA
from .tokens.index import build_index
from .tokens.jump import _MEMO_MAX, JumpResult, jump_tokens
from .tokens.masks import MaskTable, WalkTables, eos_bits, vocabulary_check
from .tokens.vocab import TokenizerInfo

_MAX_FORCED = 4096


@dataclass(frozen=True)
class SchemaInfo:
    """What a JSON-schema compile used and ignored (for debugging a schema)."""

    draft: str
    ignored: tuple[str, ...]  # annotations, keywords unknown to the draft, unknown formats ("format:name")
    relaxed: tuple[str, ...]  # strict=False: constraints that were not enforced
    narrowed: tuple[str, ...] = ()  # enforced by generating a smaller valid language (uniqueItems: <= 1 item)


def utf8_complete_prefix(data: bytes) -> str:
    """The longest prefix of `data` made of whole UTF-8 characters, decoded ("" if it starts mid-character)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        return data[: e.start].decode("utf-8") if e.start else ""


class Guide:
    """Common interface of compiled constraints. States are immutable and hashable (fork = share the value)."""

    info: TokenizerInfo
    initial_state: Hashable

    def allowed(self, state) -> np.ndarray:
        """Packed int32 bitmask [ceil(vocab/32)]: bit t%32 of word t//32 set = token t allowed. Do not mutate."""
        raise NotImplementedError

    def fill_bitmask(self, state, out_row: np.ndarray) -> None:
        """Write `allowed(state)` into a preallocated int32 row (e.g. one row of a batch bitmask)."""
        out_row[...] = self.allowed(state)

    def advance(self, state, token_id: int):
        """State after `token_id`; ValueError if the token is not allowed in `state`."""
        raise NotImplementedError

    def advance_bytes(self, state, data: bytes):
        """State after raw bytes (e.g. a forced string); ValueError if they leave the language."""
        raise NotImplementedError

    def is_final(self, state) -> bool:
        """Accepting: the text so far is a complete match, EOS is allowed."""
        raise NotImplementedError

    def can_continue(self, state) -> bool:
        """Some non-EOS token is allowed (False in a terminated or necessarily-complete state)."""
        raise NotImplementedError

    def is_terminated(self, state) -> bool:
        """EOS has been consumed; only EOS is allowed from here (EOS consumption is idempotent)."""
        raise NotImplementedError

    def forced_bytes(self, state) -> bytes:
        """Bytes every continuation must start with (b"" when the next byte is a free choice)."""
        raise NotImplementedError

    def forced_string(self, state) -> str:
        """The forced continuation, cut to whole UTF-8 characters ("" if none)."""
        return utf8_complete_prefix(self.forced_bytes(state))

    def token_allowed(self, state, token_id: int) -> bool:
        """Bit `token_id` of `allowed(state)`."""
        m = self.allowed(state)
        return 0 <= token_id < self.info.vocab_size and bool((int(m[token_id >> 5]) >> (token_id & 31)) & 1)

    def jump_tokens(self, state, generated_token_ids, forced: str | None = None, tokenizer: Any = None, **kw):
        """Canonical tokens for a jump over the forced string; see `sglpy.grammar.tokens.jump.jump_tokens`.

        Memoized per guide: the result depends only on the state, the forced text and the last 8 generated ids
        (<= 4 re-tokenized plus <= 4 of context), and requests of one schema often repeat all three."""
        if kw or tokenizer is None:
            return jump_tokens(self, state, generated_token_ids, forced, tokenizer, **kw)
        memo = self.__dict__.get("_jump_memo")
        if memo is None or len(memo) > _MEMO_MAX:
            memo = self.__dict__["_jump_memo"] = {}
        key = (state, forced, tuple(generated_token_ids[-8:]), id(tokenizer))
        hit = memo.get(key)
        if hit is None:
            hit = memo[key] = jump_tokens(self, state, generated_token_ids, forced, tokenizer)
        return JumpResult(hit.rollback, list(hit.new_token_ids), hit.new_state)


class RegexGuide(Guide):
    """A regular constraint: integer states of a minimal byte DFA; a state's mask is computed on its first visit
    (`MaskTable`, shared by every request of the grammar); the last state id is the terminated pseudo-state."""

    def __init__(self, dfa: ByteDFA, info: TokenizerInfo, source: str = "", budget=None, schema_info=None,
                 table: MaskTable | None = None):
        self.dfa, self.info, self.source = dfa, info, source
        self.schema_info = schema_info  # JSON schemas: draft and the keywords the compile ignored
        if table is None:
            table = MaskTable(WalkTables.of_dfa(dfa), info)
            if len(vocabulary_check(table.tables, info)):  # a byte no token starts: the exact (eager) check
                build_index(dfa, info, budget=budget)
        self.table = table
        self.initial_state: int = dfa.initial
        self.num_states = dfa.num_states
        self._init_tables()

    def _init_tables(self) -> None:
        dfa = self.dfa
        self._term = dfa.num_states
        # flat int32 table, index (state << 8) | byte: 4 bytes per entry (a guide may have 20k states)
        self._trans = array("i", np.ascontiguousarray(dfa.trans, dtype=np.int32).tobytes())
        self._accepting = dfa.accepting.tolist() + [True]
        self._token_bytes = self.info.token_bytes
        self._eos = frozenset(self.info.eos_token_ids)
        self._eos_mask = eos_bits(self.info).view(np.int32)
        self._eos_mask.setflags(write=False)
        self._forced: dict[int, bytes] = {}

    def __getstate__(self):
        """Pickle the automaton and the rows computed so far; derived tables are rebuilt on load."""
        return {"dfa": self.dfa, "info": self.info, "source": self.source, "schema_info": self.schema_info,
                "table": self.table}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self.initial_state = self.dfa.initial
        self.num_states = self.dfa.num_states
        self._init_tables()

    def save(self, path: str) -> None:
        """Write the automaton to an .npz file (see `load`); masks are computed again on first visit."""
        np.savez(path, trans=self.dfa.trans, accepting=self.dfa.accepting, initial=self.dfa.initial,
                 source=np.array(self.source), info_key=np.array(self.info.key),
                 schema_info=np.array(json.dumps(None if self.schema_info is None else list(self.schema_info.__dict__.values()))))

    @classmethod
    def load(cls, path: str, info: TokenizerInfo) -> "RegexGuide":
        """Read a guide written by `save` for the same tokenizer (ValueError if the tokenizer differs)."""
        with np.load(path) as z:
            if str(z["info_key"]) != info.key:
                raise ValueError(f"{path}: compiled for another tokenizer")
            dfa = ByteDFA(z["trans"], z["accepting"], int(z["initial"]))
            meta = json.loads(str(z["schema_info"])) if "schema_info" in z.files else None
            g = cls(dfa, info, str(z["source"]))
            if meta is not None:
                g.schema_info = SchemaInfo(meta[0], *(tuple(m) for m in meta[1:]))
            return g

    def __repr__(self) -> str:
        return f"RegexGuide(states={self.num_states}, visited={len(self.table)}, source={self.source[:40]!r})"

    def _check(self, state) -> int:
        if not isinstance(state, (int, np.integer)) or not 0 < state <= self._term:
            raise ValueError(f"invalid guide state {state!r}")
        return int(state)

    def allowed(self, state) -> np.ndarray:
        s = self._check(state)
        return self._eos_mask if s == self._term else self.table.row(s).mask

    def advance(self, state, token_id: int) -> int:
        s = self._check(state)
        if token_id in self._eos:
            if self._accepting[s]:
                return self._term
            raise ValueError(f"EOS token {token_id} not allowed: state {s} is not accepting")
        if s == self._term:
            raise ValueError(f"token {token_id} after EOS: the guide is terminated")
        if not 0 <= token_id < len(self._token_bytes):
            raise ValueError(f"token id {token_id} outside the vocabulary (size {len(self._token_bytes)})")
        data = self._token_bytes[token_id]
        if not data:
            raise ValueError(f"token {token_id} is special/added/padding/empty: never allowed in a constraint")
        trans = self._trans
        for b in data:
            s = trans[(s << 8) | b]
            if s == DEAD:
                raise ValueError(f"token {token_id} ({data!r}) not allowed in state {state}")
        return s

    def advance_bytes(self, state, data: bytes) -> int:
        s = self._check(state)
        if data and s == self._term:
            raise ValueError("bytes after EOS: the guide is terminated")
        trans = self._trans
        for b in data:
            s = trans[(s << 8) | b]
            if s == DEAD:
                raise ValueError(f"bytes {data!r} leave the language from state {state}")
        return s

    def is_final(self, state) -> bool:
        return self._accepting[self._check(state)]

    def can_continue(self, state) -> bool:
        s = self._check(state)
        return s != self._term and self.table.row(s).has_token

    def is_terminated(self, state) -> bool:
        return self._check(state) == self._term

    def forced_bytes(self, state) -> bytes:
        s = self._check(state)
        got = self._forced.get(s)
        if got is None:
            out = bytearray()
            cur = s
            while len(out) < _MAX_FORCED:
                b = self._single_byte(cur)
                if b < 0:
                    break
                out.append(b)
                cur = self._trans[(cur << 8) | b]
            got = self._forced[s] = bytes(out)
        return got

    def _single_byte(self, s: int) -> int:
        """The one byte state s accepts, or -1 (several, none, s is accepting, or s is the terminated state)."""
        if s == self._term or self._accepting[s]:
            return -1
        live = np.flatnonzero(self.dfa.trans[s] != DEAD)
        return int(live[0]) if len(live) == 1 else -1

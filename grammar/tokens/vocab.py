"""Vocabulary normalisation: every token id -> the bytes it stands for (GPT-2 byte-level, SentencePiece, raw)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import threading
import warnings
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np

from ..errors import GrammarError

_INSTANCES: dict[str, "TokenizerInfo"] = {}
_INSTANCES_LOCK = threading.Lock()
STRING_CHARS = 16  # whole-character string tokens up to this many characters are taken from a state's string chain
_BYTE_TOKEN = re.compile(r"^<0x([0-9A-Fa-f]{2})>$")
SPM_SPACE = "\u2581"


@functools.lru_cache(maxsize=1)
def byte_level_decoder() -> dict[str, int]:
    """Inverse of GPT-2's bytes_to_unicode table: printable char -> byte."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    table = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + extra)
            extra += 1
    return {c: b for b, c in table.items()}


@dataclass(frozen=True, eq=False)
class TokenizerInfo:
    """Normalised vocabulary: token_bytes[id] is the token's bytes, or None if it may never appear in a constraint."""

    token_bytes: tuple
    eos_token_ids: tuple[int, ...]
    special_token_ids: frozenset = frozenset()
    kind: str = "raw"
    key: str = field(default="", compare=False)
    # computes token masks natively (the runtime passes kernels/trie_walk.py's NativeTrieWalker); None: numpy walks
    walker: Any = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        if not self.token_bytes:
            raise ValueError("TokenizerInfo: empty vocabulary")
        for i, b in enumerate(self.token_bytes):
            if b is not None and not isinstance(b, bytes):
                raise ValueError(f"TokenizerInfo: token {i} must be bytes or None, got {type(b).__name__}")
        if not self.eos_token_ids:
            raise ValueError("TokenizerInfo: at least one EOS token id is required")
        for e in self.eos_token_ids:
            if not 0 <= e < len(self.token_bytes):
                raise ValueError(f"TokenizerInfo: EOS id {e} outside the vocabulary (size {len(self.token_bytes)})")
        if self.kind not in ("raw", "byte_level", "byte_fallback"):
            raise ValueError(f"TokenizerInfo: unknown kind {self.kind!r}")
        if not self.key:
            h = hashlib.sha256()
            h.update(json.dumps([self.kind, list(self.eos_token_ids), sorted(self.special_token_ids)]).encode())
            for b in self.token_bytes:
                h.update(b"\xff\xfe" if b is None else len(b).to_bytes(2, "little") + b)
            object.__setattr__(self, "key", h.hexdigest()[:32])

    def __hash__(self) -> int:
        return hash(self.key)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TokenizerInfo) and other.key == self.key

    @property
    def vocab_size(self) -> int:
        """Logits width (tokenizer vocabulary plus any padding up to the model's size)."""
        return len(self.token_bytes)

    @property
    def mask_words(self) -> int:
        """int32 words in one packed bitmask row."""
        return (self.vocab_size + 31) // 32

    @functools.cached_property
    def trie(self) -> "TokenTrie":
        """Level-by-level prefix tree of the constraint-usable tokens (built once, shared by compiles)."""
        return TokenTrie.build(self.token_bytes)

    @functools.cached_property
    def longest_token(self) -> int:
        """Length in bytes of the longest usable token."""
        return max((len(b) for b in self.token_bytes if b), default=0)

    @functools.cached_property
    def first_byte_masks(self) -> np.ndarray:
        """[256, words] uint32: packed mask of the usable tokens starting with each byte."""
        out = np.zeros((256, self.mask_words * 32), dtype=bool)
        for i, b in enumerate(self.token_bytes):
            if b:
                out[b[0], i] = True
        return np.packbits(out, axis=1, bitorder="little").view("<u4")

    @functools.cached_property
    def flat_trie(self) -> "FlatTrie":
        """The usable tokens' prefix tree in preorder (the native trie walk's layout)."""
        return FlatTrie.build(self.token_bytes)

    @functools.cached_property
    def string_tokens(self) -> tuple[np.ndarray, tuple]:
        """(rows [k + 1, words] uint32: row j = packed mask of the tokens of at most j <= k = STRING_CHARS ASCII
        characters that neither end nor escape a JSON string (0x20-0x7f but `"` and backslash); token_bytes
        without the tokens of row k). Masks of states inside strings take those tokens from the chain of states that the
        string's characters lead through, and walk only the rest."""
        ok = set(range(0x20, 0x80)) - {0x22, 0x5C}
        rows = np.zeros((STRING_CHARS + 1, self.mask_words * 32), bool)
        rest = list(self.token_bytes)
        for i, b in enumerate(self.token_bytes):
            if b and len(b) <= STRING_CHARS and all(c in ok for c in b):
                rows[len(b):, i] = True
                rest[i] = None
        return np.packbits(rows, axis=1, bitorder="little").view("<u4"), tuple(rest)

    @functools.cached_property
    def string_rest(self) -> "FlatTrie":
        """The trie (preorder) of the tokens `string_tokens` leaves to the walk."""
        return FlatTrie.build(self.string_tokens[1])

    @functools.cached_property
    def string_rest_levels(self) -> "TokenTrie":
        """The same tokens as `string_rest`, level by level (the numpy walk's layout)."""
        return TokenTrie.build(self.string_tokens[1])

    @functools.cached_property
    def packed_bytes(self) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 concatenation of every token's bytes, int64 [vocab + 1] start offsets; unusable tokens empty)."""
        parts = [b or b"" for b in self.token_bytes]
        start = np.zeros(len(parts) + 1, np.int64)
        np.cumsum([len(b) for b in parts], out=start[1:])
        return np.frombuffer(b"".join(parts), np.uint8).copy(), start

    @functools.cached_property
    def sorted_tokens(self) -> tuple[list[bytes], np.ndarray]:
        """Usable token byte strings sorted, with their ids (prefix queries for the jump helper)."""
        pairs = sorted((b, i) for i, b in enumerate(self.token_bytes) if b)
        return [b for b, _ in pairs], np.array([i for _, i in pairs], dtype=np.int64)

    @classmethod
    def from_hf(
        cls,
        tokenizer: Any,
        vocab_size: int | None = None,
        eos_token_ids: Iterable[int] | None = None,
        walker: Any = None,
    ) -> "TokenizerInfo":
        """Normalise a fast transformers tokenizer or a `tokenizers.Tokenizer`; `vocab_size` pads to the logits;
        `walker` computes masks natively (see the field)."""
        backend = getattr(tokenizer, "backend_tokenizer", tokenizer)
        if not hasattr(backend, "to_str"):
            raise GrammarError(
                f"incompatible vocabulary: {type(tokenizer).__name__} has no `tokenizers` backend "
                "(use a fast tokenizer, or build TokenizerInfo from token bytes)"
            )
        spec = json.loads(backend.to_str())
        vocab: dict[str, int] = backend.get_vocab(with_added_tokens=True)
        added = backend.get_added_tokens_decoder()
        size = max(vocab.values()) + 1
        if vocab_size is not None:
            if vocab_size < size:
                raise GrammarError(f"vocab_size={vocab_size} is smaller than the tokenizer's {size} ids")
            size = vocab_size
        kind = _detect_kind(spec, vocab)
        table = byte_level_decoder()
        out: list[bytes | None] = [None] * size
        bad = []
        for tok, i in vocab.items():
            if i in added:
                continue
            b = _token_to_bytes(tok, kind, table)
            if b is None:
                bad.append(tok)
            else:
                out[i] = b
        if len(bad) > max(8, len(vocab) // 1000):
            raise GrammarError(
                f"incompatible vocabulary: {len(bad)} {kind} tokens cannot be mapped to bytes, e.g. {bad[:3]!r}"
            )
        if bad:  # a handful of odd tokens: never allowed in constraints rather than refusing the tokenizer
            warnings.warn(f"{len(bad)} tokens cannot be mapped to bytes and are never allowed in constraints: "
                          f"{bad[:3]!r}", stacklevel=2)
        if eos_token_ids is None:
            eos = getattr(tokenizer, "eos_token_id", None)
            if eos is None:
                raise GrammarError("cannot find the EOS token id: pass eos_token_ids=")
            eos_token_ids = [eos]
        eos_ids = tuple(sorted({int(e) for e in eos_token_ids}))
        info = cls(tuple(out), eos_ids, frozenset(added) | frozenset(eos_ids), kind, walker=walker)
        # one instance per distinct vocabulary (and walker): engines created in the same process share the token trie
        with _INSTANCES_LOCK:
            info = _INSTANCES.setdefault(f"{info.key}:{id(walker) if walker is not None else ''}", info)
            while len(_INSTANCES) > 8:
                _INSTANCES.pop(next(iter(_INSTANCES)))
        return info


def _detect_kind(spec: dict, vocab: dict[str, int]) -> str:
    types = set()

    def collect(node):
        if isinstance(node, dict):
            if "type" in node:
                types.add(node["type"])
            for v in node.values():
                collect(v)
        elif isinstance(node, list):
            for v in node:
                collect(v)

    collect(spec.get("decoder"))
    if "ByteLevel" in types:
        return "byte_level"
    if "ByteFallback" in types or "Metaspace" in types or (spec.get("model") or {}).get("byte_fallback"):
        return "byte_fallback"
    if sum(1 for t in vocab if _BYTE_TOKEN.match(t)) >= 256:
        return "byte_fallback"
    raise GrammarError(
        f"incompatible vocabulary: decoder types {sorted(types) or 'none'} are neither byte-level BPE "
        "nor SentencePiece byte-fallback"
    )


def _token_to_bytes(tok: str, kind: str, table: dict[str, int]) -> bytes | None:
    if kind == "byte_level":
        try:
            return bytes(table[c] for c in tok)
        except KeyError:
            return None
    m = _BYTE_TOKEN.match(tok)
    if m:
        return bytes([int(m.group(1), 16)])
    return tok.replace(SPM_SPACE, " ").encode("utf-8")


@dataclass(frozen=True)
class TokenTrie:
    """Prefix tree stored per depth. Level d nodes are the distinct length-d prefixes, sorted."""

    byte: list  # [depth] -> np.int32[nodes]: last byte of each node (level 0 unused)
    child_start: list  # [depth] -> np.int64[nodes]: first child index in level depth+1
    child_count: list  # [depth] -> np.int64[nodes]
    tok_start: list  # [depth] -> np.int64[nodes]: CSR into tok_ids
    tok_count: list  # [depth] -> np.int64[nodes]
    tok_ids: list  # [depth] -> np.int64[tokens ending at this depth], grouped by node
    nodes: list  # [depth] -> sorted list of the prefixes (bytes) at this depth

    @property
    def depth(self) -> int:
        return len(self.byte) - 1

    @classmethod
    def build(cls, token_bytes) -> "TokenTrie":
        by_bytes: dict[bytes, list[int]] = {}
        for i, b in enumerate(token_bytes):
            if b:
                by_bytes.setdefault(b, []).append(i)
        maxlen = max((len(b) for b in by_bytes), default=0)
        prefix_sets: list[set[bytes]] = [set() for _ in range(maxlen + 1)]
        for b in by_bytes:
            for d in range(1, len(b) + 1):
                prefix_sets[d].add(b[:d])
        levels: list[list[bytes]] = [[b""]] + [sorted(s) for s in prefix_sets[1:]]
        byte, cstart, ccount, tstart, tcount, tids = [], [], [], [], [], []
        for d, nodes in enumerate(levels):
            byte.append(np.array([n[-1] if n else 0 for n in nodes], dtype=np.int32))
            ids = [by_bytes.get(n, []) if d else [] for n in nodes]
            counts = np.array([len(x) for x in ids], dtype=np.int64)
            tcount.append(counts)
            tstart.append(np.concatenate([[0], np.cumsum(counts)[:-1]]).astype(np.int64))
            tids.append(np.array([t for x in ids for t in x], dtype=np.int64))
            if d + 1 < len(levels):
                index = {n: j for j, n in enumerate(nodes)}
                parents = np.array([index[c[:-1]] for c in levels[d + 1]], dtype=np.int64)
                cnt = np.bincount(parents, minlength=len(nodes)).astype(np.int64)
                ccount.append(cnt)
                cstart.append(np.concatenate([[0], np.cumsum(cnt)[:-1]]).astype(np.int64))
            else:
                ccount.append(np.zeros(len(nodes), np.int64))
                cstart.append(np.zeros(len(nodes), np.int64))
        return cls(byte, cstart, ccount, tstart, tcount, tids, levels)


@dataclass(frozen=True, eq=False)
class FlatTrie:
    """Prefix tree in preorder (= sorted order of the token strings). Node 0 is the empty prefix; node i has
    depth[i], its last byte byte[i] and end[i] (one past its subtree); the tokens ending at node i are
    tok_ids[tok_lo[i]:tok_lo[i + 1]], so those strictly below it are tok_ids[tok_lo[i + 1]:tok_lo[end[i]]]."""

    byte: np.ndarray  # [nodes] uint8
    depth: np.ndarray  # [nodes] int32
    end: np.ndarray  # [nodes] int32
    tok_lo: np.ndarray  # [nodes + 1] int32
    tok_ids: np.ndarray  # [tokens] int32
    max_depth: int

    @classmethod
    def build(cls, token_bytes) -> "FlatTrie":
        pairs = sorted((b, i) for i, b in enumerate(token_bytes) if b)
        byte, depth, tok_lo, tok_ids = [0], [0], [0], []
        path: list[bytes] = [b""]  # the prefixes on the path from the root to the last node
        ends, open_nodes = [0], [0]  # end of each node (set when it closes); the nodes of the open path
        prev = None
        for b, i in pairs:
            if b != prev:
                common = 0  # the longest prefix of b already on the path
                while common + 1 < len(path) and common < len(b) and path[common + 1] == b[: common + 1]:
                    common += 1
                while len(open_nodes) > common + 1:  # close the nodes off the new path
                    ends[open_nodes.pop()] = len(byte)
                    path.pop()
                for d in range(common + 1, len(b) + 1):
                    byte.append(b[d - 1])
                    depth.append(d)
                    tok_lo.append(len(tok_ids))
                    ends.append(0)
                    open_nodes.append(len(byte) - 1)
                    path.append(b[:d])
                prev = b
            tok_ids.append(i)
        while open_nodes:
            ends[open_nodes.pop()] = len(byte)
        tok_lo.append(len(tok_ids))
        return cls(np.array(byte, np.uint8), np.array(depth, np.int32), np.array(ends, np.int32),
                   np.array(tok_lo, np.int32), np.array(tok_ids, np.int32), max(depth))

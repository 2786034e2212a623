"""Grammar token masks in native code (csrc/trie_walk.cpp): the vocabulary's token trie walked through a byte automaton.

sglpy.grammar computes a state's mask on its first visit (grammar/tokens/masks.py) and imports nothing of ours: the
runtime hands it a `NativeTrieWalker` through `TokenizerInfo.from_hf(..., walker=...)`; without one the grammar walks
with its numpy reference (tests/grammar/test_trie_walk.py compares the two). Arrays are checked for dtype
and layout here, so the C side reads them as they are. ctypes releases the GIL for the call.
"""

from __future__ import annotations

import ctypes
import functools
import threading
import weakref

import numpy as np

from .cpu_native import bind_signatures, native_lib

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
# typed here, on first use, rather than in cpu_native.SIGNATURES: the entry points only this module calls
_SIGNATURES = {
    "sglpy_trie_walk": (_I64, [_P, _P, _P, _P, _P, _I64, _I64, _P, _I64, _P, _P, _P, _P, _I32, _P, _P, _P, _I64]),
    "sglpy_cross_check": (_I64, [_P, _P, _P, _P, _I64, _P, _I64, _P, _I64, _P, _P, _P, _P, _P]),
}


@functools.lru_cache(maxsize=None)
def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    return bind_signatures(lib, _SIGNATURES)


def trie_lib() -> ctypes.CDLL | None:
    """The native library with the trie-walk entry points, or None (no compiler, a failed build, disabled)."""
    try:
        lib = native_lib()
    except ValueError:  # SGLPY_CPU_ISA names a level this CPU lacks
        return None
    return _typed(lib) if lib is not None else None


class NativeTrieWalker:
    """What sglpy.grammar's mask tables call to walk the trie natively (TokenizerInfo(walker=...)); the library is
    loaded on first use (or by `ready()` ahead of it), and where it cannot load, `ready()` is False and the grammar
    walks with its numpy reference. Pickles as a fresh, unloaded walker."""

    def __init__(self):
        self._lib: ctypes.CDLL | None = None
        self._tried = False

    def __reduce__(self):
        return (NativeTrieWalker, ())

    def ready(self) -> bool:
        """Load the library now; True when the native walk runs."""
        if not self._tried:
            self._lib, self._tried = trie_lib(), True
        return self._lib is not None

    def walk(self, trie, tables, start: int, words: int):
        """`trie_walk` with the loaded library (call `ready()` first)."""
        return trie_walk(self._lib, trie, tables, start, words)

    def cross_check(self, packed, cross_tok, cross_off, below, tables) -> np.ndarray:
        """`cross_check` with the loaded library (call `ready()` first)."""
        return cross_check(self._lib, packed, cross_tok, cross_off, below, tables)


@functools.lru_cache(maxsize=1)
def native_trie_walker() -> NativeTrieWalker:
    """The process's walker (one per process: every TokenizerInfo built with it shares the loaded library)."""
    return NativeTrieWalker()


def _arr(a: np.ndarray, dtype, name: str) -> int:
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"trie walk: {name} must be a contiguous {np.dtype(dtype).name} array, got {a.dtype}")
    return a.ctypes.data


_CROSS_CAP = 2048
_PREPARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()  # trie / tables -> checked pointer arguments
_PREPARED_LOCK = threading.Lock()


def _trie_args(trie) -> tuple:
    """(pointers..., nodes, max_depth, largest token id) of a FlatTrie, checked once per trie."""
    got = _PREPARED.get(trie)
    if got is None:
        got = (_arr(trie.byte, np.uint8, "byte"), _arr(trie.depth, np.int32, "depth"), _arr(trie.end, np.int32, "end"),
               _arr(trie.tok_lo, np.int32, "tok_lo"), _arr(trie.tok_ids, np.int32, "tok_ids"), len(trie.byte),
               trie.max_depth, int(trie.tok_ids.max()) if trie.tok_ids.size else -1)
        with _PREPARED_LOCK:
            _PREPARED[trie] = got
    return got


def _table_args(tables) -> tuple:
    """(trans, n_classes, class_of, pop, rets, ats) pointer arguments of WalkTables, checked once per tables."""
    got = _PREPARED.get(tables)
    if got is None:
        if tables.class_of.shape != (256,) or tables.pop.shape != (tables.trans.shape[0],):
            raise ValueError("trie walk: class_of must have 256 entries and pop one per state")
        got = (_arr(tables.trans, np.int32, "trans"), tables.trans.shape[1],
               _arr(tables.class_of, np.int32, "class_of"), _arr(tables.pop, np.uint8, "pop"),
               _arr(tables.rets, np.int32, "rets"), _arr(tables.ats, np.int32, "ats"))
        with _PREPARED_LOCK:
            _PREPARED[tables] = got
    return got


def trie_walk(lib: ctypes.CDLL, trie, tables, start: int, words: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(packed uint32 [words] mask of the tokens `start`'s frame keeps alive, int32 ids and int32 byte offsets of the
    tokens that leave its frame) for `trie` (grammar.tokens.vocab.FlatTrie) over `tables`
    (grammar.tokens.masks.WalkTables)."""
    if not 0 < start < tables.trans.shape[0]:
        raise ValueError(f"trie walk: state {start} outside 1..{tables.trans.shape[0] - 1}")
    targs = _trie_args(trie)
    if targs[-1] >= words * 32:
        raise ValueError(f"trie walk: token ids reach {targs[-1]}, the mask holds {words * 32}")
    args = (*targs[:-1], *_table_args(tables), start)
    cap = _CROSS_CAP  # most states have few frame-leaving tokens: small buffers first, exact ones if it overflows
    while True:
        mask = np.zeros(words, np.uint32)
        ctok, coff = np.empty(cap, np.int32), np.empty(cap, np.int32)
        n = lib.sglpy_trie_walk(*args, mask.ctypes.data, ctok.ctypes.data, coff.ctypes.data, cap)
        if n < 0:
            raise ValueError(f"trie walk: a node deeper than the trie's max_depth {trie.max_depth}")
        if n <= cap:
            return mask, ctok[:n], coff[:n]
        cap = n


def cross_check(lib: ctypes.CDLL, packed: tuple[np.ndarray, np.ndarray], cross_tok: np.ndarray,
                cross_off: np.ndarray, below: np.ndarray, tables) -> np.ndarray:
    """bool [n]: which frame-leaving tokens (ids, bytes read inside the top frame) the frames `below` accept
    (int32 stack bottom to top, the top frame removed); `packed` = TokenizerInfo.packed_bytes."""
    data, start = packed
    if len(cross_tok) != len(cross_off):
        raise ValueError("cross_check: token ids and offsets differ in length")
    ok = np.zeros(len(cross_tok), np.uint8)
    if len(below) and not 0 < int(below.min()) and int(below.max()) < tables.trans.shape[0]:
        raise ValueError("cross_check: a stack state outside the automaton")
    lib.sglpy_cross_check(
        _arr(data, np.uint8, "token bytes"), _arr(start, np.int64, "token starts"),
        _arr(cross_tok, np.int32, "cross_tok"), _arr(cross_off, np.int32, "cross_off"), len(cross_tok),
        _arr(below, np.int32, "stack"), len(below), *_table_args(tables), ok.ctypes.data)
    return ok.view(bool)

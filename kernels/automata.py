"""Grammar automata in native code (csrc/automata.cpp): subset construction, trimming and minimisation.

sglpy.grammar builds its automata in Python and imports nothing of ours: the runtime hands it a `NativeAutomata`
(`GrammarCompiler(..., native_automata=native_automata())`), and the grammar's compile budget carries it to the
constructions (grammar/regex/native.py flattens NFAs and modules into the arrays read here). Without one, or with
SGLPY_DISABLE_CPU_KERNELS=1, the Python constructions run: they are the oracle (tests/grammar/test_native_automata.py
compares both, state for state up to numbering). Arrays are checked for dtype and layout here, so the C side reads
them as they are; ctypes releases the GIL for the call, and the budget check is called back every few milliseconds.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .cpu_native import bind_signatures, native_lib

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
_CHECK = ctypes.CFUNCTYPE(ctypes.c_int32)
_SIGNATURES = {
    "sglpy_subset_build": (_P, [_I64, _I32, _I32, *[_P] * 9, _I64, *[_P] * 12, _I64, _CHECK]),
    "sglpy_table_finish": (_P, [_P, _P, _I64, _I64, _I32, _P, _I64, _CHECK]),
    "sglpy_automaton_info": (None, [_P, _P]),
    "sglpy_automaton_read": (None, [_P, _P, _P, _P, _P]),
    "sglpy_automaton_free": (None, [_P]),
}
TOO_LARGE, STOPPED = 1, 2  # result status codes (0: built)


@functools.lru_cache(maxsize=None)
def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    return bind_signatures(lib, _SIGNATURES)


@dataclass(frozen=True)
class NativeAutomaton:
    """A trimmed, minimal class table: cell >= 0 a state (0 dead), < 0 call entry -(k + 1); or a status != 0."""

    status: int  # 0 built, TOO_LARGE (more than max_states states), STOPPED (the check asked to stop)
    table: np.ndarray  # [states, classes] int32
    accepting: np.ndarray  # [states] bool
    initial: int
    entries: np.ndarray  # [entries, 3] int32: callee index, at, ret
    class_of: np.ndarray  # [256] int32


def _arr(a: np.ndarray, dtype, name: str) -> int:
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"native automata: {name} must be a contiguous {np.dtype(dtype).name} array, got {a.dtype}")
    return a.ctypes.data


class NativeAutomata:
    """What sglpy.grammar calls to build automata natively; the library loads on first use (or by `ready()`).
    Pickles as a fresh, unloaded instance."""

    def __init__(self):
        self._lib: ctypes.CDLL | None = None
        self._tried = False
        # one callback for the instance's life (making a ctypes callback maps fresh executable memory: ~1 ms here);
        # it runs on the calling thread, so each thread's construction reads its own check from thread-local state
        self._local = threading.local()
        self._callback = _CHECK(self._stop)

    def _stop(self) -> int:
        """Called back from C++ every few milliseconds of work: 1 = stop (the check raised; re-raised after)."""
        local = self._local
        try:
            if local.check is not None:
                local.check()
        except BaseException as e:  # noqa: BLE001 - re-raised by _run, after the native call returned
            local.raised = e
            return 1
        return 0

    def __reduce__(self):
        return (NativeAutomata, ())

    def ready(self) -> bool:
        """Load the library now; True when the native constructions run."""
        if not self._tried:
            try:
                lib = native_lib()
            except ValueError:  # SGLPY_CPU_ISA names a level this CPU lacks
                lib = None
            self._lib, self._tried = (_typed(lib) if lib is not None else None), True
        return self._lib is not None

    def _run(self, call: Callable[[object], int], check: Callable[[], None] | None) -> NativeAutomaton:
        local = self._local
        outer = getattr(local, "check", None), getattr(local, "raised", None)  # a check may build automata too
        local.check, local.raised = check, None
        try:
            handle = call(self._callback)
            raised = local.raised
        finally:
            local.check, local.raised = outer
        try:
            info = np.zeros(5, np.int64)
            self._lib.sglpy_automaton_info(handle, info.ctypes.data)
            status, n, k, ne, initial = (int(x) for x in info)
            if raised is not None:
                raise raised
            if status:
                return NativeAutomaton(status, np.zeros((0, 0), np.int32), np.zeros(0, bool), 0,
                                       np.zeros((0, 3), np.int32), np.zeros(256, np.int32))
            table = np.empty((n, k), np.int32)
            acc = np.empty(n, np.uint8)
            entries = np.empty((ne, 3), np.int32)
            class_of = np.empty(256, np.int32)
            self._lib.sglpy_automaton_read(handle, table.ctypes.data, acc.ctypes.data, entries.ctypes.data,
                                           class_of.ctypes.data)
            return NativeAutomaton(0, table, acc.view(bool), initial, entries, class_of)
        finally:
            self._lib.sglpy_automaton_free(handle)

    def subset(self, nfa: dict, modules: dict, max_states: int, check: Callable[[], None] | None = None
               ) -> NativeAutomaton:
        """Subset construction, trim and minimisation of a flattened NFA (`nfa`: n, start, accept and int32 CSR
        arrays eps_off/eps_dst, edge_off/edge_lo/edge_hi/edge_dst, emb_off/emb_mod/emb_end) embedding `modules`
        (trans: list of contiguous int32 [states, 256] tables, accepting / exit: lists of bool [states], initial,
        callable, refine (uint8 per module), classes [modules, 256], entry_off, entry_callee, entry_at, entry_ret).
        `check` raises to stop (its exception is re-raised here)."""
        n = int(nfa["n"])
        arrays = [_arr(nfa[k], np.int32, k) for k in ("eps_off", "eps_dst", "edge_off", "edge_lo", "edge_hi",
                                                      "edge_dst", "emb_off", "emb_mod", "emb_end")]
        for k in ("eps_off", "edge_off", "emb_off"):
            if nfa[k].shape != (n + 1,):
                raise ValueError(f"native automata: {k} must have n + 1 entries")
        if not 0 <= int(nfa["start"]) < n or not 0 <= int(nfa["accept"]) < n:
            raise ValueError("native automata: start / accept outside the NFA")
        trans, accs, exits = modules["trans"], modules["accepting"], modules["exit"]
        m = len(trans)
        for t, a, x in zip(trans, accs, exits):
            if t.ndim != 2 or t.shape[1] != 256 or a.shape != (t.shape[0],) or x.shape != a.shape:
                raise ValueError("native automata: a module table must be [states, 256] with flags per state")
        t_ptr = np.array([_arr(t, np.int32, "module table") for t in trans], np.int64)
        a_ptr = np.array([_arr(a, np.bool_, "module acceptance") for a in accs], np.int64)
        x_ptr = np.array([_arr(x, np.bool_, "module exits") for x in exits], np.int64)
        states = np.array([t.shape[0] for t in trans], np.int32)
        mods = [_arr(t_ptr, np.int64, "tables"), _arr(states, np.int32, "states"), _arr(a_ptr, np.int64, "acc"),
                _arr(x_ptr, np.int64, "exit"),
                _arr(modules["initial"], np.int32, "initial"), _arr(modules["callable"], np.uint8, "callable"),
                _arr(modules["refine"], np.uint8, "refine"), _arr(modules["classes"], np.int32, "classes"),
                _arr(modules["entry_off"], np.int32, "entry_off"), _arr(modules["entry_callee"], np.int32, "callee"),
                _arr(modules["entry_at"], np.int32, "at"), _arr(modules["entry_ret"], np.int32, "ret")]
        if modules["classes"].shape != (m, 256) or modules["entry_off"].shape != (m + 1,):
            raise ValueError("native automata: module classes must be [modules, 256], entry_off modules + 1")
        return self._run(lambda cb: self._lib.sglpy_subset_build(n, int(nfa["start"]), int(nfa["accept"]), *arrays,
                                                                  m, *mods, max_states, cb), check)

    def finish(self, table: np.ndarray, accepting: np.ndarray, initial: int, entries: np.ndarray,
               check: Callable[[], None] | None = None) -> NativeAutomaton:
        """Trim and minimise a class table [states, classes] int32 with call entries [entries, 3] int32 (callee
        code, at, ret). The result's class_of is the identity: its columns are the input's."""
        n, k = table.shape
        if accepting.shape != (n,) or entries.ndim != 2 or entries.shape[1] != 3 or not 0 <= initial < n:
            raise ValueError("native automata: finish needs [states] acceptance, [entries, 3] entries, a state")
        return self._run(lambda cb: self._lib.sglpy_table_finish(
            _arr(table, np.int32, "table"), _arr(accepting, np.bool_, "accepting"), n, k, initial,
            _arr(entries, np.int32, "entries"), len(entries), cb), check)


@functools.lru_cache(maxsize=1)
def native_automata() -> NativeAutomata:
    """The process's instance (every compiler built with it shares the loaded library)."""
    return NativeAutomata()

"""Program: a module network laid out with global state ids, read byte by byte with a stack of return states.

A configuration is a tuple of global state ids, bottom to top: the root module's state at the bottom,
then one return state per open call, the current state on top. Above the bottom, the top is never an
accepting state of a called module: those return at once (callees are prefix-free), so configurations
are normalised.
"""

from __future__ import annotations

from array import array

import numpy as np

from ..regex.dfa import DEAD
from .module import Module


class Program:
    """Global tables of a module network (class-compressed: [states, classes])."""

    def __init__(self, root: Module):
        mods = root.modules()
        offsets, entry_base, g, k = [], [], 1, 0
        for m in mods:
            offsets.append(g - 1)  # local state s >= 1 -> offsets + s
            entry_base.append(k)
            g += m.num_states - 1
            k += len(m.entries)
        pos = {id(m): i for i, m in enumerate(mods)}
        called_root = any(e.callee is root for m in mods for e in m.entries)  # a recursive root (loose)
        self.num_states, self.num_entries = g, k
        class_of = root.classes.astype(np.int64)
        _, reps = np.unique(class_of, return_index=True)  # class ids are 0..k-1
        n_classes = len(reps)
        trans = np.zeros((g, n_classes), np.int32)
        accepting = np.zeros(g, bool)
        pop = np.zeros(g, bool)
        module_of = np.zeros(g, np.int32)
        rets = np.zeros(k, np.int32)
        ats = np.zeros(k, np.int32)
        for i, m in enumerate(mods):
            off, lo, hi = offsets[i], offsets[i] + 1, offsets[i] + m.num_states
            t = m.trans[1:, reps].astype(np.int64)
            glob = np.where(t > 0, t + off, np.where(t < 0, t - entry_base[i], 0))
            trans[lo:hi] = glob
            accepting[lo:hi] = m.accepting[1:]
            if i or called_root:
                pop[lo:hi] = m.accepting[1:]
            module_of[lo:hi] = i
            for j, e in enumerate(m.entries):
                rets[entry_base[i] + j] = off + e.ret
                ats[entry_base[i] + j] = offsets[pos[id(e.callee)]] + e.at
        self.num_modules = len(mods)
        self.trans, self.class_of = trans, class_of.astype(np.int32)
        self.accepting, self.pop, self.module_of = accepting, pop, module_of
        self.rets, self.ats = rets, ats
        self.initial: tuple = (offsets[0] + root.initial,) if root.initial != DEAD else (DEAD,)
        self._derive()

    def _derive(self) -> None:
        self._flat = array("i", np.ascontiguousarray(self.trans, np.int32).tobytes())
        self._cls = self.class_of.tolist()
        self._k = self.trans.shape[1]
        self._pop = self.pop.tolist()
        self._rets, self._ats = self.rets.tolist(), self.ats.tolist()

    _TABLES = ("num_states", "num_entries", "num_modules", "trans", "class_of", "accepting", "pop", "module_of",
               "rets", "ats", "initial")

    def __getstate__(self):
        return {k: getattr(self, k) for k in self._TABLES}

    def __setstate__(self, d):
        self.__dict__.update(d)
        self._derive()

    def step(self, stack: list, b: int) -> bool:
        """Advance a configuration (a list, modified in place) by one byte; False if the byte is rejected."""
        t = self._flat[stack[-1] * self._k + self._cls[b]]
        if t == DEAD:
            return False
        if t < 0:
            stack[-1] = self._rets[-t - 1]
            stack.append(self._ats[-t - 1])
        else:
            stack[-1] = t
        pop = self._pop
        while pop[stack[-1]] and len(stack) > 1:
            stack.pop()
        return True

    def walk(self, config: tuple, data: bytes) -> tuple | None:
        """Configuration after `data` (None if rejected)."""
        stack = list(config)
        for b in data:
            if not self.step(stack, b):
                return None
        return tuple(stack)

    def is_final(self, config: tuple) -> bool:
        return len(config) == 1 and bool(self.accepting[config[0]])

    def fullmatch(self, data: bytes) -> bool:
        end = self.walk(self.initial, data)
        return end is not None and self.is_final(end)

    def live_bytes(self, g: int) -> np.ndarray:
        """Bytes with a live cell in global state g (a call cell counts: its callee starts with that byte)."""
        return np.flatnonzero(self.trans[g][self.class_of] != DEAD)

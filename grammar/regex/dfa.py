"""Byte NFA -> minimal, trimmed byte DFA (subset construction over byte classes + Moore refinement)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from ..budget import CompileBudget
from ..errors import GrammarError, too_large
from .native import native_finish, native_subset

if TYPE_CHECKING:  # annotations only: nfa.py determinises its character classes here
    from .nfa import NFA

DEAD = 0
_CHECK_EVERY = 4096  # NFA states read by the subset construction between budget checks (~1-10 ms)


@dataclass(frozen=True)
class ByteDFA:
    """Deterministic automaton over bytes. State 0 is the dead state; every other state can reach acceptance."""

    trans: np.ndarray  # [states, 256] int32, next state per byte (DEAD = rejected)
    accepting: np.ndarray  # [states] bool
    initial: int

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    def walk(self, state: int, data: bytes) -> int:
        """State after `data` (DEAD if rejected)."""
        t = self.trans
        for b in data:
            state = int(t[state, b])
            if state == DEAD:
                return DEAD
        return state

    def fullmatch(self, data: bytes) -> bool:
        s = self.walk(self.initial, data)
        return s != DEAD and bool(self.accepting[s])


def _byte_classes(nfa: NFA) -> tuple[np.ndarray, int]:
    cuts = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            cuts.add(lo)
            cuts.add(hi + 1)
    bounds = np.array(sorted(cuts), dtype=np.int64)
    class_of = np.searchsorted(bounds, np.arange(256), side="right") - 1
    return class_of.astype(np.int32), len(bounds) - 1


def nfa_to_dfa(nfa: NFA, max_states: int, budget: CompileBudget | None = None, what: str = "the automaton") -> ByteDFA:
    """Subset construction over byte classes, then trimming and minimisation (budget checked as it grows)."""
    if nfa.embeds:
        raise GrammarError("internal: an NFA embedding modules needs rtn.build.nfa_to_module")
    built = native_subset(nfa, max_states, budget, what)
    if built is not None:  # the same construction in native code (the budget carries the kernel)
        res = built[1]
        return ByteDFA(np.ascontiguousarray(res.table[:, res.class_of]), res.accepting, res.initial)
    class_of, n_classes = _byte_classes(nfa)
    cedges = [[(int(class_of[lo]), int(class_of[hi]), t) for lo, hi, t in es] for es in nfa.edges]
    eps, accept = nfa.eps, nfa.accept

    def closure(seeds) -> tuple[frozenset, bool]:
        seen = set(seeds)
        stack = list(seeds)
        while stack:
            for t in eps[stack.pop()]:
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        # only states with byte edges matter for the future; acceptance is kept as a flag
        return frozenset(n for n in seen if cedges[n]), accept in seen

    ids: dict[tuple[frozenset, bool], int] = {}
    rows: list[list[int]] = [[DEAD] * n_classes]  # dead state
    acc: list[bool] = [False]
    work: list[tuple[frozenset, bool]] = []

    def intern(key) -> int:
        sid = ids.get(key)
        if sid is None:
            if len(rows) > max_states:
                raise GrammarError(
                    f"automaton too large: {what} needs more than {max_states} DFA states (raise max_states, or "
                    "simplify the constraint: large bounded repeats, maxLength/maxItems and many optional parts "
                    "multiply states)"
                )
            if budget is not None and len(rows) % 256 == 0:
                budget.check(what)
            sid = ids[key] = len(rows)
            rows.append([DEAD] * n_classes)
            acc.append(key[1])
            work.append(key)
        return sid

    initial = intern(closure([nfa.start]))
    visited = 0  # NFA states read since the last budget check: a step's cost grows with its subset's size
    while work:
        key = work.pop()
        visited += len(key[0]) + 1
        if budget is not None and visited >= _CHECK_EVERY:
            visited = 0
            budget.check(what)
        row = rows[ids[key]]
        moves: dict[int, set[int]] = {}
        for n in key[0]:
            for clo, chi, t in cedges[n]:
                for c in range(clo, chi + 1):
                    moves.setdefault(c, set()).add(t)
        cache: dict[frozenset, int] = {}
        for c, targets in moves.items():
            ft = frozenset(targets)
            sid = cache.get(ft)
            if sid is None:
                ck = closure(targets)
                sid = cache[ft] = intern(ck) if (ck[0] or ck[1]) else DEAD
            row[c] = sid
    ctrans = np.array(rows, dtype=np.int32).reshape(len(rows), n_classes)
    accepting = np.array(acc, dtype=bool)
    ctrans, accepting, initial = _trim(ctrans, accepting, initial)
    ctrans, accepting, initial = _minimise(ctrans, accepting, initial, budget, what)
    return ByteDFA(np.ascontiguousarray(ctrans[:, class_of]), accepting, initial)


def coreachable(succ: np.ndarray, live: np.ndarray) -> np.ndarray:
    """States that reach a state marked in `live` [n] bool along `succ` [n, k] edges (DEAD's edges ignored).

    One numpy pass builds the reversed, deduplicated edge list; the search is a plain stack over Python
    lists (a level-by-level numpy search pays ~10 calls per level, and long chains have hundreds of levels).
    """
    n, k = succ.shape
    src = np.repeat(np.arange(n, dtype=np.int64), k)
    dst = succ.reshape(-1).astype(np.int64)
    keep = (dst != src) & (dst != DEAD) & (src != DEAD)
    codes = np.unique(dst[keep] * n + src[keep])  # sorted by target, then source
    starts = np.searchsorted(codes // n, np.arange(n + 1)).tolist()
    preds = (codes % n).tolist()
    out = live.tolist()
    stack = [s for s in np.flatnonzero(live).tolist()]
    while stack:
        s = stack.pop()
        for p in preds[starts[s]:starts[s + 1]]:
            if not out[p]:
                out[p] = True
                stack.append(p)
    return np.array(out, dtype=bool)


def _trim(ctrans: np.ndarray, accepting: np.ndarray, initial: int):
    """Redirect transitions into states that cannot reach acceptance to DEAD, and drop those states."""
    n = ctrans.shape[0]
    start = accepting.copy()
    start[DEAD] = False
    live = coreachable(ctrans, start)
    live[DEAD] = True
    if not live[initial]:
        return np.zeros((1, ctrans.shape[1]), np.int32), np.zeros(1, bool), DEAD
    keep = np.flatnonzero(live)
    remap = np.zeros(n, np.int32)  # dropped states -> DEAD
    remap[keep] = np.arange(len(keep), dtype=np.int32)
    return remap[ctrans[keep]], accepting[keep], int(remap[initial])


def trim_minimise(ctrans: np.ndarray, accepting: np.ndarray, initial: int, budget: CompileBudget | None = None,
                  what: str = "the automaton"):
    """_trim then _minimise (natively when the budget carries the kernel): (table, accepting, initial)."""
    built = native_finish(ctrans, accepting, initial, [], budget, what)
    if built is not None:
        res = built[1]
        return res.table, res.accepting, res.initial
    ctrans, accepting, initial = _trim(ctrans, accepting, initial)
    return _minimise(ctrans, accepting, initial, budget, what)


def group_rows(sig: np.ndarray) -> tuple[np.ndarray, int]:
    """Exact id per distinct row of `sig` [n, m] (lexsort + adjacent compare, no Python loop), and the count."""
    n = sig.shape[0]
    order = np.lexsort(sig.T[::-1])
    srt = sig[order]
    new = np.ones(n, dtype=bool)
    new[1:] = (srt[1:] != srt[:-1]).any(axis=1)
    gid = np.cumsum(new) - 1
    ids = np.empty(n, dtype=np.int64)
    ids[order] = gid
    return ids, int(gid[-1]) + 1 if n else 0


_MIX = np.random.default_rng(12345).integers(1, 2**63, size=4096, dtype=np.uint64).view(np.int64) | 1


_MINIMISE_WORK = 1_000_000  # state-rounds of Moore refinement before minimisation is skipped


def _hash_group(block: np.ndarray, ctrans: np.ndarray) -> tuple[np.ndarray, int]:
    """Ids for distinct (block, successor blocks) rows via one 64-bit hash (wrapping int64 dot product;
    collisions are checked by `_is_congruence` afterwards)."""
    m = ctrans.shape[1]
    h = block[ctrans] @ _MIX[1 : m + 1] + block * _MIX[0]
    uniq, ids = np.unique(h, return_inverse=True)
    return ids.reshape(-1), len(uniq)


def _is_congruence(block: np.ndarray, ctrans: np.ndarray, accepting: np.ndarray) -> bool:
    """Every block's members agree on acceptance and on their successors' blocks."""
    sig = np.column_stack([accepting.astype(np.int64), block[ctrans]])
    order = np.argsort(block, kind="stable")
    b, srt = block[order], sig[order]
    same_block = b[1:] == b[:-1]
    return bool(((srt[1:] == srt[:-1]).all(axis=1) | ~same_block).all())


def _minimise(ctrans: np.ndarray, accepting: np.ndarray, initial: int, budget: CompileBudget | None = None,
              what: str = "the automaton", start: np.ndarray | None = None, blocks: list | None = None):
    """Moore partition refinement, vectorised: split blocks until the signatures stop changing.

    start: initial partition (block ids, DEAD's block 0); default: by acceptance.
    blocks: if a list, the new state id of every old state is appended to it.
    """
    n = ctrans.shape[0]
    if start is None:
        start = accepting.astype(np.int64) + 1
        start[DEAD] = 0
    if ctrans.shape[1] + 1 > _MIX.shape[0]:
        raise GrammarError("automaton has too many byte classes")
    ctrans_ix = ctrans.astype(np.intp)  # gathers index with it on every round
    # Each round costs O(states); long chains (maxLength 1000) need one round per link and are usually
    # minimal already, so past the budget the trimmed automaton is kept as it is (still exact).
    round_budget = max(64, _MINIMISE_WORK // max(n, 1))
    for exact in (False, True):
        block = start.astype(np.int64)
        count = len(np.unique(block))
        rounds = 0
        while True:
            if budget is not None:
                budget.check(what)
            if exact:
                block, new_count = group_rows(np.column_stack([block, block[ctrans_ix]]))
            else:
                block, new_count = _hash_group(block, ctrans_ix)
                rounds += 1
                if rounds > round_budget:
                    if blocks is not None:
                        blocks.append(np.arange(n))
                    return ctrans, accepting, initial
            if new_count == count:
                break
            count = new_count
        if exact or _is_congruence(block, ctrans, start):
            break
    # renumber blocks in order of their first state (so the dead state's block is 0)
    _, first = np.unique(block, return_index=True)
    order = np.empty(count, np.int64)
    order[np.argsort(first, kind="stable")] = np.arange(count)
    block = order[block]
    if blocks is not None:
        blocks.append(block)
    rep = np.zeros(count, np.int64)
    rep[block[::-1]] = np.arange(n)[::-1]  # first state of each block
    new_trans = block[ctrans[rep]].astype(np.int32)
    new_acc = accepting[rep]
    new_trans[DEAD] = DEAD
    return new_trans, new_acc, int(block[initial])


def repeat_dfa(one: ByteDFA, lo: int, hi: int | None, max_states: int, what: str = "a repeat") -> ByteDFA:
    """DFA of L(one){lo,hi} built directly as a chain of copies (hi None = unbounded), no subset construction.

    `one` must read exactly one unit: one accepting state without exits, and an initial state that no
    transition enters (a character class, a JSON string character), so copies chain deterministically.
    Layer j is the unit read after j units; its final state becomes ready state j + 1 (unbounded: the last
    layer, lo, returns to ready state lo).
    """
    fin = np.flatnonzero(one.accepting)
    t, i = one.trans, one.initial
    if len(fin) != 1 or (t[fin[0]] != DEAD).any() or (t == i).any() or fin[0] == i:
        raise ValueError("repeat_dfa needs a single-unit automaton")
    f = int(fin[0])
    inner = [s for s in range(1, one.num_states) if s not in (f, i)]
    k = len(inner)
    layers = lo + 1 if hi is None else hi  # unit copies
    n_ready = lo + 1 if hi is None else hi + 1
    n = 1 + n_ready + layers * k
    if n > max_states:
        raise too_large(what, max_states)
    local = np.full(one.num_states, -1, np.int64)
    local[inner] = np.arange(k)
    out = np.zeros((n, 256), np.int32)
    rows = t[[i] + inner].astype(np.int64)  # the initial row then the inner rows
    for j in range(layers):
        nxt = 1 + (min(j + 1, lo) if hi is None else j + 1)
        base = 1 + n_ready + j * k
        m = np.where(rows == f, nxt, np.where(rows == DEAD, DEAD, base + local[rows]))
        out[1 + j] = m[0]
        out[base: base + k] = m[1:]
    acc = np.zeros(n, bool)
    acc[1 + lo: 1 + n_ready] = True
    return ByteDFA(out, acc, 1)

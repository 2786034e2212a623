"""Trim (coreachable) and Moore minimisation against naive references on random small DFAs."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar.regex.dfa import DEAD, _minimise, _trim, coreachable


@st.composite
def tables(draw):
    n = draw(st.integers(2, 12))
    k = draw(st.integers(1, 4))
    trans = np.array(draw(st.lists(st.integers(0, n - 1), min_size=n * k, max_size=n * k)), np.int32).reshape(n, k)
    trans[DEAD] = DEAD
    acc = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    acc[DEAD] = False
    return trans, acc


def _reference_live(trans, acc):
    live = set(np.flatnonzero(acc).tolist()) - {DEAD}
    changed = True
    while changed:
        changed = False
        for s in range(1, len(trans)):
            if s not in live and any(int(t) in live for t in trans[s]):
                live.add(s)
                changed = True
    return live


def _same_language(t1, a1, s1, t2, a2, s2) -> bool:
    """Pairs of states reachable together never disagree on acceptance (a product search)."""
    seen, stack = set(), [(s1, s2)]
    while stack:
        p, q = stack.pop()
        if (p, q) in seen:
            continue
        seen.add((p, q))
        if bool(a1[p]) != bool(a2[q]):
            return False
        stack += [(int(t1[p, c]), int(t2[q, c])) for c in range(t1.shape[1])]
    return True


@settings(max_examples=200, deadline=None)
@given(tables())
def test_coreachable_matches_a_fixpoint(t):
    trans, acc = t
    start = acc.copy()
    got = set(np.flatnonzero(coreachable(trans, start)).tolist())
    assert got == _reference_live(trans, acc)


@settings(max_examples=200, deadline=None)
@given(tables(), st.integers(1, 11))
def test_trim_then_minimise_keeps_the_language_and_merges_equivalent_states(t, init):
    trans, acc = t
    init = init % len(trans) or 1
    ct, ca, ci = _trim(trans, acc, init)
    mt, ma, mi = _minimise(ct, ca, ci)
    assert _same_language(mt, ma, mi, trans, acc, init)
    for p in range(1, len(mt)):  # minimal: no two live states accept the same language
        for q in range(p + 1, len(mt)):
            assert not _same_language(mt, ma, p, mt, ma, q)

"""Lookaheads `(?=X)` / `(?!X)` as automaton algebra: a lookahead is a condition on the rest of the text.

Without backreferences, `re` matches existentially: `A (?!X) B` matches s = a + r exactly when a is in L(A),
r is in the language of everything after the lookahead (B, then the padding of an unanchored end), and no
prefix of r is in L(X). So the rest of the text is built right to left, one automaton per run of plain items,
and each lookahead intersects it with (or subtracts) L(X) followed by anything. Alternations and groups that
hold a lookahead are distributed into top-level sequences first (capped), so every lookahead sits at the top
level of one sequence. Refused by name: a lookahead inside a repeat, anchors or lookarounds inside a lookahead,
lookbehind.
"""

from __future__ import annotations

from .dfa import ByteDFA, nfa_to_dfa
from .fsa import product, union_all
from .nfa import _END_ANCHORS, _START_ANCHORS, NFA, _Builder, sre_c
from ..errors import GrammarError

MAX_ALTERNATIVES = 32  # sequences a pattern's lookahead-holding alternations distribute into
_MARK = 0xF0000  # the automaton of the text after a run of items (an embedded atom, see regex.nfa)


def has_lookaround(items) -> bool:
    """Some lookahead / lookbehind anywhere in the parsed items."""
    for op, av in items:
        if op in (sre_c.ASSERT, sre_c.ASSERT_NOT):
            return True
        if op == sre_c.SUBPATTERN and has_lookaround(av[3]):
            return True
        if op == sre_c.BRANCH and any(has_lookaround(alt) for alt in av[1]):
            return True
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and has_lookaround(av[2]):
            return True
    return False


def _distribute(items: list) -> list[list]:
    """Sequences whose union is `items`, with every lookahead at the top level of its sequence."""
    out: list[list] = [[]]
    for op, av in items:
        if op == sre_c.SUBPATTERN and has_lookaround(av[3]):
            if av[1] or av[2]:
                raise GrammarError("unsupported regex construct: a lookahead inside a group with flags")
            parts = _distribute(list(av[3]))
        elif op == sre_c.BRANCH and any(has_lookaround(alt) for alt in av[1]):
            parts = [p for alt in av[1] for p in _distribute(list(alt))]
        elif op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT) and has_lookaround(av[2]):
            raise GrammarError("unsupported regex construct: a lookahead inside a repeat")
        elif op in (sre_c.ASSERT, sre_c.ASSERT_NOT) and av[0] != 1:
            raise GrammarError("unsupported regex construct: lookbehind assertion")
        else:
            parts = [[(op, av)]]
        out = [seq + p for seq in out for p in parts]
        if len(out) > MAX_ALTERNATIVES:
            raise GrammarError(f"unsupported regex construct: lookaheads in more than {MAX_ALTERNATIVES} "
                               "alternatives")
    return out


class _Automata:
    """Builds the pieces of one pattern: runs of items followed by a known automaton, lookahead conditions."""

    def __init__(self, flags: int, unicode_classes: bool, max_states: int, budget, what: str):
        self.flags, self.unicode, self.max_states = flags, unicode_classes, max_states
        self.budget, self.what = budget, what

    def then(self, items: list, tail: ByteDFA | None, pad_front: bool = False, pad_back: bool = False) -> ByteDFA:
        """L(items) followed by L(tail) (by anything when pad_back), after anything when pad_front."""
        nfa = NFA(min(500_000, max(100_000, 50 * self.max_states)), self.budget)
        b = _Builder(nfa, self.flags, self.unicode, {_MARK: tail} if tail is not None else {}, self.budget)
        start = cur = nfa.new()
        pieces = ([b.any_run()] if pad_front else []) + [b.seq(items, False, False)]
        if tail is not None:
            pieces.append(b.atom(_MARK))
        if pad_back:
            pieces.append(b.any_run())
        for s, e in pieces:
            nfa.eps[cur].append(s)
            cur = e
        nfa.start, nfa.accept = start, cur
        return nfa_to_dfa(nfa, self.max_states, budget=self.budget, what=self.what)


def lookahead_dfa(tree, unicode_classes: bool, max_states: int, budget, what: str, search: bool,
                  dollar_newline: bool) -> ByteDFA:
    """The minimal DFA of a parsed pattern holding lookaheads (fullmatch, or re.search when `search`)."""
    flags = tree.state.flags
    auto = _Automata(flags, unicode_classes, max_states, budget, what)
    outs = []
    for seq in _distribute(list(tree)):
        lead = bool(seq) and seq[0][0] == sre_c.AT and seq[0][1] in _START_ANCHORS
        end = bool(seq) and seq[-1][0] == sre_c.AT and seq[-1][1] in _END_ANCHORS
        dollar = end and seq[-1][1] == sre_c.AT_END
        seq = seq[int(lead): len(seq) - int(end)]
        # the text after the last item: anything (unanchored search), a final newline ($, Python), or nothing
        rest = auto.then([(sre_c.LITERAL, 10)], None) if dollar and dollar_newline else None
        rest = product(rest, auto.then([], None), "or", max_states, budget, what) if rest is not None else None
        rest = auto.then([], rest, pad_back=search and not end)
        run: list = []
        for op, av in reversed(seq):
            if op not in (sre_c.ASSERT, sre_c.ASSERT_NOT):
                run.insert(0, (op, av))
                continue
            rest = auto.then(run, rest) if run else rest
            run = []
            cond_items = list(av[1])
            if has_lookaround(cond_items) or any(o == sre_c.AT for o, _ in cond_items):
                raise GrammarError("unsupported regex construct: an anchor or lookaround inside a lookahead")
            cond = auto.then(cond_items, None, pad_back=True)  # L(X) then anything
            rest = product(rest, cond, "and" if op == sre_c.ASSERT else "diff", max_states, budget, what)
        outs.append(auto.then(run, rest, pad_front=search and not lead))
    return union_all(outs, max_states, budget, what) if len(outs) > 1 else outs[0]


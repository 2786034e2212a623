"""A Python-syntax regex -> minimal byte DFA: the NFA builder (nfa.py), then subset construction (dfa.py)."""

from __future__ import annotations

from ..budget import CompileBudget
from ..errors import GrammarError
from .dfa import ByteDFA, nfa_to_dfa
from .lookaround import has_lookaround, lookahead_dfa
from .nfa import _UNSUPPORTED_FLAGS, build_nfa, parse


def regex_to_dfa(pattern: str, max_states: int = 10_000, unicode_classes: bool = False,
                 budget: CompileBudget | None = None, atoms: dict | None = None, what: str = "",
                 allow_empty: bool = False, search: bool = False, dollar_newline: bool = False,
                 lookahead: bool = True) -> ByteDFA:
    """Compile a Python-syntax regex into a minimal byte DFA, or raise GrammarError.

    atoms: marker code point -> ByteDFA embedded where the marker appears (see regex.nfa.build_nfa);
    what: names the construct in size/time errors; allow_empty: return the empty automaton instead of raising.
    lookahead: compile lookaheads (regex.lookaround: exact for a whole text); False refuses them (a lark terminal's
    lookahead peeks past the terminal, which a terminal's own automaton cannot see).
    """
    tree = parse(pattern) if "(?" in pattern else None
    if tree is not None and lookahead and not atoms and has_lookaround(list(tree)):
        for bit, name in _UNSUPPORTED_FLAGS.items():
            if tree.state.flags & bit:
                raise GrammarError(f"unsupported regex construct: {name}")
        dfa = lookahead_dfa(tree, unicode_classes, max_states, budget, what or f"regex {pattern[:60]!r}", search,
                            dollar_newline)
        if not dfa.accepting.any() and not allow_empty:
            raise GrammarError(f"regex {pattern[:80]!r} matches no string")
        return dfa
    nfa = build_nfa(pattern, max_nfa_states=min(500_000, max(100_000, 50 * max_states)),
                    unicode_classes=unicode_classes, atoms=atoms, budget=budget, search=search,
                    dollar_newline=dollar_newline)
    dfa = nfa_to_dfa(nfa, max_states, budget=budget, what=what or f"regex {pattern[:60]!r}")
    if not dfa.accepting.any() and not allow_empty:
        raise GrammarError(f"regex {pattern[:80]!r} matches no string")
    return dfa

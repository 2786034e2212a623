"""A Python-syntax regex -> minimal byte DFA: the NFA builder (nfa.py), then subset construction (dfa.py)."""

from __future__ import annotations

from ..budget import CompileBudget
from ..errors import GrammarError
from .dfa import ByteDFA, nfa_to_dfa
from .nfa import build_nfa


def regex_to_dfa(pattern: str, max_states: int = 10_000, unicode_classes: bool = False,
                 budget: CompileBudget | None = None, atoms: dict | None = None, what: str = "",
                 allow_empty: bool = False, search: bool = False, dollar_newline: bool = False) -> ByteDFA:
    """Compile a Python-syntax regex into a minimal byte DFA, or raise GrammarError.

    atoms: marker code point -> ByteDFA embedded where the marker appears (see regex.nfa.build_nfa);
    what: names the construct in size/time errors; allow_empty: return the empty automaton instead of raising.
    """
    nfa = build_nfa(pattern, max_nfa_states=min(500_000, max(100_000, 50 * max_states)),
                    unicode_classes=unicode_classes, atoms=atoms, budget=budget, search=search,
                    dollar_newline=dollar_newline)
    dfa = nfa_to_dfa(nfa, max_states, budget=budget, what=what or f"regex {pattern[:60]!r}")
    if not dfa.accepting.any() and not allow_empty:
        raise GrammarError(f"regex {pattern[:80]!r} matches no string")
    return dfa

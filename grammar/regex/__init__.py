"""Regular languages: Python-`re` syntax -> byte NFA (nfa, utf8) -> minimal byte DFA (dfa, pattern); DFA algebra (fsa)."""

from .dfa import DEAD, ByteDFA
from .fsa import intersect_all, is_empty, product, union_all
from .pattern import regex_to_dfa

__all__ = ["DEAD", "ByteDFA", "intersect_all", "is_empty", "product", "regex_to_dfa", "union_all"]

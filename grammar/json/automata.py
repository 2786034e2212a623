"""The schema converter's automata: regex atoms standing for modules, module cache, products, disjointness."""

from __future__ import annotations

from ..regex.dfa import DEAD, ByteDFA
from ..errors import GrammarError, is_fatal
from ..regex.fsa import is_empty
from .objects import OVER_MAX_STATES
from ..regex.nfa import ATOM_BASE, ATOM_END, OptionalSlots
from ..rtn.module import Module, flatten, mark_value, module_of
from ..rtn.algebra import module_product
from ..rtn.build import regex_to_module


class AutomataMixin:
    """Subschema languages are regexes whose one-character atoms are precompiled modules (needs the converter's
    atoms / caches / budget)."""

    def atom(self, obj: ByteDFA | Module | OptionalSlots) -> str:
        """A one-character regex standing for an automaton or fragment (registered for build_nfa)."""
        known = self._atom_of.get(id(obj))
        if known is not None:
            return known
        code = ATOM_BASE + len(self.atoms)
        if code > ATOM_END:
            raise GrammarError("json_schema needs too many sub-automata")
        mod = module_of(obj) if isinstance(obj, ByteDFA) else obj
        self.atoms[code] = mod
        self._alive += [obj, mod]
        self._atom_of[id(obj)] = self._atom_of[id(mod)] = chr(code)
        return chr(code)

    def module(self, regex: str, what: str, cap: int | None = None) -> Module:
        """The regex (atoms embedded by reference: called or stepped, never copied) as one module.

        cap: state limit instead of max_states (over-approximations that may be dropped when too large)."""
        if len(regex) == 1 and isinstance(self.atoms.get(ord(regex)), Module):  # an atom is its own automaton
            return self.atoms[ord(regex)]
        got = self.module_cache.get(regex)
        if got is None:
            got = self.module_cache[regex] = regex_to_module(regex, cap or self.max_states, self.budget, self.atoms,
                                                             what)
        return got

    def to_dfa(self, regex: str, what: str) -> ByteDFA:
        """The regex as one plain DFA (calls flattened), for the automaton algebra."""
        return flatten(self.module(regex, what), self.max_states, self.budget, what, self.flat_cache)

    def compact(self, regex: str | None, what: str, limit: int = 2000) -> str | None:
        """Long regexes become one atom (their module), so repeating them does not multiply text."""
        if regex is None or len(regex) <= limit:
            return regex
        d = self.module(regex, what)
        return None if is_empty(d) else self.atom(mark_value(d))

    def combine(self, a: str | None, b: str | None, op: str, what: str) -> str | None:
        """Regex (an atom) for L(a) op L(b) with op in and / or / diff; None when empty."""
        if a is None:
            return b if op == "or" else None
        if b is None:
            return None if op == "and" else a
        key = (a, b, op)
        if key in self.combine_cache:
            return self.combine_cache[key]
        out = self.combine_cache[key] = self._combine(a, b, op, what)
        return out

    def _combine(self, a: str, b: str, op: str, what: str, cap: int | None = None) -> str | None:
        d = module_product(self.module(a, what), self.module(b, what), op, cap or self.max_states, self.budget, what)
        return None if is_empty(d) else self.atom(mark_value(d))

    def disjoint(self, a: str | None, b: str | None) -> bool:
        """Cheap proof that L(a) and L(b) share no text: their first bytes differ (False = unknown)."""
        if a is None or b is None:
            return True
        ma, mb = self.module(a, "a subschema"), self.module(b, "a subschema")
        return not ((ma.trans[ma.initial] != DEAD) & (mb.trans[mb.initial] != DEAD)).any()

    def narrow(self, a: str | None, b: str | None, what: str) -> str | None:
        """Over-approximations: a and b, or just a when the intersection would exceed OVER_MAX_STATES (a
        superset still); building stops as soon as it grows past the cap."""
        if a is None or b is None:
            return None
        key = (a, b, "narrow")
        if key not in self.combine_cache:
            try:
                self.module(b, what, OVER_MAX_STATES)
                self.combine_cache[key] = self._combine(a, b, "and", what, OVER_MAX_STATES)
            except GrammarError as e:
                if is_fatal(e):
                    raise
                self.combine_cache[key] = a
        return self.combine_cache[key]

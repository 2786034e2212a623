"""The schema converter's automata: regex atoms standing for modules, module cache, products, disjointness."""

from __future__ import annotations

from ..regex.dfa import DEAD, ByteDFA
from ..errors import GrammarError, is_fatal
from ..regex.fsa import is_empty
from . import recursion
from .formats import ANY_NUMBER_RE
from .universe import loose_module
from ..regex.nfa import ATOM_BASE, ATOM_END, OptionalSlots
from ..rtn.module import Module, flatten, mark_value, module_of
from ..rtn.algebra import module_product
from ..rtn.build import regex_to_module

OVER_MAX_STATES = 1500  # over-approximation: a filter that would grow an automaton past this is dropped


def atom(conv, obj: ByteDFA | Module | OptionalSlots) -> str:
    """A one-character regex standing for an automaton or fragment (registered for build_nfa)."""
    known = conv._atom_of.get(id(obj))
    if known is not None:
        return known
    code = ATOM_BASE + len(conv.atoms)
    if code > ATOM_END:
        raise GrammarError("json_schema needs too many sub-automata")
    mod = module_of(obj) if isinstance(obj, ByteDFA) else obj
    conv.atoms[code] = mod
    conv._alive += [obj, mod]
    conv._atom_of[id(obj)] = conv._atom_of[id(mod)] = chr(code)
    return chr(code)


def module(conv, regex: str, what: str, cap: int | None = None) -> Module:
    """The regex (atoms embedded by reference: called or stepped, never copied) as one module.

    cap: state limit instead of max_states (over-approximations that may be dropped when too large)."""
    if len(regex) == 1 and isinstance(conv.atoms.get(ord(regex)), Module):  # an atom is its own automaton
        return conv.atoms[ord(regex)]
    got = conv.module_cache.get(regex)
    if got is None:
        got = recursion.check(conv, regex_to_module(regex, cap or conv.max_states, conv.budget, conv.atoms, what),
                              (regex,))
        conv.module_cache[regex] = got
    return got


def to_dfa(conv, regex: str, what: str) -> ByteDFA:
    """The regex as one plain DFA (calls flattened), for the automaton algebra."""
    return flatten(module(conv, regex, what), conv.max_states, conv.budget, what, conv.flat_cache)


def compact(conv, regex: str | None, what: str, limit: int = 2000) -> str | None:
    """Long regexes become one atom (their module), so repeating them does not multiply text."""
    if regex is None or len(regex) <= limit:
        return regex
    d = module(conv, regex, what)
    return None if is_empty(d) else atom(conv, mark_value(d))


def combine(conv, a: str | None, b: str | None, op: str, what: str) -> str | None:
    """Regex (an atom) for L(a) op L(b) with op in and / or / diff; None when empty."""
    if a is None:
        return b if op == "or" else None
    if b is None:
        return None if op == "and" else a
    key = (a, b, op)
    if key in conv.combine_cache:
        return conv.combine_cache[key]
    out = conv.combine_cache[key] = _combine(conv, a, b, op, what)
    return out


def _combine(conv, a: str, b: str, op: str, what: str, cap: int | None = None) -> str | None:
    d = module_product(module(conv, a, what), module(conv, b, what), op, cap or conv.max_states, conv.budget, what)
    recursion.check(conv, d, (a, b))
    return None if is_empty(d) else atom(conv, mark_value(d))


def disjoint(conv, a: str | None, b: str | None) -> bool:
    """Cheap proof that L(a) and L(b) share no text: their first bytes differ (False = unknown)."""
    if a is None or b is None:
        return True
    ma, mb = module(conv, a, "a subschema"), module(conv, b, "a subschema")
    return not ((ma.trans[ma.initial] != DEAD) & (mb.trans[mb.initial] != DEAD)).any()


def narrow(conv, a: str | None, b: str | None, what: str) -> str | None:
    """Over-approximations: a and b, or just a when the intersection would exceed OVER_MAX_STATES (a
    superset still); building stops as soon as it grows past the cap."""
    if a is None or b is None:
        return None
    key = (a, b, "narrow")
    if key not in conv.combine_cache:
        try:
            module(conv, b, what, OVER_MAX_STATES)
            conv.combine_cache[key] = _combine(conv, a, b, "and", what, OVER_MAX_STATES)
        except GrammarError as e:
            if is_fatal(e):
                raise
            conv.combine_cache[key] = a
    return conv.combine_cache[key]


def loose(conv) -> str:
    """Every text the converter can generate (and more: any nesting; brackets not matched by kind)."""
    return f"(?:{atom(conv, loose_module(conv._layout()))}|{ANY_NUMBER_RE})"

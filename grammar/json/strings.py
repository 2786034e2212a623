"""JSON strings: length / pattern / format as one automaton over the decoded text, then JSON-escaped.

Constraints apply to the decoded string (as `jsonschema` sees it after `json.loads`), so they are intersected
as automata over decoded UTF-8 and then mapped to the escaped JSON body: `"` -> `\\"`, `\\` -> `\\\\`,
`/` -> `/` or `\\/`, and `\\b \\f \\n \\r \\t` for those controls. Other control characters would need
`\\uXXXX`, which generated strings never use. Patterns follow Python's `re.search` (what jsonschema runs):
the under-approximation reads `\\d \\w \\s` as ASCII and `$` as end of text, the over-approximation (used under
`not`) uses Python's Unicode classes and lets `$` match before a final newline.
"""

from __future__ import annotations

import functools

import numpy as np

from . import automata
from . import formats as F
from ..regex import regex_to_dfa
from ..regex.dfa import DEAD, ByteDFA, repeat_dfa, trim_minimise
from ..rtn.module import column_classes
from ..errors import GrammarError, is_fatal
from ..regex.fsa import intersect_all, product

_ESCAPES = {ord('"'): ord('"'), ord("\\"): ord("\\"), ord("/"): ord("/"), ord("b"): 8, ord("f"): 12,
            ord("n"): 10, ord("r"): 13, ord("t"): 9}


def encode_json_body(dfa: ByteDFA, budget=None) -> ByteDFA:
    """Automaton of the escaped JSON string bodies whose decoded text `dfa` accepts (trimmed and minimised natively
    when the budget carries the kernel)."""
    n = dfa.num_states
    t = np.zeros((2 * n, 256), np.int32)  # state q (1..n-1) and its after-backslash twin n + q
    raw = dfa.trans.copy()
    raw[:, :0x20] = DEAD
    raw[:, ord('"')] = DEAD
    raw[:, ord("\\")] = DEAD
    t[:n] = raw
    live = np.flatnonzero(np.arange(n) != DEAD)
    t[live, ord("\\")] = n + live
    for esc, dec in _ESCAPES.items():
        t[n + np.arange(n), esc] = dfa.trans[:, dec]
    t[n + DEAD] = DEAD
    acc = np.concatenate([dfa.accepting, np.zeros(n, bool)])
    cls = column_classes(t)  # hashed columns, checked (np.unique over [256, 2n] columns took seconds)
    _, first = np.unique(cls, return_index=True)
    ct, acc, init = trim_minimise(np.ascontiguousarray(t[:, first]), acc, dfa.initial, budget, "a string's escapes")
    return ByteDFA(np.ascontiguousarray(ct[:, cls]), acc, init)


def _search_dfa(conv, pattern: str, mode: str) -> ByteDFA:
    return regex_to_dfa(pattern, conv.max_states, unicode_classes=mode == "over", budget=conv.budget,
                        what=f"pattern {pattern[:40]!r}", allow_empty=True, search=True,
                        dollar_newline=mode == "over")


def pattern_dfa(conv, pattern: str, mode: str) -> ByteDFA | None:
    """Decoded strings `re.search(pattern, s)` matches (under: subset, over: superset); None = no constraint."""
    key = ("pattern", pattern, mode)
    if key not in conv.dfa_cache:
        conv.dfa_cache[key] = _pattern_dfa(conv, pattern, mode)
    return conv.dfa_cache[key]


def _pattern_dfa(conv, pattern: str, mode: str) -> ByteDFA | None:
    try:
        split = leading_lookahead(pattern)
        if split is None:
            return _search_dfa(conv, pattern, mode)
        # `^(?=X)Y` / `^(?!X)Y`: a lookahead at the start of the text is a regular condition on its
        # prefix: L(^Y) and (or minus) the texts with a prefix in L(X), i.e. re.search(^X)
        negative, look, rest = split
        body = _search_dfa(conv, "^" + rest, mode)
        # a difference subtracts the other approximation: under - over(X) is a subset, over - under(X) a superset
        flip = {"under": "over", "over": "under"}[mode] if negative else mode
        prefix = _search_dfa(conv, "^(?:" + look + ")", flip)
        return product(body, prefix, "diff" if negative else "and", conv.max_states, conv.budget,
                       f"pattern {pattern[:40]!r}")
    except GrammarError as e:
        if is_fatal(e):
            raise
        if mode == "over":
            return None  # dropping a constraint keeps a superset
        conv.refuse("pattern", f"{pattern!r}: {e}")
        return None


def pattern_key_atom(conv, pattern: str, mode: str) -> str | None:
    """Atom of the escaped JSON bodies of the names a pattern matches (one per pattern); None = no constraint."""
    key = ("patternkey", pattern, mode)
    if key not in conv.dfa_cache:
        m = pattern_dfa(conv, pattern, mode)
        conv.dfa_cache[key] = None if m is None else automata.atom(conv, encode_json_body(m, conv.budget))
    return conv.dfa_cache[key]


def content_dfa(conv, n, mode: str) -> ByteDFA | None:
    """Decoded-text automaton for minLength/maxLength/pattern/format, or None when only lengths apply."""
    parts = []
    for p in n.patterns:
        d = pattern_dfa(conv, p, mode)
        if d is not None:
            parts.append(d)
    for f in n.formats:
        if f not in F.FORMATS:
            conv.ignore([f"format:{f}"])
        elif mode == "under":
            parts.append(format_dfa(conv, f))
    if not parts:
        return None
    what = "a string's pattern/format/length"
    if not (n.min_len or n.max_len is not None):
        return intersect_all(parts, conv.max_states, conv.budget, what)
    lo, hi = _lengths(conv, n, ANY_CHAR, mode)
    while True:
        try:
            return intersect_all(parts + [_counted(ANY_CHAR, lo, hi, conv.max_states, "minLength/maxLength")],
                                 conv.max_states, conv.budget, what)
        except GrammarError as e:
            if is_fatal(e) or "too large" not in str(e) or hi is None or hi <= lo:
                raise
            # the pattern times the length count is too many states: shorter strings (a sound subset)
            hi = None if mode == "over" else max(lo, hi // 4)
            if mode == "over":
                lo = 0
            else:
                conv.narrowed.add(f"maxLength {n.max_len}: strings of at most {hi} characters (automaton size)")


def format_dfa(conv, name: str) -> ByteDFA:
    key = ("format", name)
    got = conv.dfa_cache.get(key)
    if got is None:
        got = conv.dfa_cache[key] = regex_to_dfa(F.FORMATS[name], conv.max_states, budget=conv.budget,
                                                 what=f"format {name!r}")
    return got


def string_re(conv, n, mode: str) -> str | None:
    """Regex (quotes included) for the JSON strings allowed by the string keywords of `n`."""
    if n.max_len is not None and n.max_len < n.min_len:
        return None
    # one atom per distinct string constraint: a $ref'd string type used N times is one module, not N
    key = ("string", tuple(n.patterns), tuple(n.formats), n.min_len, n.max_len, mode)
    if key not in conv.dfa_cache:
        conv.dfa_cache[key] = _string_re(conv, n, mode)
    return conv.dfa_cache[key]


def _string_re(conv, n, mode: str) -> str | None:
    content = content_dfa(conv, n, mode)
    if content is None:
        if (n.min_len, n.max_len) == (0, None):
            return F.STRING
        if conv.plain_text:
            return '"' + F.STRING_CHAR + f"{{{n.min_len},{'' if n.max_len is None else n.max_len}}}" + '"'
        lo, hi = _lengths(conv, n, JSON_CHAR, mode)
        body = _counted(JSON_CHAR, lo, hi, conv.max_states, "minLength/maxLength")
    else:
        body = encode_json_body(content, conv.budget)
    if not body.accepting.any():
        return None
    if conv.plain_text:
        return '"' + automata.atom(conv, body) + '"'
    # the quoted string is prefix-free: one module, called (not copied) wherever the type is used
    return automata.atom(conv, quoted(body))


def key_body_dfa(conv, name: str) -> ByteDFA:
    """Every escaped spelling of one property name (as a JSON string body)."""
    key = ("keybody", name)
    got = conv.dfa_cache.get(key)
    if got is None:
        import re

        lit = regex_to_dfa(re.escape(name) if name else "", conv.max_states, budget=conv.budget,
                           allow_empty=True)
        got = conv.dfa_cache[key] = encode_json_body(lit, conv.budget)
    return got


JSON_CHAR = F.STRING_CHAR  # one character of a JSON string body, escapes included
ANY_CHAR = "(?s:.)"  # one decoded character


@functools.lru_cache(maxsize=512)
def _counted(unit: str, lo: int, hi: int | None, max_states: int, what: str) -> ByteDFA:
    """`unit{lo,hi}` built as a chain (lengths such as maxLength 512 would take seconds of subset construction)."""
    return repeat_dfa(_unit_dfa(unit), lo, hi, max_states, what)


@functools.lru_cache(maxsize=8)
def _unit_dfa(unit: str) -> ByteDFA:
    return regex_to_dfa(unit)


def _lengths(conv, n, unit: str, mode: str) -> tuple[int, int | None]:
    """minLength/maxLength to build: a count whose chain would pass half of max_states is cut (under: at most
    that many characters, a sound subset, listed as narrowed; over: the bound is dropped, a superset)."""
    k = _unit_dfa(unit).num_states - 3  # states inside one character (besides its start and end)
    cap = max(1, (conv.max_states // 2 - 2) // (k + 1) - 1)
    lo, hi = n.min_len, n.max_len
    if mode == "over":
        return (0 if lo > cap else lo), (None if hi is not None and hi > cap else hi)
    if hi is not None and hi > cap >= lo:
        conv.narrowed.add(f"maxLength {hi}: strings of at most {cap} characters (automaton size)")
        hi = cap
    return lo, hi


def quoted(body: ByteDFA) -> ByteDFA:
    """`"` + body + `"` for a JSON string body automaton (bodies never read a raw `"`)."""
    n = body.num_states
    t = np.zeros((n + 2, 256), np.int32)
    t[:n] = body.trans
    start, end = n, n + 1
    t[start, ord('"')] = body.initial
    live_final = body.accepting.copy()
    live_final[DEAD] = False
    t[np.flatnonzero(live_final), ord('"')] = end
    acc = np.zeros(n + 2, bool)
    acc[end] = True
    return ByteDFA(t, acc, start)


def leading_lookahead(pattern: str) -> tuple[bool, str, str] | None:
    """(negative, X, Y) for a pattern `^(?=X)Y` or `^(?!X)Y` (the lookahead right after a leading `^`), else None."""
    if not (pattern.startswith("^(?=") or pattern.startswith("^(?!")):
        return None
    depth, i, in_class, first = 1, 4, False, -1
    while i < len(pattern):
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if in_class:
            in_class = c != "]" or i == first  # a `]` first in a class is a literal
        elif c == "[":
            in_class = True
            first = i + 2 if pattern[i + 1: i + 2] == "^" else i + 1
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return pattern[3] == "!", pattern[4:i], pattern[i + 1:]
        i += 1
    return None

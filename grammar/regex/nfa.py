"""Python-`re` syntax -> byte-level Thompson NFA (UTF-8 exact); constructs a DFA cannot express are errors.

The regex front end is Python's own parser (`re._parser`, `sre_parse` on 3.10), reached only through
`parse()`; tests/grammar/test_regex_frontend.py pins its output on the constructs we read. Besides plain
regexes, `build_nfa(..., atoms=...)` embeds precompiled byte DFAs: a code point from ATOM_BASE on (Unicode
plane 15, private use) stands for the automaton registered under it, so callers can splice the result of
DFA algebra (intersection, complement) into a larger regex.
"""

from __future__ import annotations

import functools
import re

import numpy as np

from . import utf8
from .dfa import DEAD, nfa_to_dfa
from ..errors import GrammarError

try:  # Python >= 3.11
    from re import _constants as sre_c
    from re import _parser as sre_parse
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as sre_c  # type: ignore[no-redef]
    import sre_parse  # type: ignore[no-redef]

_UNSUPPORTED_FLAGS = {
    sre_c.SRE_FLAG_IGNORECASE: "IGNORECASE flag ((?i))",
    sre_c.SRE_FLAG_LOCALE: "LOCALE flag ((?L))",
}
_CATEGORIES = {
    sre_c.CATEGORY_DIGIT: ("digit", False),
    sre_c.CATEGORY_NOT_DIGIT: ("digit", True),
    sre_c.CATEGORY_WORD: ("word", False),
    sre_c.CATEGORY_NOT_WORD: ("word", True),
    sre_c.CATEGORY_SPACE: ("space", False),
    sre_c.CATEGORY_NOT_SPACE: ("space", True),
}
_AT_NAMES = {
    sre_c.AT_BOUNDARY: "word boundary (\\b)",
    sre_c.AT_NON_BOUNDARY: "non-boundary (\\B)",
}
ATOM_BASE = 0xF0000  # first marker code point for embedded automata (plane 15 private use)
ATOM_END = 0xFFFFD
_START_ANCHORS = (sre_c.AT_BEGINNING, sre_c.AT_BEGINNING_STRING)
_END_ANCHORS = (sre_c.AT_END, sre_c.AT_END_STRING)


class NFA:
    """Thompson NFA over bytes: epsilon lists and (lo, hi, target) byte-range edges per state."""

    def __init__(self, max_states: int, budget=None):
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []
        self.max_states = max_states
        self.budget = budget
        self.start = 0
        self.accept = 0
        self.embeds: dict[int, list] = {}  # state -> [(module, end)]: run the module, then continue at end

    def _too_large(self) -> GrammarError:
        return GrammarError(f"regex too large: its automaton exceeds {self.max_states} NFA states "
                            "(large bounded repeats such as {m,n} or maxLength multiply states)")

    def new(self) -> int:
        n = len(self.eps)
        if n >= self.max_states:
            raise self._too_large()
        if n % 4096 == 0 and self.budget is not None:
            self.budget.check("the regex automaton (NFA)")
        self.eps.append([])
        self.edges.append([])
        return n

    def new_block(self, k: int) -> int:
        """k new states, numbered from the returned id on."""
        n = len(self.eps)
        if n + k > self.max_states:
            raise self._too_large()
        if (n + k) // 4096 != n // 4096 and self.budget is not None:
            self.budget.check("the regex automaton (NFA)")
        self.eps.extend([] for _ in range(k))
        self.edges.extend([] for _ in range(k))
        return n


def parse(pattern: str):
    """Parse with Python's own `re` parser so the language matches `re.fullmatch` exactly.

    Unicode property escapes (`\\p{L}`, `\\P{Script=Greek}`: ECMA-262's `u` mode, which JSON Schema patterns
    use, and Perl's), which Python's parser lacks, are first written out as explicit code-point classes."""
    if not isinstance(pattern, str):
        raise GrammarError(f"regex must be a str, got {type(pattern).__name__}")
    if len(pattern) <= _PARSE_CACHE_CHARS:
        return _parse_cached(pattern)
    return _parse(pattern)


_PARSE_CACHE_CHARS = 4096  # longer texts are parsed each time (rare; they would crowd the cache)


@functools.lru_cache(maxsize=4096)
def _parse_cached(pattern: str):
    # the converter parses the same separators, slot texts and string/number patterns many times per compile and
    # across compiles; trees are only read (the builder never changes them), so one tree serves every thread
    return _parse(pattern)


def _parse(pattern: str):
    try:
        return sre_parse.parse(expand_properties(pattern) if "\\p{" in pattern or "\\P{" in pattern else pattern, 0)
    except re.error as e:
        raise GrammarError(f"invalid regex {pattern!r}: {e}") from None
    except RecursionError:
        raise GrammarError(f"invalid regex {pattern[:60]!r}...: nested too deeply") from None


def expand_properties(pattern: str) -> str:
    """The pattern with each `\\p{name}` / `\\P{name}` replaced by its code points as a class (its ranges alone
    inside a `[...]` class); GrammarError for an unknown property name."""
    out: list[str] = []
    i, in_class, n = 0, False, len(pattern)
    while i < n:
        c = pattern[i]
        if c == "\\" and i + 1 < n:
            if pattern[i + 1] in "pP" and pattern[i + 2: i + 3] == "{":
                end = pattern.find("}", i + 3)
                if end < 0:
                    raise GrammarError(f"invalid regex {pattern!r}: unterminated \\{pattern[i + 1]}{{ at position {i}")
                try:
                    ivs = utf8.unicode_property(pattern[i + 3: end])
                except ValueError as e:
                    raise GrammarError(f"invalid regex {pattern!r}: {e}") from None
                if pattern[i + 1] == "P":
                    ivs = utf8.complement(ivs)
                ranges = "".join(f"\\U{lo:08x}" if lo == hi else f"\\U{lo:08x}-\\U{hi:08x}" for lo, hi in ivs)
                out.append(ranges if in_class else f"[{ranges}]" if ranges else r"[^\x00-\U0010ffff]")
                i = end + 1
                continue
            out.append(pattern[i: i + 2])
            i += 2
            continue
        if c == "[" and not in_class:
            in_class = True
            out.append(c)
            i += 1
            if pattern[i: i + 1] == "^":
                out.append("^")
                i += 1
            if pattern[i: i + 1] == "]":  # a literal `]` first in a class
                out.append("]")
                i += 1
            continue
        if c == "]" and in_class:
            in_class = False
        out.append(c)
        i += 1
    return "".join(out)


def build_nfa(pattern: str, max_nfa_states: int = 500_000, unicode_classes: bool = False,
              atoms: dict | None = None, budget=None, search: bool = False, dollar_newline: bool = False) -> NFA:
    """Compile a regex to a byte NFA whose language is the strings `re.fullmatch` accepts.

    atoms: marker code point -> ByteDFA; each marker literal in the pattern matches that automaton's language.
    search: the strings `re.search` finds a match in (unanchored ends pad with any characters);
    dollar_newline: `$` at the end also allows one final newline (Python semantics; else end of text only).
    """
    tree = parse(pattern)
    flags = tree.state.flags
    for bit, name in _UNSUPPORTED_FLAGS.items():
        if flags & bit:
            raise GrammarError(f"unsupported regex construct: {name}")
    est = _estimate(list(tree))
    if est > max_nfa_states:
        raise GrammarError(
            f"regex too large: about {est} automaton states needed, limit {max_nfa_states} "
            "(nested or large bounded repeats such as {m,n}, maxLength or maxItems)"
        )
    nfa = NFA(max_nfa_states, budget)
    b = _Builder(nfa, flags, unicode_classes, atoms or {}, budget)
    b.search, b.dollar_newline = search, dollar_newline
    s, e = b.seq(list(tree), True, True)
    nfa.start, nfa.accept = s, e
    return nfa


def _estimate(items) -> int:
    """Cheap upper-bound-ish size of the NFA, so huge repeats fail before any allocation."""
    total = 1
    for op, av in items:
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            lo, hi, sub = av
            reps = lo + 1 if hi == sre_c.MAXREPEAT else max(hi, 1)
            total += reps * _estimate(list(sub)) + 2
        elif op == sre_c.SUBPATTERN:
            total += _estimate(list(av[3]))
        elif op == sre_c.BRANCH:
            total += sum(_estimate(list(a)) for a in av[1]) + 2
        elif op == sre_c.IN:
            total += 2 + 3 * len(av)
        else:
            total += 2
        if total > 1 << 40:
            break
    return total


class _Builder:
    def __init__(self, nfa: NFA, flags: int, unicode_classes: bool = False, atoms: dict | None = None,
                 budget=None):
        self.nfa = nfa
        self.atoms = atoms or {}
        self.budget = budget
        self._atom_edges: dict[int, tuple] = {}
        self.search = False
        self.dollar_newline = False
        self._open = (True, True)
        self.dotall = bool(flags & sre_c.SRE_FLAG_DOTALL)
        # \d \w \s are ASCII by default, as in outlines, xgrammar and ECMA-262 (JSON-schema patterns):
        # Unicode \w costs ~300 byte-DFA states per repeat and lets a model emit exotic digits.
        self.ascii = bool(flags & sre_c.SRE_FLAG_ASCII) or not unicode_classes

    def seq(self, items, at_start: bool, at_end: bool) -> tuple[int, int]:
        nfa = self.nfa
        start = cur = nfa.new()
        open_start, open_end = self._open
        # search mode: an unanchored end pads with any characters, unless a group at that end takes it over
        lead = self._side(items, 0) if self.search and at_start and open_start else None
        tail = self._side(items, -1) if self.search and at_end and open_end else None
        if lead == "pad":
            s, e = self.any_run()
            nfa.eps[cur].append(s)
            cur = e
        at = [o == sre_c.AT for o, _ in items]
        last_real = max((i for i, a in enumerate(at) if not a), default=-1)  # later items are anchors only
        first = at_start
        literal, atoms = sre_c.LITERAL, self.atoms
        for i, (op, av) in enumerate(items):
            if i and not at[i - 1]:
                first = False
            if op == literal and av < 0x80 and av not in atoms:  # an ASCII literal: one byte edge, no fragment
                nxt = nfa.new()
                nfa.edges[cur].append((av, av, nxt))
                cur = nxt
                continue
            last = at_end and i >= last_real
            saved = self._open
            self._open = (first and lead == "delegate", last and tail == "delegate")
            try:
                s, e = self.node(op, av, first, last)
            finally:
                self._open = saved
            nfa.eps[cur].append(s)
            cur = e
        if tail == "pad":
            s, e = self.any_run()
            nfa.eps[cur].append(s)
            cur = e
        return start, cur

    @staticmethod
    def _side(items, side: int) -> str:
        """Search mode, one end of a sequence: 'anchored', 'delegate' (a group decides) or 'pad'."""
        anchors = _START_ANCHORS if side == 0 else _END_ANCHORS
        for op, av in (items if side == 0 else items[::-1]):
            if op == sre_c.AT:
                if av in anchors:
                    return "anchored"
                continue
            if op in (sre_c.SUBPATTERN, sre_c.BRANCH):
                # a group decides only where an anchor inside it needs to: `(a|b)` pads once outside, since one
                # padding per alternative (`.*a.*|.*b.*`) makes the subset construction track which matched
                alts = av[1] if op == sre_c.BRANCH else [av[-1]]
                return "delegate" if any(_Builder._side(list(a), side) != "pad" for a in alts) else "pad"
            return "pad"
        return "pad"

    def any_run(self) -> tuple[int, int]:
        """(?s:.)* -- any characters."""
        nfa = self.nfa
        s, e = self.cpset(((0, utf8.MAX_CP),))
        loop = nfa.new()
        nfa.eps[loop].append(s)
        nfa.eps[e].append(loop)
        return loop, loop

    def node(self, op, av, at_start: bool, at_end: bool) -> tuple[int, int]:
        nfa = self.nfa
        if op == sre_c.LITERAL:
            if av in self.atoms:
                return self.atom(av)
            return self.cpset(((av, av),))
        if op == sre_c.NOT_LITERAL:
            return self.cpset(utf8.complement(((av, av),)))
        if op == sre_c.ANY:
            return self.cpset(((0, utf8.MAX_CP),) if self.dotall else utf8.complement(((10, 10),)))
        if op == sre_c.IN:
            marks = [a for o, a in av if o == sre_c.LITERAL and a in self.atoms]
            if marks:  # the parser folds `(?:A|B)` of one-character atoms into a class: split them back out
                if any(o == sre_c.NEGATE for o, _ in av):
                    raise GrammarError("internal: an embedded automaton inside a negated class")
                rest = [(o, a) for o, a in av if not (o == sre_c.LITERAL and a in self.atoms)]
                s, e = nfa.new(), nfa.new()
                frags = [self.atom(m) for m in marks] + ([self.cpset(self.class_items(rest))] if rest else [])
                for a, b in frags:
                    nfa.eps[s].append(a)
                    nfa.eps[b].append(e)
                return s, e
            return self.cpset(self.class_items(av))
        if op == sre_c.SUBPATTERN:
            _group, add_flags, del_flags, sub = av
            if (add_flags | del_flags) & (sre_c.SRE_FLAG_IGNORECASE | sre_c.SRE_FLAG_LOCALE):
                raise GrammarError("unsupported regex construct: IGNORECASE/LOCALE flag in a group (?i:...)")
            saved = self.dotall, self.ascii
            if add_flags & sre_c.SRE_FLAG_DOTALL or del_flags & sre_c.SRE_FLAG_DOTALL:
                self.dotall = bool(add_flags & sre_c.SRE_FLAG_DOTALL)
            if add_flags & sre_c.SRE_FLAG_ASCII or add_flags & sre_c.SRE_FLAG_UNICODE:
                self.ascii = bool(add_flags & sre_c.SRE_FLAG_ASCII)
            try:
                return self.seq(list(sub), at_start, at_end)
            finally:
                self.dotall, self.ascii = saved
        if op == sre_c.BRANCH:
            s, e = nfa.new(), nfa.new()
            for alt in av[1]:
                a, b = self.seq(list(alt), at_start, at_end)
                nfa.eps[s].append(a)
                nfa.eps[b].append(e)
            return s, e
        if op in (sre_c.MAX_REPEAT, sre_c.MIN_REPEAT):
            return self.repeat(*av)
        if op == sre_c.AT:
            if (av in _START_ANCHORS and at_start) or (av in _END_ANCHORS and at_end):
                s = nfa.new()
                if av == sre_c.AT_END and self.dollar_newline:  # Python's $ also matches before a final newline
                    e = nfa.new()
                    nfa.eps[s].append(e)
                    nl = self.cpset(((10, 10),))
                    nfa.eps[s].append(nl[0])
                    nfa.eps[nl[1]].append(e)
                    return s, e
                return s, s
            name = _AT_NAMES.get(av, f"anchor {str(av).lower()} not at the start/end of the pattern")
            raise GrammarError(f"unsupported regex construct: {name}")
        names = {
            sre_c.GROUPREF: "backreference",
            sre_c.GROUPREF_EXISTS: "conditional group (?(id)yes|no)",
            sre_c.ASSERT: "lookahead/lookbehind assertion",
            sre_c.ASSERT_NOT: "negative lookahead/lookbehind assertion",
        }
        for attr, name in (("POSSESSIVE_REPEAT", "possessive quantifier"), ("ATOMIC_GROUP", "atomic group")):
            if hasattr(sre_c, attr) and op == getattr(sre_c, attr):
                raise GrammarError(f"unsupported regex construct: {name}")
        raise GrammarError(f"unsupported regex construct: {names.get(op, str(op).lower())}")

    def atom(self, marker: int) -> tuple[int, int]:
        """The registered automaton: a module is embedded by reference (rtn.build steps or calls it), a
        fragment builds itself, a plain DFA is copied (its accepting states lead to one end)."""
        nfa = self.nfa
        if self.budget is not None:
            self.budget.check("the automaton of an embedded subschema")
        obj = self.atoms[marker]
        if isinstance(obj, OptionalSlots):
            return obj.emit(self)
        if getattr(obj, "entries", None) is not None:
            s, e = nfa.new(), nfa.new()
            nfa.embeds.setdefault(s, []).append((obj, e))
            return s, e
        edges = self._atom_edges.get(marker)
        if edges is None:
            edges = self._atom_edges[marker] = dfa_edges(self.atoms[marker])
        n, runs, initial, finals = edges
        if n <= 1 or not finals:  # empty language: no path through
            return nfa.new(), nfa.new()
        ids = [nfa.new() for _ in range(n)]
        end = nfa.new()
        for src, lo, hi, dst in runs:
            nfa.edges[ids[src]].append((lo, hi, ids[dst]))
        for f in finals:
            nfa.eps[ids[f]].append(end)
        return ids[initial], end

    def repeat(self, lo: int, hi: int, sub) -> tuple[int, int]:
        nfa = self.nfa
        items = list(sub)
        start = cur = nfa.new()
        for _ in range(lo):
            s, e = self.seq(items, False, False)
            nfa.eps[cur].append(s)
            cur = e
        if hi == sre_c.MAXREPEAT:
            s, e = self.seq(items, False, False)
            loop = nfa.new()
            nfa.eps[cur].append(loop)
            nfa.eps[loop].append(s)
            nfa.eps[e].append(loop)
            return start, loop
        end = nfa.new()
        for _ in range(hi - lo):
            nfa.eps[cur].append(end)
            s, e = self.seq(items, False, False)
            nfa.eps[cur].append(s)
            cur = e
        nfa.eps[cur].append(end)
        return start, end

    def class_items(self, items) -> utf8.Intervals:
        return _class_intervals(tuple(items), self.ascii)

    def cpset(self, intervals: utf8.Intervals) -> tuple[int, int]:
        """A fragment matching one code point of the set: a copy of the set's minimal byte automaton."""
        nfa = self.nfa
        n, edges, start, accept = _class_automaton(intervals)
        if n == 0:  # empty set: a fragment with no path through it
            return nfa.new(), nfa.new()
        base = nfa.new_block(n)
        out = nfa.edges
        for src, lo, hi, dst in edges:
            out[base + src].append((lo, hi, base + dst))
        return base + start, base + accept


@functools.lru_cache(maxsize=4096)
def _class_intervals(items: tuple, ascii_classes: bool) -> utf8.Intervals:
    """The code points of a parsed character class (its items as the parser gives them)."""
    negate = False
    ivs: list[tuple[int, int]] = []
    for op, av in items:
        if op == sre_c.NEGATE:
            negate = True
        elif op == sre_c.LITERAL:
            ivs.append((av, av))
        elif op == sre_c.RANGE:
            ivs.append(av)
        elif op == sre_c.CATEGORY:
            if av not in _CATEGORIES:
                raise GrammarError(f"unsupported regex construct: class category {av}")
            name, neg = _CATEGORIES[av]
            cat = utf8.category(name, ascii_classes)
            ivs.extend(utf8.complement(cat) if neg else cat)
        else:
            raise GrammarError(f"unsupported regex construct in character class: {op}")
    res = utf8.normalize(ivs)
    return utf8.complement(res) if negate else res


class OptionalSlots:
    """Regex fragment: any subsequence of `slots` in order, joined by `sep`, then `tail_some` if at least one
    slot was written, else `tail_none` (None = not allowed). Linear in the slots (a regex needs n^2 text)."""

    def __init__(self, slots: list[str], sep: str, tail_some: str | None = "", tail_none: str | None = ""):
        self.slots, self.sep, self.tail_some, self.tail_none = list(slots), sep, tail_some, tail_none

    def emit(self, b: "_Builder") -> tuple[int, int]:
        nfa = b.nfa

        def frag(text: str) -> tuple[int, int]:
            return b.seq(list(parse(text)), False, False)

        none, some = nfa.new(), nfa.new()  # nothing written yet / something written, before the next slot
        start, end = none, nfa.new()
        for slot in self.slots:  # one copy of each slot, entered from both tracks
            none2, some2 = nfa.new(), nfa.new()
            s, e = frag(slot)
            sep_s, sep_e = frag(self.sep)
            nfa.eps[none].extend([none2, s])
            nfa.eps[some].extend([some2, sep_s])
            nfa.eps[sep_e].append(s)
            nfa.eps[e].append(some2)
            none, some = none2, some2
        for track, tail in ((some, self.tail_some), (none, self.tail_none)):
            if tail is not None:
                s, e = frag(tail)
                nfa.eps[track].append(s)
                nfa.eps[e].append(end)
        return start, end


def dfa_edges(dfa) -> tuple[int, tuple, int, tuple]:
    """(states, (src, lo, hi, dst) byte-range runs, initial, accepting states) of a ByteDFA (DEAD skipped)."""
    trans = dfa.trans
    runs = []
    for src in range(1, dfa.num_states):
        row = trans[src]
        cuts = np.flatnonzero(np.diff(row)) + 1
        starts = np.concatenate(([0], cuts))
        ends = np.concatenate((cuts, [256])) - 1
        for lo, hi in zip(starts.tolist(), ends.tolist()):
            dst = int(row[lo])
            if dst:
                runs.append((src, lo, hi, dst))
    finals = tuple(int(x) for x in np.flatnonzero(dfa.accepting) if x)
    return dfa.num_states, tuple(runs), int(dfa.initial), finals


@functools.lru_cache(maxsize=2048)
def _class_automaton(intervals: utf8.Intervals) -> tuple[int, tuple, int, int]:
    """Minimal byte DFA of a code-point set as (states, (src, lo, hi, dst) edges, start, accept).

    Sharing UTF-8 suffixes here keeps Unicode classes (\\d, \\w, [^"]) small in every regex using them.
    """
    nfa = NFA(1 << 30)
    s, e = nfa.new(), nfa.new()
    trie: dict[tuple, int] = {}
    for seq in utf8.set_sequences(intervals):
        cur = s
        for k, (blo, bhi) in enumerate(seq):
            if k == len(seq) - 1:
                nfa.edges[cur].append((blo, bhi, e))
                break
            key = seq[: k + 1]
            nxt = trie.get(key)
            if nxt is None:
                nxt = trie[key] = nfa.new()
                nfa.edges[cur].append((blo, bhi, nxt))
            cur = nxt
    nfa.start, nfa.accept = s, e
    dfa = nfa_to_dfa(nfa, 1 << 30)
    accepts = [int(x) for x in dfa.accepting.nonzero()[0]]
    if not accepts:
        return 0, (), -1, -1
    assert len(accepts) == 1  # every code point ends at the same place: one final state, no exits
    edges = []
    for src in range(1, dfa.num_states):
        row = dfa.trans[src].tolist()
        b = 0
        while b < 256:
            dst = row[b]
            hi = b
            while hi + 1 < 256 and row[hi + 1] == dst:
                hi += 1
            if dst != DEAD:
                edges.append((src, b, hi, dst))
            b = hi + 1
    return dfa.num_states, tuple(edges), dfa.initial, accepts[0]

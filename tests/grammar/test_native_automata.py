"""Native automata construction (kernels/csrc/automata.cpp) against the Python constructions, its oracle.

Both run the same subset construction, trim and Moore minimisation, so they must give the same automata up to the
numbering of states: a joint walk from both initial states pairs every reachable (module, state) of one with exactly
one of the other, with equal acceptance, equal dead / local / call cells, calls into paired callees.
"""

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarError
from sglpy.grammar.budget import CompileBudget
from sglpy.grammar.errors import CompileCancelled
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.regex.dfa import ByteDFA, nfa_to_dfa
from sglpy.grammar.regex.fsa import product as dfa_product
from sglpy.grammar.regex.nfa import build_nfa
from sglpy.grammar.rtn.algebra import module_product
from sglpy.kernels.automata import native_automata

KERNEL = native_automata()
pytestmark = pytest.mark.skipif(not KERNEL.ready(), reason="native CPU kernels unavailable")


def budgets(**kw):
    return CompileBudget(time_s=None, **kw), CompileBudget(time_s=None, native=KERNEL, **kw)


def assert_same(a, b) -> int:
    """a and b (ByteDFA or Module networks) are the same automaton up to state numbering; returns pairs seen."""
    fwd: dict = {}
    back: dict = {}
    stack = [(a, a.initial, b, b.initial)]
    while stack:
        ma, sa, mb, sb = stack.pop()
        ka, kb = (id(ma), sa), (id(mb), sb)
        if ka in fwd or kb in back:
            assert fwd.get(ka) == kb and back.get(kb) == ka, "states pair up differently"
            continue
        fwd[ka], back[kb] = kb, ka
        assert bool(ma.accepting[sa]) == bool(mb.accepting[sb])
        if sa == 0:
            assert sb == 0
            continue
        ra, rb = ma.trans[sa].astype(np.int64), mb.trans[sb].astype(np.int64)
        assert ((ra == 0) == (rb == 0)).all() and ((ra < 0) == (rb < 0)).all()
        for byte in np.flatnonzero(ra).tolist():
            va, vb = int(ra[byte]), int(rb[byte])
            if va > 0:
                stack.append((ma, va, mb, vb))
            else:
                ea, eb = ma.entries[-va - 1], mb.entries[-vb - 1]
                stack.append((ea.callee, ea.at, eb.callee, eb.at))
                stack.append((ma, ea.ret, mb, eb.ret))
    return len(fwd)


REGEXES = [r"[a-z]{2,5}@(foo|bar)\.com", r"(ab|a)*b?c{0,3}", r"\d+(\.\d{1,6})?", r"[^\"\\]{0,40}", r"(?:x|y|z)*",
           r"[\u00e9-\u4e00]{1,3}a", r"(\w+\s?){3}", r"", r"a|", r"((a|b)c|d)*e{3,}"]


@pytest.mark.parametrize("pattern", REGEXES)
def test_regex_dfa_matches_python(pattern):
    py, nat = budgets()
    want = nfa_to_dfa(build_nfa(pattern), 20_000, budget=py)
    got = nfa_to_dfa(build_nfa(pattern), 20_000, budget=nat)
    assert got.num_states == want.num_states
    assert_same(want, got)


_piece = st.sampled_from(["a", "b", "[a-c]", "[^a]", ".", r"\d", "é", "(a|bc)", "(?:ab)", "(x|)", "[\u00e0-\u00ff]"])
_rep = st.sampled_from(["", "*", "+", "?", "{2}", "{1,3}", "{0,2}"])
_regex = st.lists(st.tuples(_piece, _rep), min_size=0, max_size=6).map(lambda ps: "".join(p + r for p, r in ps))


@settings(max_examples=60, deadline=None)
@given(st.lists(_regex, min_size=1, max_size=3))
def test_random_regexes_match_python(alts):
    pattern = "|".join(alts)
    py, nat = budgets()
    want = nfa_to_dfa(build_nfa(pattern), 20_000, budget=py)
    got = nfa_to_dfa(build_nfa(pattern), 20_000, budget=nat)
    assert got.num_states == want.num_states
    assert_same(want, got)
    for text in ["", "a", "ab", "abc", "bcbc", "1", "é", "xx", "aaa"]:
        assert got.fullmatch(text.encode()) == bool(re.fullmatch(pattern, text))


SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 5}},
     "required": ["a"]},
    {"type": "array", "items": {"$ref": "#/$defs/p"}, "maxItems": 4,
     "$defs": {"p": {"type": "object", "properties": {"x": {"type": "number"}, "y": {"enum": ["u", "v"]},
                                                        "z": {"type": "boolean"}, "w": {"type": "null"}}}}},
    {"oneOf": [{"type": "object", "properties": {"k": {"const": "a"}, "v": {"type": "string"}}, "required": ["k"]},
               {"type": "object", "properties": {"k": {"const": "b"}, "n": {"type": "integer", "minimum": 3}},
                "required": ["k"]}]},
    {"type": "object", "properties": {"tree": {"$ref": "#"}, "name": {"type": "string", "pattern": "^[a-z]+$"}}},
    {"anyOf": [{"type": "string", "format": "date"}, {"type": "integer", "multipleOf": 7}], "not": {"const": 14}},
    {"type": "object", "additionalProperties": {"type": "array", "items": {"type": "integer"}}, "maxProperties": 3},
    # modules that call modules and are stepped through by their callers (the classes a caller reads must refine
    # its callees' classes): $ref'd objects with string arrays, enums, patterns, nested required objects
    {"type": "object", "additionalProperties": False,
     "definitions": {
         "maker": {"type": "object", "additionalProperties": False, "required": ["name"],
                   "properties": {"name": {"type": "string"}, "ids": {"type": "array", "items": {"type": "string"}},
                                  "links": {"type": "array", "items": {"type": "string"}}}},
         "kind": {"enum": ["tipRack", "tubeRack", "reservoir", "trash", "wellPlate", "other"]},
         "size": {"type": "number", "minimum": 0},
         "slug": {"type": "string", "pattern": "^[a-z0-9._]+$"}},
     "properties": {
         "maker": {"$ref": "#/definitions/maker"},
         "offset": {"type": "object", "additionalProperties": False, "required": ["x", "y", "z"],
                    "properties": {"x": {"type": "number"}, "y": {"type": "number"}, "z": {"type": "number"}}},
         "dims": {"type": "object", "additionalProperties": False, "required": ["xDim", "yDim"],
                  "properties": {"xDim": {"$ref": "#/definitions/size"}, "yDim": {"$ref": "#/definitions/size"},
                                 "zDim": {"$ref": "#/definitions/size"}}},
         "meta": {"type": "object", "required": ["kind"],
                  "properties": {"kind": {"$ref": "#/definitions/kind"}, "load": {"$ref": "#/definitions/slug"},
                                 "tags": {"type": "array", "items": {"$ref": "#/definitions/slug"}}}},
         "wells": {"type": "object", "additionalProperties": False,
                   "patternProperties": {"^[A-Z]+[0-9]+$": {
                       "type": "object", "required": ["depth", "shape"],
                       "properties": {"depth": {"$ref": "#/definitions/size"},
                                      "shape": {"enum": ["circular", "rectangular"]},
                                      "maker": {"$ref": "#/definitions/maker"}}}}}},
     "required": ["maker", "dims", "meta"]},
    # pattern-keyed objects whose values need oneOf / not over required sets (products of modules that call)
    {"type": "object", "additionalProperties": False, "minProperties": 1,
     "definitions": {"pos": {"type": "number", "minimum": 0}},
     "patternProperties": {"[A-Z]+[0-9]+": {
         "type": "object", "additionalProperties": False,
         "not": {"anyOf": [{"required": ["radius", "width"]}, {"required": ["radius", "height"]}]},
         "oneOf": [{"required": ["width", "height"]}, {"required": ["radius"]}],
         "properties": {"depth": {"$ref": "#/definitions/pos"}, "radius": {"$ref": "#/definitions/pos"},
                        "form": {"enum": ["square", "round"]}, "volume": {"$ref": "#/definitions/pos"},
                        "x": {"$ref": "#/definitions/pos"}, "width": {"$ref": "#/definitions/pos"},
                        "y": {"$ref": "#/definitions/pos"}, "height": {"$ref": "#/definitions/pos"}},
         "required": ["depth", "form", "volume", "x", "y"]}}},
]


@pytest.mark.parametrize("schema", SCHEMAS)
def test_schema_networks_match_python(schema):
    py, nat = budgets()
    want = compile_schema(schema, budget=py).module
    got = compile_schema(schema, budget=nat).module
    assert assert_same(want, got) > 1
    assert got.total_states() == want.total_states()


def test_products_match_python():
    py, nat = budgets()
    a = nfa_to_dfa(build_nfa(r"[a-z]{1,6}\d*"), 1000)
    b = nfa_to_dfa(build_nfa(r"(ab|cd)+\d?"), 1000)
    for op in ("and", "or", "diff"):
        assert_same(dfa_product(a, b, op, 1000, budget=py), dfa_product(a, b, op, 1000, budget=nat))
    ma = compile_schema(SCHEMAS[2], budget=py).module
    mb = compile_schema(SCHEMAS[0], budget=py).module
    for op in ("and", "or", "diff"):
        assert_same(module_product(ma, mb, op, 20_000, budget=py), module_product(ma, mb, op, 20_000, budget=nat))


def test_too_large_and_cancel():
    _, nat = budgets(max_states=50)
    with pytest.raises(GrammarError, match="more than 50"):
        nfa_to_dfa(build_nfa(r"[a-z]{0,80}"), 50, budget=nat)

    class Flag:
        def is_set(self):
            return True

    stop = CompileBudget(time_s=None, native=KERNEL, cancel=Flag())
    with pytest.raises(CompileCancelled):
        nfa_to_dfa(build_nfa(r"(a|b|c|d)*[a-d]{12}"), 1 << 20, budget=stop)


def test_dead_language():
    py, nat = budgets()
    want, got = (nfa_to_dfa(build_nfa(r"[^\x00-\U0010ffff]"), 100, budget=b) for b in (py, nat))
    assert isinstance(got, ByteDFA) and got.num_states == want.num_states == 1 and got.initial == 0


def test_threads_share_the_kernel():
    """Concurrent constructions each get their own budget check (the callback reads thread-local state)."""
    from concurrent.futures import ThreadPoolExecutor

    class Flag:
        def __init__(self, on):
            self.on = on

        def is_set(self):
            return self.on

    def build(i):
        stop = i % 2 == 1
        budget = CompileBudget(time_s=None, native=KERNEL, cancel=Flag(stop))
        try:
            return compile_schema(SCHEMAS[i % len(SCHEMAS)], budget=budget).module
        except CompileCancelled:
            return "cancelled" if stop else "wrongly cancelled"

    with ThreadPoolExecutor(4) as pool:
        got = list(pool.map(build, range(8)))
    py, _ = budgets()
    for i, mod in enumerate(got):
        if i % 2:
            assert mod == "cancelled"
        else:
            assert_same(compile_schema(SCHEMAS[i % len(SCHEMAS)], budget=py).module, mod)

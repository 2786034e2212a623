"""Module networks (grammar/rtn*.py): calls instead of copies, products, the stack guide, exactness vs flat DFAs."""

import dataclasses
import json
import pickle
import random
import re

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglpy.grammar.rtn.module as rtn
from sglpy.grammar import GrammarCompiler
from sglpy.grammar.guide import RegexGuide
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.json.universe import loose_module
from sglpy.grammar.regex.nfa import ATOM_BASE
from sglpy.grammar.rtn.module import flat_minimal, flatten
from sglpy.grammar.rtn.algebra import module_product
from sglpy.grammar.rtn.build import regex_to_module
from sglpy.grammar.rtn.guide import StackGuide
from sglpy.grammar.rtn.program import Program
from sglpy.grammar.tokens.masks import MaskTable, WalkTables
from sglpy.grammar.testing import mask_to_ids, small_vocab_info

INFO = small_vocab_info()
LAYOUT = (r"\{", r"\}", r"\[", r"\]", ", ", ": ")


@pytest.fixture
def calls_everywhere(monkeypatch):
    """Every prefix-free module is called (not copied), so small tests exercise the call machinery."""
    monkeypatch.setattr(rtn, "CALL_MIN", 1)


# Sub-languages: prefix-free ones (bracketed) can be called; the others are stepped inline.
SUBS = [r"\[a*\]", r"\[(?:ab|b)\]", r"\{b?\}", r"a|ab", r"b*", r"\[(?:a|\[b\])*\]"]
PIECE = st.sampled_from(["a", "b", "(?:a|b)", "a*", "A0", "A1", "A2", "A3", "A4", "A5"])


@st.composite
def regexes(draw):
    """A random regex over a, b, brackets and atom markers A0..A5 (standing for SUBS)."""
    parts = draw(st.lists(PIECE, min_size=1, max_size=5))
    text = "".join(parts)
    if draw(st.booleans()):
        text = f"(?:{text}|{draw(PIECE)})"
    if draw(st.booleans()):
        text = f"(?:{text})*"
    return text


def _build(text: str):
    """(module over atoms, the same language as a plain Python regex)."""
    atoms, plain = {}, text
    for i, sub in enumerate(SUBS):
        if f"A{i}" in text:
            atoms[ATOM_BASE + i] = regex_to_module(sub, 10_000)
    for i, sub in enumerate(SUBS):
        text = text.replace(f"A{i}", chr(ATOM_BASE + i))
        plain = plain.replace(f"A{i}", f"(?:{sub})")
    return regex_to_module(text, 10_000, atoms=atoms), re.compile(plain)


def _strings(rng: random.Random, n: int = 150) -> list[str]:
    return ["".join(rng.choice("ab[]{}") for _ in range(rng.randrange(0, 9))) for _ in range(n)]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=regexes(), seed=st.integers(0, 1000))
def test_module_language_equals_the_regex(calls_everywhere, text, seed):
    mod, plain = _build(text)
    prog, flat = Program(mod), flatten(mod, 100_000)
    rng = random.Random(seed)
    for s in _strings(rng):
        want = plain.fullmatch(s) is not None
        assert prog.fullmatch(s.encode()) == want, (text, s)
        assert flat.fullmatch(s.encode()) == want, (text, s)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(a=regexes(), b=regexes(), op=st.sampled_from(["and", "or", "diff"]), seed=st.integers(0, 1000))
def test_module_product_is_exact(calls_everywhere, a, b, op, seed):
    ma, pa = _build(a)
    mb, pb = _build(b)
    prod = Program(module_product(ma, mb, op, 100_000))
    rng = random.Random(seed)
    for s in _strings(rng):
        x, y = pa.fullmatch(s) is not None, pb.fullmatch(s) is not None
        want = x and y if op == "and" else x or y if op == "or" else x and not y
        assert prod.fullmatch(s.encode()) == want, (a, b, op, s)


def test_modules_are_called_not_copied(calls_everywhere):
    sub = regex_to_module(r"\[(?:a|b|c){1,40}\]", 10_000)
    uses = "".join(chr(ATOM_BASE) + str(i % 10) for i in range(30))  # the definition used 30 times
    mod = regex_to_module(uses, 10_000, atoms={ATOM_BASE: sub})
    assert mod.entries and all(e.callee is sub for e in mod.entries)
    assert mod.total_states() < flatten(mod, 10**6).num_states / 10


def _json_texts(rng: random.Random, depth: int = 0):
    """Random JSON values in the compact layout (as the compiler generates them)."""
    k = rng.randrange(6 if depth < 4 else 3)
    if k == 0:
        return rng.choice(['"a"', '"b c"', '""'])
    if k == 1:
        return rng.choice(["1", "-2.5", "0"])
    if k == 2:
        return rng.choice(["true", "false", "null"])
    if k == 3:
        return "[" + ", ".join(_json_texts(rng, depth + 1) for _ in range(rng.randrange(3))) + "]"
    items = [f'"{rng.choice("ab")}": {_json_texts(rng, depth + 1)}' for _ in range(rng.randrange(3))]
    return "{" + ", ".join(items) + "}"


def test_loose_is_recursive_and_universal():
    u = Program(loose_module(LAYOUT))
    rng = random.Random(0)
    for _ in range(300):
        t = _json_texts(rng)
        assert u.fullmatch(t.encode()) == (not re.fullmatch(r"-?[0-9.]+", t))  # numbers are inline, not in loose
    deep = "[" * 200 + "]" * 200
    assert u.fullmatch(deep.encode())
    assert not u.fullmatch(b"[[]")
    with pytest.raises(Exception, match="without bound"):
        flatten(loose_module(LAYOUT), 10**6)


SCHEMAS = [
    {"type": "array", "items": {"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "v": {}}}},
    {"oneOf": [{"type": "object", "properties": {"t": {"const": "x"}, "a": {"type": "integer"}}, "required": ["t"]},
               {"type": "object", "properties": {"t": {"const": "y"}, "b": {"type": "string"}}, "required": ["t"]}]},
    {"not": {"type": "object", "required": ["a"]}},
    {"type": "object", "properties": {"a": {"type": "object", "properties": {"b": {"type": "array", "items": {
        "type": "object", "properties": {"c": {"type": "string", "maxLength": 3}}}}}}}},
    {"type": "object", "properties": {f"p{i}": {"type": "object", "properties": {
        "x": {"type": "integer"}, "y": {"type": "string"}}} for i in range(12)}},
]


@pytest.mark.parametrize("walk", ["native", "reference"])
@pytest.mark.parametrize("schema", SCHEMAS)
def test_stack_guide_masks_equal_the_flat_guide(calls_everywhere, schema, walk):
    """Same masks, finality, forced bytes as the flattened DFA's guide along random walks; rows are computed on
    first visit (native trie walk or the numpy reference), also after the guide was pickled half-way."""
    info = INFO
    if walk == "native":
        from sglpy.kernels.trie_walk import native_trie_walker

        if not native_trie_walker().ready():
            pytest.skip("no native kernels on this machine")
        info = dataclasses.replace(INFO, walker=native_trie_walker())
    mod = compile_schema(schema).module
    prog = Program(mod)
    table = MaskTable(WalkTables.of_program(prog), info, native=walk == "native")
    sg, rg = StackGuide(mod, info, program=prog, table=table), RegexGuide(flat_minimal(mod, 10**6), INFO)
    assert len(sg.table) == 0  # nothing indexed at compile time
    rng = random.Random(1)
    for _ in range(15):
        s1, s2 = sg.initial_state, rg.initial_state
        for _ in range(120):
            m1, m2 = sg.allowed(s1), rg.allowed(s2)
            assert np.array_equal(m1, m2), (schema, s1)
            assert sg.is_final(s1) == rg.is_final(s2)
            assert sg.can_continue(s1) == rg.can_continue(s2)
            assert sg.forced_bytes(s1) == rg.forced_bytes(s2)
            ids = mask_to_ids(m1, INFO.vocab_size)
            t = int(ids[rng.randrange(len(ids))])
            s1, s2 = sg.advance(s1, t), rg.advance(s2, t)
            if sg.is_terminated(s1):
                break
        sg = pickle.loads(pickle.dumps(sg))  # the rows computed so far travel; the next walk adds to them
    assert len(sg.table) > 1


ITEM = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 8} for i in range(6)}}
SHARED = {"$defs": {"item": ITEM}, "type": "object", "properties": {f"p{i}": {"$ref": "#/$defs/item"} for i in range(25)}}


def test_stack_guide_pickles_and_saves(tmp_path):
    schema = SHARED
    comp = GrammarCompiler(INFO, cache_dir=str(tmp_path), cache_size=0)
    g = comp.compile_json_schema(schema)
    assert isinstance(g, StackGuide)
    again = pickle.loads(pickle.dumps(g))
    cached = comp.compile_json_schema(schema)  # read back from the disk cache
    assert isinstance(cached, StackGuide) and cached.schema_info == g.schema_info
    text = json.dumps({"p0": {"f1": "xy"}, "p3": {}}, separators=(", ", ": ")).encode()
    for guide in (g, again, cached):
        s = guide.advance_bytes(guide.initial_state, text)
        assert guide.is_final(s) and len(s) == 1
        assert np.array_equal(guide.allowed(guide.initial_state), g.allowed(g.initial_state))
    with pytest.raises(ValueError):
        g.advance_bytes(g.initial_state, b'{"p0": 1}')
    with pytest.raises(ValueError, match="invalid guide state"):
        g.allowed((10**9,))


def test_shared_definitions_stay_one_module():
    """A definition referenced from many places is built once and called from each."""
    mod = compile_schema(SHARED).module
    callees = {id(e.callee) for e in mod.entries}
    assert len(callees) <= 2
    assert mod.total_states() < 3000


def test_stack_guide_travels_like_compile_workers_send_it():
    """pack_guide/unpack_guide (runtime/engine/grammar_worker.py): the TokenizerInfo stays behind as a reference, the
    network travels, and the receiving side computes the rows of the states its generations reach."""
    from sglpy.runtime.engine.grammar_worker import pack_guide, unpack_guide

    mod = compile_schema(SHARED).module
    g = StackGuide(mod, INFO)
    _ = INFO.flat_trie, INFO.string_rest  # tables of the TokenizerInfo travel as references, once built
    payload = pack_guide(g, INFO)
    assert b"TokenizerInfo" not in payload and b"TokenTrie" not in payload and b"FlatTrie" not in payload
    h = unpack_guide(payload, INFO)
    assert h.info is INFO and len(h.table) == 0
    rng = random.Random(3)
    s1 = s2 = g.initial_state
    for _ in range(200):
        m1, m2 = g.allowed(s1), h.allowed(s2)
        assert np.array_equal(m1, m2)
        ids = mask_to_ids(m1, INFO.vocab_size)
        t = int(ids[rng.randrange(len(ids))])
        s1, s2 = g.advance(s1, t), h.advance(s2, t)
        if g.is_terminated(s1):
            break
    assert len(h.table) > 1

"""The native token-trie walk (kernels/trie_walk.py) against the numpy reference (grammar/tokens/masks.py), and the lazy
mask table: rows computed on first visit, shared, pickled with the rows so far."""

import dataclasses
import pickle
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import sglpy.grammar.rtn.module as rtn
from sglpy.grammar import TokenizerInfo
from sglpy.grammar.regex.pattern import regex_to_dfa
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.rtn.guide import StackGuide
from sglpy.grammar.rtn.program import Program
from sglpy.grammar.tokens.masks import MaskTable, WalkTables, walk_state_reference
from sglpy.grammar.testing import small_vocab_info
from sglpy.grammar.tokens.vocab import FlatTrie
from sglpy.kernels.trie_walk import native_trie_walker

WALKER = native_trie_walker()
pytestmark = pytest.mark.skipif(not WALKER.ready(), reason="no native kernels on this machine")
ALPHABET = b'ab"{}[], :1\\'
INFO = dataclasses.replace(small_vocab_info(), walker=WALKER)


def _vocab(tokens: list[bytes]) -> TokenizerInfo:
    return TokenizerInfo(tuple([None] + tokens), eos_token_ids=(0,))


def _rows_agree(tables: WalkTables, info: TokenizerInfo) -> None:
    for g in range(1, tables.num_states):
        mask, ct, co = WALKER.walk(info.flat_trie, tables, g, info.mask_words)
        ref_mask, rt, ro = walk_state_reference(tables, info, g)
        assert np.array_equal(mask, ref_mask), g
        assert sorted(zip(ct.tolist(), co.tolist())) == sorted(zip(rt.tolist(), ro.tolist())), g


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.binary(min_size=1, max_size=5).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b)),
                       min_size=1, max_size=40),
       pattern=st.sampled_from([r'"[ab]*"', r'\[(1|a)*\]', r'\{"a": [0-9]+(, "b": "[^"]{0,3}")?\}', r'(ab|a)*b',
                                r'[ab]{2,4}', r'"(\\"|[ab])*"']))
def test_native_walk_equals_reference_on_dfas(tokens, pattern):
    info = _vocab(tokens)
    _rows_agree(WalkTables.of_dfa(regex_to_dfa(pattern, 10_000)), info)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=st.lists(st.binary(min_size=1, max_size=6).map(lambda b: bytes(ALPHABET[x % len(ALPHABET)] for x in b)),
                       min_size=1, max_size=60),
       schema=st.sampled_from([
           {"type": "array", "items": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {}}}},
           {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "object", "properties": {
               "b": {"type": "string"}, "c": {}}}}}},
       ]))
def test_native_walk_equals_reference_on_module_networks(tokens, schema):
    """Calls and returns inside a token, and the tokens that leave the start frame (with their offsets)."""
    old, rtn.CALL_MIN = rtn.CALL_MIN, 1  # every prefix-free module is called, not copied
    try:
        prog = Program(compile_schema(schema).module)
    finally:
        rtn.CALL_MIN = old
    _rows_agree(WalkTables.of_program(prog), _vocab(tokens))


STRING_TOKENS = st.lists(st.text(alphabet='ab"\\é€ 😀', min_size=1, max_size=20).map(lambda t: t.encode()),
                         min_size=1, max_size=50)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tokens=STRING_TOKENS, schema=st.sampled_from([
    {"type": "string", "maxLength": 3}, {"type": "string", "minLength": 2, "maxLength": 6},
    {"type": "array", "items": {"type": "string", "maxLength": 2}}, {"type": "string"},
    {"type": "string", "pattern": "^[ab]{0,4}$"}, {"enum": ["ab", "a\"b", "é€"]},
    {"type": "object", "properties": {"a": {"type": "string", "maxLength": 4}, "b": {}}}]))
def test_rows_equal_a_full_walk(tokens, schema):
    """A row skips the walk of whole-character string tokens where the state's string characters form a chain
    (free strings, maxLength chains): every row still equals the full walk of every token."""
    info = dataclasses.replace(_vocab(tokens), walker=WALKER)
    old, rtn.CALL_MIN = rtn.CALL_MIN, 1
    try:
        prog = Program(compile_schema(schema).module)
    finally:
        rtn.CALL_MIN = old
    tables = WalkTables.of_program(prog)
    for native in (True, False):
        table = MaskTable(tables, info, native=native)
        for g in range(1, tables.num_states):
            mask, ct, co = walk_state_reference(tables, info, g)
            row = table.row(g)
            got = row.mask.view(np.uint32).copy()
            got[0] &= ~np.uint32(1)  # EOS (token 0) where the document may end
            assert np.array_equal(got, mask), (schema, g, native)
            assert sorted(zip(row.cross_tok.tolist(), row.cross_off.tolist())) == sorted(zip(ct.tolist(), co.tolist()))


def test_flat_trie_lists_the_tokens_of_each_subtree():
    tokens = [b"ab", b"abc", b"b", b"ab", b"a\xff", b"ba"]
    trie = FlatTrie.build([None] + tokens)
    prefix, path = [], []
    for i in range(len(trie.byte)):
        path = path[: max(int(trie.depth[i]) - 1, 0)] + ([int(trie.byte[i])] if i else [])
        prefix.append(bytes(path))
    for i, p in enumerate(prefix):
        here = sorted(trie.tok_ids[trie.tok_lo[i]: trie.tok_lo[i + 1]].tolist())
        below = sorted(trie.tok_ids[trie.tok_lo[i + 1]: trie.tok_lo[trie.end[i]]].tolist())
        assert here == [k + 1 for k, t in enumerate(tokens) if t == p]
        assert below == [k + 1 for k, t in enumerate(tokens) if t.startswith(p) and len(t) > len(p)]
    assert trie.max_depth == 3 and len(set(prefix)) == len(prefix)


def test_crossing_tokens_native_equal_python():
    """The per-stack check of frame-leaving tokens: native and Python agree on every stack a walk meets."""
    old, rtn.CALL_MIN = rtn.CALL_MIN, 1
    try:
        mod = compile_schema({"type": "array", "items": {"type": "object", "properties": {
            "k": {"enum": ["a", "b"]}, "v": {}}}}).module
    finally:
        rtn.CALL_MIN = old
    prog = Program(mod)
    fast = StackGuide(mod, INFO, program=prog, table=MaskTable(WalkTables.of_program(prog), INFO, native=True))
    slow = StackGuide(mod, INFO, program=prog, table=MaskTable(WalkTables.of_program(prog), INFO, native=False))
    text = b'[{"k": "a", "v": [1, {"x": null}, "s"]}, {"v": "s"}, {}]'
    s = fast.initial_state
    deep = 0
    for i in range(len(text) + 1):
        assert np.array_equal(fast.allowed(s), slow.allowed(s)), s
        deep += len(s) > 1
        if i < len(text):
            s = fast.advance_bytes(s, text[i: i + 1])
    assert deep > 5


def test_mask_table_is_lazy_shared_and_thread_safe():
    prog = Program(compile_schema({"type": "object", "properties": {"a": {"type": "string"}}}).module)
    table = MaskTable(WalkTables.of_program(prog), INFO)
    assert len(table) == 0
    states = list(range(1, prog.num_states))
    out: list = []
    threads = [threading.Thread(target=lambda: out.append([table.row(g).mask for g in states])) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(table) == len(states)
    for rows in out:  # one row per state, whichever thread computed it
        assert all(a is b for a, b in zip(rows, out[0]))
    again = pickle.loads(pickle.dumps(table))
    assert len(again) == len(states) and all(np.array_equal(again.row(g).mask, table.row(g).mask) for g in states)

"""Structural-tag guides: any accepted string is free text without a trigger, or trigger-opened regions of valid JSON."""

from __future__ import annotations

import json
import pickle
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.structural_tag import StructuralTag, no_trigger_dfa
from sglpy.grammar.testing import random_walk, small_vocab_info

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": 0, "maximum": 99},
                                          "ok": {"type": "boolean"}}, "required": ["x"], "additionalProperties": False}
NAME = {"type": "object", "properties": {"n": {"enum": ["a", "bc"]}}, "required": ["n"], "additionalProperties": False}
SPEC = {"structures": [{"begin": "<f=p>", "schema": POINT, "end": "</f>"},
                       {"begin": "<f=n>", "schema": NAME, "end": "</f>"}], "triggers": ["<f="]}
SCHEMA_OF = {"<f=p>": POINT, "<f=n>": NAME}
INFO = small_vocab_info([b"x<f", b"=p>{", b"}</f>y", b"<f=p>", b"</f>", b"ab<"])


@pytest.fixture(scope="module")
def compiler():
    return GrammarCompiler(INFO)


def oracle(text: str, spec: dict) -> int:
    """Number of regions if `text` is in the tag's language (free text never holds a trigger), else -1."""
    trig, free = spec["triggers"], spec.get("free_text", True)
    pos, count, dec = 0, 0, json.JSONDecoder()
    while pos < len(text):
        if free:
            hits = [i for i in (text.find(t, pos) for t in trig) if i >= 0]
            if not hits:
                return count
            pos = min(hits)
        elif count:
            if not text.startswith(spec.get("separator", "\n"), pos):
                return -1
            pos += len(spec.get("separator", "\n"))
        s = next((s for s in spec["structures"] if text.startswith(s["begin"], pos)), None)
        if s is None:
            return -1
        try:
            value, end = dec.raw_decode(text, pos + len(s["begin"]))
            jsonschema.validate(value, s["schema"])
        except (ValueError, jsonschema.ValidationError):
            return -1
        if not text.startswith(s["end"], end):
            return -1
        pos, count = end + len(s["end"]), count + 1
    return count if free or count else -1


def accepts(guide, text: str) -> bool:
    try:
        return guide.is_final(guide.advance_bytes(guide.initial_state, text.encode()))
    except ValueError:
        return False


def test_free_text_tags_and_straddling_tokens(compiler):
    g = compiler.compile("structural_tag", json.dumps(SPEC))
    assert accepts(g, "") and accepts(g, "hello <f <= f= done")
    assert accepts(g, 'a<f=p>{"x": 5}</f> b <f=n>{"n": "bc"}</f>')
    assert not accepts(g, "a<f=q>")  # a trigger must open a structure
    assert not accepts(g, '<f=p>{"x": 500}</f>')  # the schema holds inside
    assert not accepts(g, '<f=p>{"x": 5}')  # inside a region: not final, EOS refused
    # one token may hold the end of the free text and the start of the region ("x<f", "=p>{")
    s = g.initial_state
    for tok in (b"x<f", b"=p>{"):
        s = g.advance(s, INFO.token_bytes.index(tok))
    assert g.forced_string(s) == '"x": '  # jump-forward works inside the region
    assert g.is_final(g.advance_bytes(s, b'"x": 1}</f>'))


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1))
def test_random_walks_are_in_the_language(compiler, seed):
    g = compiler.compile("structural_tag", json.dumps(SPEC))
    prefer = frozenset(INFO.token_bytes.index(t) for t in (b"<f=p>", b"<", b"x<f", b"}</f>y"))
    w = random_walk(g, random.Random(seed), max_steps=120, eos_bias=0.05, prefer=prefer, prefer_bias=0.3)
    if w.finished:
        assert oracle(w.data.decode("utf-8", "replace"), SPEC) >= 0, w.data


@settings(max_examples=80, deadline=None)
@given(st.lists(st.one_of(st.text(alphabet="ab<f=p> \n", max_size=8),
                          st.builds(lambda x, ok: f'<f=p>{json.dumps({"x": x, "ok": ok})}</f>',
                                    st.integers(-5, 120), st.booleans())), max_size=5))
def test_guide_agrees_with_the_oracle(compiler, parts):
    g = compiler.compile("structural_tag", json.dumps(SPEC))
    text = "".join(parts)
    assert accepts(g, text) == (oracle(text, SPEC) >= 0), text


def test_required_mode_and_max_tags(compiler):
    req = compiler.compile("structural_tag", json.dumps({**SPEC, "free_text": False, "max_tags": 2}))
    assert req.forced_string(req.initial_state) == "<f="
    assert accepts(req, '<f=p>{"x": 1}</f>') and accepts(req, '<f=p>{"x": 1}</f>\n<f=n>{"n": "a"}</f>')
    assert not accepts(req, "") and not accepts(req, 'x<f=p>{"x": 1}</f>')
    assert not accepts(req, '<f=p>{"x": 1}</f>\n<f=p>{"x": 1}</f>\n<f=p>{"x": 1}</f>')
    one = compiler.compile("structural_tag", json.dumps({**SPEC, "max_tags": 1}))
    s = one.advance_bytes(one.initial_state, b'hi <f=p>{"x": 1}</f>')
    assert one.is_final(s) and not one.can_continue(s)  # the first call ends the output


@pytest.mark.parametrize("spec,words", [
    ({"structures": [], "triggers": ["<"]}, ["structures"]),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<b"]}, ["does not start"]),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<", "<a"]}, ["part of"]),
    ({"structures": [{"begin": "<a>", "schema": {"type": "string", "pattern": "(x"}, "end": ""}], "triggers": ["<"]},
     ["structures[0].schema"]),
    ({"structures": [{"begin": "<a>", "end": ""}], "triggers": ["<"], "bogus": 1}, ["bogus"]),
    ({"structures": [{"begin": "<a>", "schema": {}, "end": ""}], "triggers": ["<"], "max_tags": 0}, ["max_tags"]),
])
def test_bad_specs_name_the_problem(compiler, spec, words):
    with pytest.raises(GrammarError) as e:
        compiler.compile("structural_tag", json.dumps(spec))
    for w in words:
        assert w in str(e.value)


def test_no_trigger_automaton_and_pickling(compiler):
    dfa = no_trigger_dfa(("ab", "ba"))
    assert dfa.fullmatch(b"aaxbb") and not dfa.fullmatch(b"xab") and not dfa.fullmatch(b"bba")
    g = compiler.compile("structural_tag", StructuralTag.parse(SPEC).to_json())
    g2 = pickle.loads(pickle.dumps(g))  # compiles run in worker processes: the guide travels pickled
    assert accepts(g2, '<f=n>{"n": "a"}</f>') and not accepts(g2, "<f=")

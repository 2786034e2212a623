"""Recursive schemas compile to modules that call themselves: deep instances are accepted and generated, every
generated instance is valid, and a recursion the calls cannot express is unrolled instead (still exact)."""

import json
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarCompiler
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.testing import mask_to_ids, small_vocab_info

INFO = small_vocab_info()
COMPILER = GrammarCompiler(INFO)
EOS = frozenset(INFO.eos_token_ids)
OPENERS = frozenset(i for i, b in enumerate(INFO.token_bytes) if b and b[:1] in (b"{", b"[", b","))
CLOSERS = frozenset(i for i, b in enumerate(INFO.token_bytes) if b and b[:1] in (b"}", b"]", b'"', b"0", b"1"))

TREE = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer", "minimum": 0}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
# mutual recursion through a oneOf of objects told apart by a discriminator (the shape of content schemas)
MUTUAL = {"$schema": "http://json-schema.org/draft-04/schema#", "definitions": {
    "story": {"type": "object", "properties": {"type": {"enum": ["story"]}, "promo": {"$ref": "#/definitions/promo"}},
              "required": ["type"], "additionalProperties": False},
    "image": {"type": "object", "properties": {"type": {"enum": ["image"]}, "credit": {"type": "string"}},
              "required": ["type"], "additionalProperties": False},
    "promo": {"type": "object", "properties": {
        "basic": {"oneOf": [{"$ref": "#/definitions/story"}, {"$ref": "#/definitions/image"}]}},
        "patternProperties": {"^x": {"oneOf": [{"$ref": "#/definitions/story"}, {"$ref": "#/definitions/image"}]}},
        "additionalProperties": False}},
    "$ref": "#/definitions/story"}
# a recursive position inside an alternation whose branches start alike (`contains`: matching / not matching
# items): the calls cannot express it, so it is unrolled
CONTAINS = {"$defs": {"node": {"type": "object", "properties": {
    "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                       "contains": {"required": ["v"], "properties": {"v": {"const": 1}}}}},
    "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"}


def _depth(v) -> int:
    if isinstance(v, dict):
        return 1 + max(map(_depth, v.values()), default=0)
    if isinstance(v, list):
        return 1 + max(map(_depth, v), default=0)
    return 0


def _walks(schema, n: int, seed: int = 0, prefix: bytes = b"") -> list:
    """Documents drawn from the guide after `prefix`: nesting first (openers preferred), then closing."""
    guide = COMPILER.compile_json_schema(schema)
    rng, docs = random.Random(seed), []
    for _ in range(n):
        state = guide.advance_bytes(guide.initial_state, prefix)
        data = bytearray(prefix)
        for _ in range(40):  # the random walk's own nesting
            ids = mask_to_ids(guide.allowed(state), INFO.vocab_size)
            ids = [t for t in ids if t not in EOS]
            if not ids:
                break
            opening = [t for t in ids if t in OPENERS]
            tok = int(rng.choice(opening if opening and rng.random() < 0.7 else ids))
            state = guide.advance(state, tok)
            data += INFO.token_bytes[tok]
        rest = random_walk_from(guide, state, rng)
        if rest is not None:
            docs.append(json.loads(bytes(data) + rest))
    return docs


def random_walk_from(guide, state, rng, steps: int = 600):
    data = bytearray()
    for _ in range(steps):
        ids = mask_to_ids(guide.allowed(state), INFO.vocab_size)
        if any(t in EOS for t in ids):
            return bytes(data)
        closing = [t for t in ids if t in CLOSERS]
        tok = int(rng.choice(closing or list(ids)))
        state = guide.advance(state, tok)
        data += INFO.token_bytes[tok]
    return None


@pytest.mark.parametrize("schema,prefix", [(TREE, b'{"v": 0, "kids": [' * 30),
                                           (MUTUAL, b'{"type": "story", "promo": {"basic": ' * 20)],
                         ids=["tree", "mutual"])
def test_deep_instances_are_generated_and_valid(schema, prefix):
    """Far deeper than any unrolling bound (max_recursion_depth 3; instances used to nest at most 16 levels)."""
    validator = jsonschema.validators.validator_for(schema)(schema)
    shallow, deep = _walks(schema, 10), _walks(schema, 6, prefix=prefix)
    assert len(shallow) >= 6 and len(deep) >= 4
    for d in shallow + deep:
        assert validator.is_valid(d), d
    assert min(map(_depth, deep)) >= 30


def test_recursion_is_one_module_per_definition():
    for schema in (TREE, MUTUAL):
        assert compile_schema(schema).module.total_states() < 400


@settings(max_examples=40, deadline=None)
@given(doc=st.recursive(st.fixed_dictionaries({"v": st.integers(0, 3)}),
                        lambda kids: st.fixed_dictionaries({"v": st.integers(0, 3), "kids": st.lists(kids, max_size=3)}),
                        max_leaves=30))
def test_tree_accepts_exactly_the_valid_trees(doc):
    """Every valid tree (any depth) is accepted; a tree with a negative value anywhere is not."""
    matcher = compile_schema(TREE).dfa
    text = json.dumps(_schema_order(doc), separators=(", ", ": "))
    assert matcher.fullmatch(text.encode())
    bad = text.replace('"v": 3', '"v": -3')
    if bad != text:
        assert not matcher.fullmatch(bad.encode())


def _schema_order(node: dict) -> dict:
    return {"v": node["v"], **({"kids": [_schema_order(k) for k in node["kids"]]} if "kids" in node else {})}


def test_recursion_in_an_alternation_is_unrolled_and_exact():
    validator = jsonschema.Draft202012Validator(CONTAINS)
    docs = _walks(CONTAINS, 10, seed=1)
    assert docs
    for d in docs:
        assert validator.is_valid(d), d
    matcher = compile_schema(CONTAINS).dfa
    ok = {"v": 0, "kids": [{"v": 1}, {"v": 2, "kids": [{"v": 1}]}]}
    assert matcher.fullmatch(json.dumps(ok, separators=(", ", ": ")).encode())
    no_match = {"v": 0, "kids": [{"v": 2}]}
    assert not matcher.fullmatch(json.dumps(no_match, separators=(", ", ": ")).encode())

"""The heavy tail of JSON schemas: key-presence logic and discriminated oneOfs compile without automaton products,
and stay exact (every accepted text valid, every valid text in the generated order accepted)."""

import itertools
import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarError
from sglpy.grammar.json import automata
from sglpy.grammar.json.schema import compile_schema

KEYS = ["a", "b", "c", "d"]
PROPS = {k: {"type": "integer"} for k in KEYS}
# every object over the named keys in schema order, a wrong-typed value, and non-objects
OBJECTS = [dict(zip(ks, vs)) for n in range(len(KEYS) + 1) for ks in itertools.combinations(KEYS, n)
           for vs in itertools.product([1, 2], repeat=n)]
INSTANCES = OBJECTS + [{"a": "x"}, {"a": 1, "b": "x"}, 1, "x", [], None]


def _text(v) -> bytes:
    return json.dumps(v, separators=(", ", ": ")).encode()


def _check_exact(schema) -> None:
    v = jsonschema.Draft202012Validator(schema)
    try:
        dfa = compile_schema(schema).dfa
    except GrammarError as e:  # only when nothing is valid
        assert "admits no document" in str(e) and not any(v.is_valid(x) for x in INSTANCES), schema
        return
    for x in INSTANCES:
        assert dfa.fullmatch(_text(x)) == v.is_valid(x), (schema, x)


@pytest.fixture
def products(monkeypatch):
    """Count the automaton products (and / or / diff) a compile builds."""
    calls = []
    real = automata.module_product

    def counting(*args, **kwargs):
        calls.append(args[2])
        return real(*args, **kwargs)

    monkeypatch.setattr(automata, "module_product", counting)
    return calls


REQ = st.lists(st.sampled_from(KEYS), min_size=1, max_size=3, unique=True)
KEY_LOGIC = st.one_of(
    st.builds(lambda rs: {"oneOf": [{"required": r} for r in rs]}, st.lists(REQ, min_size=2, max_size=3)),
    st.builds(lambda r: {"not": {"required": r}}, REQ),
    st.builds(lambda r: {"not": {"type": "object", "required": r}}, REQ),
    st.builds(lambda k, r: {"dependentRequired": {k: r}}, st.sampled_from(KEYS), REQ),
    st.builds(lambda rs: {"anyOf": [{"required": r} for r in rs]}, st.lists(REQ, min_size=1, max_size=3)),
    st.builds(lambda k: {"not": {"properties": {k: {"const": 1}}}}, st.sampled_from(KEYS)),
    st.builds(lambda k, r: {"if": {"properties": {k: {"const": 1}}}, "then": {"required": r}},
              st.sampled_from(KEYS), REQ),
    st.builds(lambda k, ks: {"if": {"not": {"properties": {k: {"const": 2}}}},  # one key set: the others not 1
                             "then": {"properties": {x: {"not": {"const": 1}} for x in ks}}},
              st.sampled_from(KEYS), REQ),
    st.builds(lambda rs: {"oneOf": [{"properties": {k: {"const": 1}}} for k in rs]},
              st.lists(st.sampled_from(KEYS), min_size=2, max_size=3, unique=True)),
)


@settings(max_examples=60, deadline=None)
@given(parts=st.lists(KEY_LOGIC, min_size=1, max_size=3), req=st.lists(st.sampled_from(KEYS), max_size=2, unique=True),
       typed=st.booleans())
def test_key_presence_logic_is_exact(parts, req, typed):
    schema = {"properties": PROPS, "required": req, "allOf": parts, "additionalProperties": False}
    if typed:
        schema["type"] = "object"
    _check_exact(schema)


def test_key_presence_logic_builds_no_product(products):
    """not-required, required-only oneOf branches and dependentRequired become choices of absent keys."""
    for schema in ({"type": "object", "properties": PROPS, "not": {"required": ["a", "b"]}},
                   {"type": "object", "properties": PROPS, "oneOf": [{"required": ["a", "b"]}, {"required": ["c"]}]},
                   {"type": "object", "properties": PROPS, "dependentRequired": {"a": ["b", "c"]}},
                   {"type": "object", "properties": PROPS, "additionalProperties": False,
                    "allOf": [{"not": {"required": ["a", "b"]}}, {"not": {"required": ["a", "c"]}}],
                    "oneOf": [{"required": ["d", "a"]}, {"required": ["d", "b", "c"]}]}):
        _check_exact(schema)
    assert products == []


def test_discriminator_outside_the_one_of_proves_exclusivity(products):
    """`required: [kind]` next to the oneOf and `kind: {enum: [...]}` in each branch: disjoint by the keywords."""
    branch = lambda tag, extra: {"properties": {"kind": {"enum": [tag]}, "x": extra}}  # noqa: E731
    schema = {"type": "object", "required": ["kind", "x"],
              "oneOf": [branch("a", {"type": "integer"}), branch("b", {"type": "string"}),
                        branch("c", {"type": "object", "properties": {"y": {"type": "integer"}}})]}
    res = compile_schema(schema)
    assert products == []
    v = jsonschema.Draft202012Validator(schema)
    for doc in [{"kind": "a", "x": 1}, {"kind": "b", "x": "s"}, {"kind": "c", "x": {"y": 2}}, {"kind": "c", "x": {}}]:
        assert v.is_valid(doc) and res.dfa.fullmatch(_text(doc)), doc
    for doc in [{"kind": "a", "x": "s"}, {"kind": "d", "x": 1}, {"x": 1}]:
        assert not res.dfa.fullmatch(_text(doc)), doc


def test_recursive_definition_reached_along_many_paths_is_built_once_per_level(monkeypatch):
    """A $ref cycle shapes its results (recursion cut-offs): they are cached per (level, $ref counts), so six
    recursive properties three levels deep build a handful of objects, not one per path (6^3)."""
    from sglpy.grammar.json import objects

    calls = []
    real = objects.object_under
    monkeypatch.setattr(objects, "object_under", lambda conv, n, ctx: calls.append(1) or real(conv, n, ctx))
    props = {f"p{i}": {"$ref": "#/$defs/node"} for i in range(6)}
    schema = {"$defs": {"node": {"type": "object", "properties": {**props, "v": {"type": "integer"}}}},
              "$ref": "#/$defs/node"}
    res = compile_schema(schema)
    assert len(calls) <= 16
    v = jsonschema.Draft202012Validator(schema)
    for doc in [{}, {"p0": {"v": 1}}, {"p1": {"p2": {"v": 1}}, "v": 2}, {"p5": {"p0": {}}, "v": 3}]:
        assert v.is_valid(doc) and res.dfa.fullmatch(_text(doc)), doc
    assert not res.dfa.fullmatch(_text({"p0": {"v": "x"}}))


def test_negated_integer_multiple_of_rejects_every_spelling_of_a_multiple():
    """over(integer, multipleOf) holds "-0.0" (0 after json.loads), so `not` never generates it."""
    dfa = compile_schema({"not": {"type": "integer", "multipleOf": 3}}).dfa
    for text in ("0", "-0", "0.0", "-0.0", "-0.00", "3", "3.0", "-6.0"):
        assert not dfa.fullmatch(text.encode()), text
    assert dfa.fullmatch(b"1") and dfa.fullmatch(b"0.5")

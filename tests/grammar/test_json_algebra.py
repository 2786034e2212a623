"""Keywords enforced through automaton algebra: exact on enumerated instances, and random schemas' walks validate."""

import itertools
import json
import re
import random

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.testing import random_walk, small_vocab_info

INFO = small_vocab_info()
COMPILER = GrammarCompiler(INFO)
V = jsonschema.Draft202012Validator

SCALARS = [None, True, False, 0, 1, 2, 3, 6, -4, 1.5, 2.0, "", "a", "ab", "abc", "b", "xy1"]
OBJECTS = [{}, {"a": 1}, {"b": 1}, {"a": 1, "b": 2}, {"b": "x", "a": 1}, {"a": "s"}, {"c": 3}, {"a": 1, "c": 2},
           {"x1": 1}, {"x1": "s", "a": 2}, {"a": 1, "b": 2, "c": 3}]
ARRAYS = [[], [1], [1, 1], [1, 2], [2, 1], ["a"], [1, "a"], [1, 2, 3], [True, False], [None], [3, 3, 3]]
INSTANCES = SCALARS + OBJECTS + ARRAYS


def _text(v) -> bytes:
    return json.dumps(v, separators=(", ", ": "), ensure_ascii=False).encode()


# (schema, instances that must be accepted: valid ones in the generated layout and key order)
EXACT = [
    ({"not": {"type": "string"}}, [None, 1, 1.5, {}, [1]]),
    ({"type": "integer", "not": {"multipleOf": 2}}, [1, 3, -1]),
    ({"oneOf": [{"type": "integer"}, {"type": "number", "minimum": 2}]}, [0, 1, -4, 2.5]),
    ({"oneOf": [{"required": ["a"]}, {"required": ["b"]}], "type": "object",
      "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}, [{"a": 1}, {"b": 1}]),
    ({"if": {"type": "integer"}, "then": {"minimum": 2}, "else": {"type": "string"}}, [2, 3, "a", ""]),
    ({"type": "object", "properties": {"a": {"type": "integer"}, "b": {}},
      "dependentRequired": {"a": ["b"]}}, [{}, {"b": 1}, {"a": 1, "b": 2}]),
    ({"type": "object", "properties": {"a": {}, "b": {"type": "integer"}},
      "dependentSchemas": {"a": {"required": ["b"]}}}, [{}, {"a": 1, "b": 2}]),
    ({"type": "object", "patternProperties": {"^x": {"type": "integer"}}, "additionalProperties": False},
     [{}]),
    ({"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": {"type": "integer"}},
     [{"a": 1}]),
    ({"type": "object", "propertyNames": {"maxLength": 1}, "additionalProperties": {"type": "integer"}},
     [{}]),
    ({"type": "array", "contains": {"const": 1}, "maxContains": 1, "items": {"type": "integer"}},
     [[1], [1, 2], [2, 1]]),
    ({"type": "array", "contains": {"type": "string"}, "minContains": 2}, []),
    ({"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True}, [[], [1], [1, 2], [2, 1], [1, 2, 3]]),
    ({"type": "integer", "multipleOf": 3, "minimum": -10}, [0, 3, 6]),
    ({"type": "number", "multipleOf": 0.5, "minimum": 0, "maximum": 3}, [0, 1, 2, 1.5]),
    ({"type": "string", "format": "ipv6"}, []),
    ({"type": "string", "pattern": "^a", "not": {"pattern": "b"}}, ["a"]),
    ({"type": "object", "unevaluatedProperties": False, "properties": {"a": {}},
      "anyOf": [{"properties": {"b": {"type": "integer"}}}, {"properties": {"c": {"type": "integer"}}}]},
     [{}, {"a": 1}, {"a": 1, "b": 2}, {"a": 1, "c": 2}]),
    ({"$defs": {"n": {"type": "integer"}}, "properties": {"a": {"$ref": "#/$defs/n"}}, "type": "object"},
     [{"a": 1}]),
    ({"$id": "https://example.com/root", "$defs": {"x": {"$anchor": "num", "type": "integer"}},
      "items": {"$ref": "#num"}, "type": "array"}, [[1], [1, 2]]),
]


@pytest.mark.parametrize("schema,must_accept", EXACT)
def test_keyword_algebra_is_sound_and_accepts_valid(schema, must_accept):
    dfa = compile_schema(schema).dfa
    validator = V(schema)
    for v in INSTANCES:
        if dfa.fullmatch(_text(v)):
            assert validator.is_valid(v), (schema, v)
    for v in must_accept:
        assert validator.is_valid(v), (schema, v)
        assert dfa.fullmatch(_text(v)), (schema, v)


def test_draft4_forms():
    schema = {"$schema": "http://json-schema.org/draft-04/schema#", "id": "http://x.test/s",
              "definitions": {"n": {"type": "number", "minimum": 1, "exclusiveMinimum": True}},
              "properties": {"a": {"$ref": "#/definitions/n", "maximum": 0}, "b": {}}, "type": "object",
              "dependencies": {"a": ["b"]}, "javaType": "X", "links": []}
    res = compile_schema(schema)
    assert res.draft == "4" and {"javaType", "links"} <= set(res.ignored)
    v = jsonschema.Draft4Validator(schema)
    for doc in [{}, {"a": 1}, {"a": 1.5, "b": 1}, {"a": 2, "b": 1}, {"b": 1}]:
        if res.dfa.fullmatch(_text(doc)):
            assert v.is_valid(doc), doc
    assert res.dfa.fullmatch(_text({"a": 2, "b": 1}))  # $ref siblings (maximum 0) are ignored in draft 4


def test_annotations_and_unknown_keywords_are_listed_not_enforced():
    res = compile_schema({"type": "string", "title": "t", "x-foo": 1, "_format": "z", "format": "telephone",
                          "examples": ["a"], "javaType": "String"})
    assert {"title", "x-foo", "_format", "examples", "javaType", "format:telephone"} <= set(res.ignored)
    assert res.dfa.fullmatch(b'"anything"')


def test_refusals_name_the_keyword():
    for schema, word in [({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
                           "uniqueItems"),
                         ({"type": "string", "pattern": "(?<=a)b"}, "pattern")]:
        with pytest.raises(GrammarError, match=f"'{word}'"):
            compile_schema(schema)
    with pytest.warns(UserWarning, match="uniqueItems"):
        relaxed = compile_schema({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "minItems": 2},
                                 strict=False)
    assert relaxed.relaxed == ("uniqueItems",)


def test_fractional_multiple_of_without_both_bounds_generates_multiples_near_zero():
    """Float division is not regular: a window of multiples that jsonschema's own check accepts is generated."""
    for schema in ({"type": "number", "multipleOf": 0.1}, {"type": "number", "multipleOf": 0.25, "minimum": 7},
                   {"type": "number", "multipleOf": 0.01, "minimum": 0, "maximum": 1e12}):
        res = compile_schema(schema)
        assert res.narrowed and "multipleOf" in res.narrowed[0]
        for text in ("0", "0.5", "0.3", "7.25", "8", "-1.2", "12.34", "0.07", "1e3"):
            if res.dfa.fullmatch(text.encode()):
                assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)), (schema, text)
        assert res.dfa.fullmatch(b"8")


def test_long_max_length_is_narrowed_to_what_fits_the_state_cap():
    """maxLength 8192 needs ~70,000 states counted character by character: shorter strings are generated."""
    res = compile_schema({"type": "object", "properties": {"path": {"type": "string", "maxLength": 8192}},
                          "required": ["path"]})
    assert res.narrowed and "maxLength 8192" in res.narrowed[0]
    assert res.dfa.fullmatch(('{"path": "' + "a" * 500 + '"}').encode())
    assert not res.dfa.fullmatch(('{"path": "' + "a" * 8193 + '"}').encode())
    short = compile_schema({"type": "string", "minLength": 2, "maxLength": 40})
    assert not short.narrowed and short.dfa.fullmatch(('"' + "é" * 40 + '"').encode())
    assert not short.dfa.fullmatch(('"' + "é" * 41 + '"').encode()) and not short.dfa.fullmatch(b'"a"')


def test_unique_items_over_unbounded_items_generate_at_most_one_item():
    """Distinctness of free-form items is not regular: arrays of 0-1 items are unique, so that is generated."""
    schema = {"type": "object", "properties": {"tags": {"type": "array", "items": {"type": "string"},
                                                        "uniqueItems": True}}, "required": ["tags"]}
    res = compile_schema(schema)
    assert res.narrowed and "uniqueItems" in res.narrowed[0]
    d = res.dfa
    assert d.fullmatch(b'{"tags": []}') and d.fullmatch(b'{"tags": ["a"]}')
    assert not d.fullmatch(b'{"tags": ["a", "b"]}') and not d.fullmatch(b'{"tags": ["a", "a"]}')
    # tuple items: the same fallback; minItems >= 2 cannot fall back (refused above)
    tup = compile_schema({"type": "array", "prefixItems": [{"type": "string"}], "uniqueItems": True})
    assert tup.dfa.fullmatch(b'["x"]') and not tup.dfa.fullmatch(b'["x", "x"]')


# ---- random schemas from the supported keywords: random walks produce only valid instances ----------------
LEAF = st.one_of(
    st.just({"type": "integer"}), st.just({"type": "string"}), st.just({"type": "boolean"}), st.just({}),
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-20, 20), st.integers(0, 30)),
    st.builds(lambda m: {"type": "integer", "multipleOf": m}, st.integers(2, 7)),
    st.builds(lambda lo, hi: {"type": "string", "minLength": lo, "maxLength": lo + hi},
              st.integers(0, 3), st.integers(0, 4)),
    st.builds(lambda vals: {"enum": vals}, st.lists(st.one_of(st.integers(-3, 3), st.sampled_from(["a", "b"])),
                                                    min_size=1, max_size=4, unique=True)),
    st.builds(lambda p: {"type": "string", "pattern": p}, st.sampled_from(["^a", "b$", "^[ab]+$", "x"])),
)


def _schemas(children):
    names = st.sampled_from(["a", "b", "c"])
    return st.one_of(
        st.builds(lambda props, req, addl: {"type": "object", "properties": props, "required": req,
                                            "additionalProperties": addl},
                  st.dictionaries(names, children, max_size=3), st.lists(names, max_size=2, unique=True),
                  st.sampled_from([True, False, {"type": "integer"}])),
        st.builds(lambda it, lo, extra: {"type": "array", "items": it, "minItems": lo, "maxItems": lo + extra},
                  children, st.integers(0, 2), st.integers(0, 3)),
        st.builds(lambda xs: {"anyOf": xs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda xs: {"oneOf": xs}, st.lists(children, min_size=1, max_size=3)),
        st.builds(lambda xs: {"allOf": xs}, st.lists(children, min_size=1, max_size=2)),
        st.builds(lambda a, b: {**a, "not": b}, children, LEAF),
        st.builds(lambda c, t, e: {"if": c, "then": t, "else": e}, LEAF, children, children),
        st.builds(lambda it, c: {"type": "array", "items": it, "contains": c, "maxContains": 2}, children, LEAF),
        st.builds(lambda x: {"type": "object", "patternProperties": {"^x": x}, "minProperties": 1,
                             "additionalProperties": False}, children),
    )


SCHEMAS = st.recursive(LEAF, _schemas, max_leaves=5)


@settings(max_examples=40, deadline=None)
@given(schema=SCHEMAS, seed=st.integers(0, 2**16))
def test_random_schemas_walks_validate(schema, seed):
    try:
        guide = COMPILER.compile_json_schema(schema)
    except GrammarError:
        return  # refusals are fine; acceptance of invalid documents is not
    validator = V(schema)
    rng = random.Random(seed)
    for _ in range(4):
        w = random_walk(guide, rng, max_steps=200, eos_bias=0.8)
        if w.finished:
            doc = json.loads(w.data.decode("utf-8"))
            assert validator.is_valid(doc), (schema, doc)


def test_typical_algebra_schemas_compile():
    """not / oneOf / if / contains over ordinary subschemas compile (the property test is not all refusals)."""
    rng = random.Random(0)
    compiled = 0
    for i in range(30):
        inner = [{"type": "integer", "minimum": rng.randint(-5, 5)}, {"type": "string", "maxLength": 3},
                 {"enum": [1, "a"]}][i % 3]
        schema = [{"not": inner}, {"oneOf": [inner, {"type": "integer"}]},
                  {"if": inner, "then": {"type": "integer"}, "else": {"type": "string"}},
                  {"type": "array", "items": inner, "contains": {"type": "integer"}}][i % 4]
        try:
            compile_schema(schema)
            compiled += 1
        except GrammarError:
            pass
    assert compiled >= 25


def test_pairs_of_keywords_exhaustively_small():
    """Every pair of a few keyword snippets: accepted instances validate (a cheap exhaustive soundness net)."""
    snippets = [{"type": "integer"}, {"minimum": 2}, {"not": {"const": 3}}, {"multipleOf": 2},
                {"oneOf": [{"type": "string"}, {"maxLength": 1}]}, {"enum": [1, 2, 3, "a", "ab"]},
                {"required": ["a"]}, {"properties": {"a": {"type": "integer"}}}, {"maxProperties": 1},
                {"items": {"type": "integer"}}, {"minItems": 2}, {"contains": {"const": 1}}]
    for a, b in itertools.combinations(snippets, 2):
        schema = {**a, **b}
        try:
            dfa = compile_schema(schema).dfa
        except GrammarError:
            continue
        for v in INSTANCES:
            if dfa.fullmatch(_text(v)):
                assert V(schema).is_valid(v), (schema, v)


@pytest.mark.parametrize("pattern", [r"^(?!-)[-a-z0-9]{0,5}[a-z0-9]$", r"^(?=.*[0-9])[a-z0-9]{2,4}$",
                                     r"^(?!ab|c)[abc]{1,3}", r"^(?![)])[()a]{1,2}$"])
def test_leading_lookahead_patterns_are_exact(pattern):
    """`^(?!X)Y` / `^(?=X)Y`: compiled as a difference / intersection with the texts starting with X."""
    d = compile_schema({"type": "string", "pattern": pattern}).dfa
    alphabet = sorted(set("abc-0()z"))
    for k in range(0, 5):
        for chars in itertools.product(alphabet, repeat=k):
            s = "".join(chars)
            assert d.fullmatch(json.dumps(s).encode()) == bool(re.search(pattern, s)), (pattern, s)
    neg = compile_schema({"type": "string", "maxLength": 3, "not": {"pattern": pattern}}).dfa
    for s in ["", "a", "-a", "ab", "a1", "ca", "(a", ")"]:
        assert neg.fullmatch(json.dumps(s).encode()) == (not re.search(pattern, s)), (pattern, s)


def test_duplicate_ids_resolve_pointers_in_the_resource_that_has_the_path():
    """Real schemas reuse an $id for two embedded resources; a pointer goes to the one holding that path."""
    a = {"$id": "https://x.invalid/t", "type": "object", "properties": {"n": {"type": "integer"}}}
    b = {"$id": "https://x.invalid/t", "$defs": {"S": {"type": "string"}}, "type": "object",
         "properties": {"s": {"$ref": "#/$defs/S"}}, "required": ["s"], "additionalProperties": False}
    d = compile_schema({"$defs": {"B": b, "A": a}, "anyOf": [{"$ref": "#/$defs/A"}, {"$ref": "#/$defs/B"}]}).dfa
    assert d.fullmatch(b'{"s": "x"}') and not d.fullmatch(b'{"s": 1}')


def test_not_integer_rejects_minus_zero():
    """Numbers may be written "-0" (json.loads: the integer 0), so over(integer) holds it and `not` removes it."""
    for schema in ({"not": {"type": "integer"}}, {"not": {"type": "integer", "minimum": -3}},
                   {"anyOf": [{"not": {"type": "integer"}}]},
                   {"$schema": "http://json-schema.org/draft-04/schema#", "not": {"type": "integer"}}):
        dfa = compile_schema(schema).dfa
        assert not dfa.fullmatch(b"-0") and not dfa.fullmatch(b"0"), schema
        assert dfa.fullmatch(b"-0.5"), schema

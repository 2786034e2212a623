"""JSON schema -> regex -> guide: walks validate with jsonschema, suite soundness, bad input."""

import glob
import json
import os
import random
import re
import time
from typing import Literal, Optional

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.regex import regex_to_dfa
from sglpy.grammar.json.formats import integer_range
from sglpy.grammar.json.numbers import DEC_RE, decimal_range_dfa
from sglpy.grammar.json.schema import compile_schema, schema_to_regex
from sglpy.grammar.testing import random_walk, small_vocab_info

pydantic = pytest.importorskip("pydantic",
    reason="pydantic is not installed (the GPU image lacks it unless `make gpu-bundle` carried it)")


class _Matcher:
    """fullmatch over a compiled schema's automaton (re.compile-like, for the exactness tests)."""

    def __init__(self, schema, **kw):
        self.dfa = compile_schema(schema, **kw).dfa

    def fullmatch(self, text: str) -> bool:
        return self.dfa.fullmatch(text.encode())

INFO = small_vocab_info()
COMPILER = GrammarCompiler(INFO)
CLOSERS = frozenset(i for i, b in enumerate(INFO.token_bytes) if b in (b'"', b"}", b"]", b'",', b'"}', b"0", b"1"))


class Address(pydantic.BaseModel):
    street: str
    zip: Optional[str] = None


class Person(pydantic.BaseModel):
    name: str
    age: int = pydantic.Field(ge=0, le=130)
    role: Literal["admin", "user"]
    height: float = pydantic.Field(gt=0, lt=3)
    address: Optional[Address] = None
    tags: list[str] = pydantic.Field(default_factory=list, max_length=3)


SCHEMAS = {
    "simple": {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
               "required": ["name", "age"]},
    "optional_all": {"type": "object", "properties": {"a": {"type": "boolean"}, "b": {"type": "null"},
                                                        "c": {"type": "number"}}},
    "bounded": {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": -20, "exclusiveMaximum": 300},
        "x": {"type": "number", "minimum": 0, "maximum": 5},
        "s": {"type": "string", "minLength": 2, "maxLength": 5},
        "l": {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}},
        "required": ["n", "x", "s", "l"]},
    "formats": {"type": "object", "properties": {f: {"type": "string", "format": f} for f in
                                                  ("date", "time", "date-time", "email", "uuid", "uri", "ipv4")},
                "required": ["date", "uuid", "ipv4"]},
    "enum_const_anyof": {"type": "object", "properties": {
        "kind": {"const": "point"}, "color": {"enum": ["red", "green", 3, None, [1, 2], {"k": "v"}]},
        "v": {"anyOf": [{"type": "integer"}, {"type": "string", "maxLength": 2}]}}, "required": ["kind", "v"]},
    "oneof_disjoint": {"oneOf": [{"type": "integer"}, {"type": "object", "properties": {"q": {"type": "string"}},
                                                         "required": ["q"]}]},
    "allof": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
                          "required": ["a"]},
                         {"properties": {"a": {"maximum": 9}, "b": {"type": "string", "pattern": "^[a-z]{2}$"}},
                          "required": ["b"]}]},
    "recursive": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2}},
        "required": ["v"]}}, "$ref": "#/$defs/node"},
    "tuple": {"type": "array", "prefixItems": [{"type": "string", "maxLength": 3}, {"type": "boolean"}],
              "items": {"type": "null"}, "maxItems": 4},
    "free": {"type": "object", "additionalProperties": {"type": "integer"}, "maxProperties": 2},
    "any": {},
    "pattern_unanchored": {"type": "string", "pattern": "ab[0-9]"},
    "pydantic": Person.model_json_schema(),
}


@pytest.mark.parametrize("name", sorted(SCHEMAS))
def test_walks_validate(name):
    """Random walks that finish validate; enough of them finish for the check to mean something."""
    schema = SCHEMAS[name]
    guide = COMPILER.compile_json_schema(schema)
    rng = random.Random(sorted(SCHEMAS).index(name))
    V = jsonschema.Draft202012Validator
    finished = 0
    for _ in range(24):
        walk = random_walk(guide, rng, max_steps=300, eos_bias=0.7, prefer=CLOSERS, prefer_bias=0.35)
        if walk.finished:
            finished += 1
            jsonschema.validate(json.loads(walk.data.decode("utf-8")), schema, cls=V,
                                format_checker=V.FORMAT_CHECKER)
    assert finished >= 5, (name, finished)


def test_walks_finish_often():
    guide = COMPILER.compile_json_schema(SCHEMAS["bounded"])
    rng = random.Random(1)
    done = sum(random_walk(guide, rng, 300, 0.7, CLOSERS, 0.35).finished for _ in range(20))
    assert done >= 10


def test_pydantic_model_class_accepted_and_layout():
    g = COMPILER.compile_json_schema(Person)
    doc = Person(name="Al", age=3, role="user", height=1.5, tags=["x"])
    text = json.dumps(doc.model_dump(exclude_none=True), separators=(", ", ": "))
    assert g.is_final(g.advance_bytes(g.initial_state, text.encode()))
    # compact json.dumps layout is forced: after `{` the first key's quote and name are forced
    assert g.forced_string(g.initial_state) == '{"name": "'


def test_whitespace_pattern_option():
    schema = SCHEMAS["simple"]
    compact = re.compile(schema_to_regex(schema))
    loose = re.compile(schema_to_regex(schema, whitespace_pattern=r"[ \n]{0,2}"))
    assert compact.fullmatch('{"name": "a", "age": 1}') and not compact.fullmatch('{"name":"a","age":1}')
    assert loose.fullmatch('{\n"name":"a",\n "age" : 1 }') and not loose.fullmatch('{   "name":"a","age":1}')
    with pytest.raises(GrammarError, match="whitespace_pattern"):
        schema_to_regex(schema, whitespace_pattern="(")


def _serialize(data):
    return json.dumps(data, separators=(", ", ": "), ensure_ascii=False).encode()


@pytest.mark.parametrize(
    "schema,match",
    [
        ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "minItems": 2}, "'uniqueItems'"),
        ({"$ref": "http://example.com/s.json"}, "remote reference to 'http://example.com/s.json'.*nothing is fetched"),
        ({"$ref": "#/$defs/missing"}, "does not resolve"),
        ({"type": "strnig"}, "invalid 'type'"),
        ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "admits no document"),
        ({"type": "integer", "minimum": 5, "maximum": 2}, "admits no document"),
        ({"type": "string", "minLength": -1}, "minLength"),
        ({"enum": []}, "admits no document"),
        ({"type": "string", "pattern": "(?<=a)b"}, "lookbehind"),
        ({"type": "string", "pattern": "(a)\\1"}, "backreference"),
        ({"allOf": [{"anyOf": [{"properties": {"a": {}}}, True], "unevaluatedProperties": False}]},
         "'unevaluatedProperties'"),
        ('{"type": ', "not valid JSON"),
        (42, "object or boolean"),
        (False, "admits no document"),
    ],
)
def test_bad_schemas(schema, match):
    t0 = time.perf_counter()
    with pytest.raises(GrammarError, match=match):
        COMPILER.compile_json_schema(schema)
    assert time.perf_counter() - t0 < 10.0  # fails fast, never hangs (bound generous for loaded CI)


def test_schema_documents_serve_remote_refs():
    """Remote $refs resolve in the documents handed to the compiler (relative to the document's own URI, through
    its $id and anchors), transitively; any other URI is refused by name and nothing is fetched."""
    docs = {"https://example.com/defs.json": {"$defs": {"id": {"type": "integer", "minimum": 1},
                                                          "ref": {"$ref": "item.json"}}},
            "https://example.com/item.json": {"$id": "https://example.com/other/item.json", "$anchor": "it",
                                              "type": "object", "properties": {"n": {"$ref": "#/$defs/n"}},
                                              "required": ["n"], "additionalProperties": False,
                                              "$defs": {"n": {"enum": ["x", "y"]}}}}
    schema = {"type": "array", "prefixItems": [{"$ref": "https://example.com/defs.json#/$defs/id"},
                                               {"$ref": "https://example.com/defs.json#/$defs/ref"}],
              "items": False, "minItems": 2}
    comp = GrammarCompiler(small_vocab_info(), schema_documents=docs)
    g = comp.compile_json_schema(schema)
    for doc, ok in [([3, {"n": "x"}], True), ([0, {"n": "x"}], False), ([3, {"n": "z"}], False), ([3], False)]:
        assert _accepts(g, _serialize(doc)) is ok, doc
    anchored = comp.compile_json_schema({"$ref": "https://example.com/other/item.json#it"})
    assert _accepts(anchored, b'{"n": "y"}') and not _accepts(anchored, b'{"n": 1}')
    docs["https://example.com/defs.json"]["$defs"]["id"]["minimum"] = 5  # the compiler kept its own copy
    assert _accepts(comp.compile_json_schema(schema), b'[3, {"n": "x"}]')
    with pytest.raises(GrammarError, match="remote reference to 'https://example.com/none.json'"):
        comp.compile_json_schema({"$ref": "https://example.com/none.json"})
    with pytest.raises(GrammarError, match="remote reference"):  # the same schema without documents
        COMPILER.compile_json_schema(schema)


@pytest.mark.parametrize("schema,docs", [
    ({"allOf": [{"properties": {"a": {}}, "unevaluatedProperties": False}], "properties": {"b": {}}},
     [{"a": 1}, {}, {"a": 1, "b": 2}, {"b": 2}, {"c": 3}]),
    ({"allOf": [{"patternProperties": {"^x": {"type": "integer"}}, "unevaluatedProperties": {"type": "string"}}]},
     [{"x1": 1, "y": "s"}, {"x1": "s"}, {"y": 1}, {"y": "s", "z": "t"}]),
    ({"properties": {"p": {"$ref": "#/$defs/P"}}, "$defs": {"P": {"prefixItems": [{"type": "string"}],
                                                                  "unevaluatedItems": False}}},
     [{"p": ["a"]}, {"p": ["a", 1]}, {"p": []}, {"p": [1]}]),
])
def test_unevaluated_in_a_part_is_its_own_additional(schema, docs):
    """unevaluated* inside an allOf / $ref part without in-place applicators sees that part's keywords only."""
    g = COMPILER.compile_json_schema(schema)
    v = jsonschema.Draft202012Validator(schema)
    for doc in docs:
        assert _accepts(g, _serialize(doc)) == v.is_valid(doc), doc


def _accepts(guide, data: bytes) -> bool:
    try:
        return guide.is_final(guide.advance_bytes(guide.initial_state, data))
    except ValueError:
        return False


def test_deep_nesting_is_a_clear_error():
    schema: dict = {"type": "integer"}
    for _ in range(3000):
        schema = {"type": "array", "items": schema}
    with pytest.raises(GrammarError, match="nested too deeply|too large"):
        COMPILER.compile_json_schema(schema)


def test_deep_nesting_1000_levels_is_a_grammar_error():
    schema: dict = {"type": "string"}
    for _ in range(1000):
        schema = {"type": "object", "properties": {"a": schema}, "required": ["a"]}
    with pytest.raises(GrammarError, match="nested too deeply"):
        COMPILER.compile_json_schema(schema)
    text = '{"type": "object", "required": ["a"], "properties": {"a": ' * 1000 + '{"type": "string"}' + "}}" * 1000
    with pytest.raises(GrammarError, match="nested too deeply"):
        COMPILER.compile_json_schema(text)


def test_non_strict_warns_and_ignores():
    with pytest.warns(UserWarning, match="uniqueItems"):
        g = COMPILER.compile_json_schema({"type": "array", "items": {"type": "integer"}, "uniqueItems": True,
                                          "minItems": 2}, strict=False)
    assert g.is_final(g.advance_bytes(g.initial_state, b"[1, 1]"))


def test_recursion_calls_itself():
    """A recursive definition is one module that calls itself: instances nest as deep as they like (no unrolling
    bound), and every level is still checked."""
    schema = SCHEMAS["recursive"]
    doc = {"v": 0}
    for i in range(1, 40):
        doc = {"v": i, "kids": [doc, {"v": -i}]}
    for depth in (1, 3):
        r = _Matcher(schema, max_recursion_depth=depth)
        assert r.fullmatch(_serialize(doc).decode())
        bad = json.loads(json.dumps(doc).replace('{"v": 7,', '{"v": "7",'))
        assert not r.fullmatch(_serialize(bad).decode())
        too_many = json.loads(json.dumps(doc).replace('{"v": -20}', '{"v": -20}, {"v": 1}'))
        assert not r.fullmatch(_serialize(too_many).decode())
    assert compile_schema(schema).module.total_states() < 200  # one module per definition, not per level


@settings(max_examples=60, deadline=None)
@given(lo=st.one_of(st.none(), st.integers(-3000, 3000)), span=st.one_of(st.none(), st.integers(0, 5000)),
       probe=st.lists(st.integers(-10000, 10000), min_size=5, max_size=30))
def test_integer_range_exact(lo, span, probe):
    hi = None if span is None else (span if lo is None else lo + span)
    r = re.compile(integer_range(lo, hi))
    for x in probe + [lo or 0, hi or 0]:
        assert bool(r.fullmatch(str(x))) == ((lo is None or x >= lo) and (hi is None or x <= hi))
    assert not r.fullmatch("-0") and not r.fullmatch("01")


_BOUNDS = st.one_of(st.none(), st.integers(-50, 50), st.floats(-60, 60, allow_nan=False).map(lambda x: round(x, 3)),
                    st.sampled_from([0.1, 0.3, 0.30000000000000004, -2.5, 1e-5]))


@settings(max_examples=60, deadline=None)
@given(lo=_BOUNDS, hi=_BOUNDS, le=st.booleans(), he=st.booleans(),
       probe=st.lists(st.decimals(-60, 60, places=4, allow_nan=False,
                                  allow_infinity=False), min_size=5, max_size=30))
def test_decimal_range_exact_under_float_parsing(lo, hi, le, he, probe):
    """Decimal texts (<= 9 + 6 digits) are accepted iff json.loads(text) is within the bounds (as jsonschema sees)."""
    d = decimal_range_dfa(lo, le, hi, he)
    extra = [repr(float(b)) for b in (lo, hi) if b is not None and "e" not in repr(float(b))]
    for text in [str(x) for x in probe if "E" not in str(x)] + extra:
        if "." not in text or not re.fullmatch(DEC_RE, text):
            continue
        x = json.loads(text)
        inside = (lo is None or (x > lo if le else x >= lo)) and (hi is None or (x < hi if he else x <= hi))
        assert d.fullmatch(text.encode()) == inside, (text, lo, le, hi, he)


class Color(str, __import__("enum").Enum):
    red = "red"
    blue = "blue"


class Item(pydantic.BaseModel):
    sku: str = pydantic.Field(pattern=r"^[A-Z]{2}-[0-9]{3}$")
    qty: int = pydantic.Field(ge=1, le=99)
    color: Optional[Color] = None


class Order(pydantic.BaseModel):
    order_id: int
    items: list[Item] = pydantic.Field(min_length=1, max_length=3)
    notes: dict[str, int] = pydantic.Field(default_factory=dict, max_length=2)
    shipped: bool = False
    when: Optional[__import__("datetime").date] = None


def test_nested_pydantic_model_walks_validate():
    schema = Order.model_json_schema()
    guide = COMPILER.compile_json_schema(Order)
    rng = random.Random(3)
    done = 0
    for _ in range(25):
        walk = random_walk(guide, rng, max_steps=400, eos_bias=0.7, prefer=CLOSERS, prefer_bias=0.35)
        if walk.finished:
            done += 1
            Order.model_validate_json(walk.data)  # pydantic accepts it
            jsonschema.validate(json.loads(walk.data), schema)
    assert done >= 5


def test_per_call_whitespace_override():
    loose = COMPILER.compile_json_schema(SCHEMAS["simple"], whitespace_pattern=r"[ ]?")
    compact = COMPILER.compile_json_schema(SCHEMAS["simple"])
    assert loose is not compact
    assert loose.is_final(loose.advance_bytes(loose.initial_state, b'{"name":"a","age":1}'))
    with pytest.raises(ValueError):
        compact.advance_bytes(compact.initial_state, b'{"name":"a"')


def test_arrays_exact_for_prefix_items_and_bounds():
    """Every combination of prefixItems / items / minItems / maxItems accepts exactly the valid arrays."""
    for npre in range(3):
        for items in (None, False, {"type": "integer"}):
            for lo in (None, 0, 1, 2, 4):
                for hi in (None, 0, 1, 3, 5):
                    s = {"type": "array"}
                    if npre:
                        s["prefixItems"] = [{"type": "string"}] * npre
                    if items is not None:
                        s["items"] = items
                    if lo is not None:
                        s["minItems"] = lo
                    if hi is not None:
                        s["maxItems"] = hi
                    docs = [["a"] * min(n, npre) + [1] * max(0, n - npre) for n in range(7)]
                    valid = [jsonschema.Draft202012Validator(s).is_valid(d) for d in docs]
                    try:
                        r = _Matcher(s)
                    except GrammarError:
                        assert not any(valid), s
                        continue
                    for d, v in zip(docs, valid):
                        assert bool(r.fullmatch(_serialize(d).decode())) == v, (s, d)


def test_optional_properties_exact():
    names = ["a", "b", "c", "d"]
    subsets = [c for k in range(5) for c in __import__("itertools").combinations(names, k)]
    for req in subsets:
        s = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "required": list(req)}
        for ws in (None, "[ ]?"):
            r = _Matcher(s, whitespace_pattern=ws)
            for present in subsets:
                doc = {n: 1 for n in present}
                text = _serialize(doc).decode() if ws is None else json.dumps(doc)
                assert bool(r.fullmatch(text)) == (set(req) <= set(present)), (req, present, ws)


def test_length_bounds_next_to_pattern_or_format_are_intersected():
    """minLength/maxLength next to a pattern or format: the automata are intersected, exactly."""
    cases = [({"type": "string", "pattern": "^[A-Z]+$", "maxLength": 3}, ["A", "ABC"], ["ABCD", "", "a"]),
             ({"type": "string", "format": "email", "maxLength": 8}, ["a@bc.de"], ["abc@de.fgh", "a"]),
             ({"type": "string", "pattern": "ab", "minLength": 3, "maxLength": 4}, ["abx", "xabx"], ["ab", "xxabx"])]
    for schema, good, bad in cases:
        r = _Matcher(schema)
        for t in good:
            assert r.fullmatch(json.dumps(t)), (schema, t)
        for t in bad:
            assert not r.fullmatch(json.dumps(t)), (schema, t)

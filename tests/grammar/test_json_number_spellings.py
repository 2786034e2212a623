"""Number schemas under not / oneOf / if-else: every tricky spelling of a number the guide accepts is valid.

Over-approximations must hold every text json.loads reads as a valid value: -0, -0.0, 3.0, 6.00, trailing zeros,
decimals past 15 digits that round onto a bound or an enum value."""

import json

import jsonschema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pytest

from sglpy.grammar import GrammarCompiler, GrammarError
from sglpy.grammar.json.schema import compile_schema
from sglpy.grammar.testing import small_vocab_info

SPELLINGS = ["0", "-0", "0.0", "-0.0", "0.00", "-0.000", "-0.0000000", "3", "-3", "3.0", "3.00", "-3.0",
             "3.0000000", "6", "6.000", "-6.0", "1", "1.0", "-1", "1.5", "1.50", "-1.5", "2", "2.0", "0.5", "-0.5",
             "4.5", "0.1", "0.30000000000000004", "0.1000000000000000055511151231257827", "1.0000000000000000001",
             "2.9999999999999999999", "9", "12.0", "7"]
DRAFT4 = "http://json-schema.org/draft-04/schema#"
DRAFT7 = "http://json-schema.org/draft-07/schema#"
VALUES = [0, -0.0, 0.0, 1, 1.0, 3, 3.0, -3, 1.5, 0.1, 0.30000000000000004, 6, 2.0]


@st.composite
def number_schema(draw, draft):
    s = {}
    kind = draw(st.sampled_from(["integer", "number", None]))
    if kind:
        s["type"] = kind
    if draw(st.booleans()):
        s["multipleOf"] = draw(st.sampled_from([2, 3, 3.0, 0.5, 1.5]))
    for key in ("minimum", "maximum") + (() if draft == DRAFT4 else ("exclusiveMinimum", "exclusiveMaximum")):
        if draw(st.integers(0, 3)) == 0:
            s[key] = draw(st.sampled_from([0, 0.0, -0.0, 1, 3, -3, 1.5, 3.0, 0.30000000000000004]))
    pick = draw(st.integers(0, 5))
    if pick == 0:
        s["enum"] = draw(st.lists(st.sampled_from(VALUES), min_size=1, max_size=3))
    elif pick == 1 and draft != DRAFT4:
        s["const"] = draw(st.sampled_from(VALUES))
    return s


@st.composite
def wrapped(draw):
    draft = draw(st.sampled_from([DRAFT4, DRAFT7, None]))
    a, b = draw(number_schema(draft)), draw(number_schema(draft))
    shape = draw(st.sampled_from(["not", "oneOf", "if", "notnot", "anyOf"]))
    if shape == "not":
        s = {"not": a}
    elif shape == "notnot":
        s = {"not": {"not": a}}
    elif shape == "oneOf":
        s = {"oneOf": [a, b]}
    elif shape == "anyOf":
        s = {"anyOf": [{"not": a}, b]}
    else:
        if draft == DRAFT4:
            s = {"oneOf": [{"not": a}, b]}
        else:
            s = {"if": a, "then": b, "else": {"not": b}}
    if draft:
        s["$schema"] = draft
    return s


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(wrapped())
def test_accepted_number_spellings_are_valid(schema):
    try:
        dfa = compile_schema(schema).dfa
    except GrammarError:
        return  # a refusal names what it does not support; nothing is accepted
    validator = jsonschema.validators.validator_for(schema)(schema)
    bad = [t for t in SPELLINGS if dfa.fullmatch(t.encode()) and not validator.is_valid(json.loads(t))]
    assert not bad, (schema, bad)


def test_not_multiple_of_rejects_minus_zero_spellings():
    """-0 and -0.0 are multiples of every divisor (integers in draft 6+), so `not` removes them."""
    for inner in ({"type": "integer", "multipleOf": 3}, {"type": "number", "multipleOf": 3}, {"multipleOf": 3.0},
                  {"type": "number", "minimum": 0, "maximum": 0}):
        dfa = compile_schema({"not": inner}).dfa
        for t in (b"-0", b"-0.0", b"0.00", b"-0.0000000"):
            assert not dfa.fullmatch(t), (inner, t)
    draft4 = compile_schema({"$schema": DRAFT4, "not": {"type": "integer", "multipleOf": 3}}).dfa
    assert not draft4.fullmatch(b"-0") and draft4.fullmatch(b"-0.0")  # draft 4: -0.0 is no integer


def test_not_const_rejects_spellings_that_round_onto_it():
    """Decimals past 15 digits that json.loads rounds onto the value; draft 4's integer enum [1.0] holds 1."""
    assert not compile_schema({"not": {"const": 0.1}}).dfa.fullmatch(b"0.1000000000000000055511151231257827")
    assert not compile_schema({"not": {"const": 1}}).dfa.fullmatch(b"1.0000000000000000001")
    assert not compile_schema({"not": {"const": 0.30000000000000004}}).dfa.fullmatch(b"0.30000000000000004")
    dfa = compile_schema({"$schema": DRAFT4, "not": {"type": "integer", "enum": [1.0]}}).dfa
    assert not dfa.fullmatch(b"1")


def test_guide_refuses_minus_zero_under_not_integer_multiple():
    """The request path: the compiled guide refuses -0.0 and -0 under {"not": {"type": "integer", "multipleOf": 3}}."""
    g = GrammarCompiler(small_vocab_info()).compile("json_schema", {"not": {"type": "integer", "multipleOf": 3}})

    def accepts(text: bytes) -> bool:
        try:
            return g.is_final(g.advance_bytes(g.initial_state, text))
        except ValueError:
            return False

    assert accepts(b"-0.5") and accepts(b"4")
    assert not any(accepts(t) for t in (b"-0.0", b"-0", b"3.00", b"0"))

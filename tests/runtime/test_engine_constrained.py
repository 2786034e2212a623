"""Constrained decoding in the engine on the default model: validity, jump-forward, boundaries, errors."""

import json
import re

import jsonschema
import pytest

from sglpy.runtime.engine import Engine

pytestmark = pytest.mark.slow

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 12},
    "age": {"type": "integer", "minimum": 0, "maximum": 120},
    "city": {"type": "string", "enum": ["Paris", "London", "Tokyo", "Lima"]},
    "nickname": {"type": "string", "maxLength": 10}},
    "required": ["name", "age", "city"], "additionalProperties": False}
ORDER = {"type": "object", "properties": {
    "id": {"type": "integer", "minimum": 0, "maximum": 99999},
    "items": {"type": "array", "items": {"type": "object", "properties": {
        "sku": {"type": "string", "pattern": "^[A-Z]{3}[0-9]{2}$"}, "qty": {"type": "integer", "minimum": 1, "maximum": 99}},
        "required": ["sku", "qty"]}, "minItems": 1, "maxItems": 2},
    "paid": {"type": "boolean"}, "note": {"type": ["string", "null"], "maxLength": 10}},
    "required": ["id", "items", "paid"]}
REGEXES = [r"[0-9]{3}-[0-9]{4}", r"(yes|no|maybe)", r"[A-Z][a-z]{2,8} [A-Z][a-z]{2,8}",
           r"\d{4}-\d{2}-\d{2}", r"(0|[1-9][0-9]{0,2})(\.[0-9]{1,2})?", r"[a-z]{1,10}@[a-z]{1,10}\.(com|org)"]
EBNF = """
start: expr
expr: term (OP term) ~ 0..3
term: NUMBER | "(" NUMBER OP NUMBER ")"
OP: "+" | "-"
NUMBER: /[0-9]{1,3}/
"""


@pytest.fixture(scope="module")
def engine(default_model_path):
    # float32: greedy outputs with and without jump-forward are compared, and they run in different batch shapes
    # (quantized outputs may differ in the last bits with the batch; docs/runtime.md)
    eng = Engine(default_model_path, max_total_tokens=32768, debug_invariants=True, quantization="none")
    yield eng
    eng.shutdown()


def _chat(eng, text):
    return eng.tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)


def _workload(eng):
    reqs = []
    for i in range(18):
        reqs.append(("json", PERSON, _chat(eng, f"Invent person number {i} as JSON.")))
    for i in range(12):
        reqs.append(("json", ORDER, _chat(eng, f"Write order {i} as JSON.")))
    for i, rx in enumerate(REGEXES * 3):
        reqs.append(("regex", rx, _chat(eng, f"Answer {i}:")))
    for i in range(4):
        reqs.append(("ebnf", EBNF, f"Arithmetic expression {i}: "))
    return reqs


def _params(kind, value, greedy):
    sp = {"max_new_tokens": 96, "temperature": 0 if greedy else 0.8, "top_p": 0.95, "seed": 7}
    sp["json_schema" if kind == "json" else kind] = json.dumps(value) if kind == "json" else value
    return sp


def _check(kind, value, text):
    if kind == "json":
        jsonschema.validate(json.loads(text), value)
    elif kind == "regex":
        assert re.fullmatch(value, text), (value, text)
    else:
        assert re.fullmatch(r"[0-9()+\-]+", text) and text.count("(") == text.count(")"), text


@pytest.mark.parametrize("greedy", [True, False], ids=["greedy", "sampled"])
def test_fifty_plus_constrained_requests_in_one_batch_are_valid(engine, greedy):
    work = _workload(engine)
    assert len(work) >= 50
    results = {}
    for jf in (True, False):
        engine.constrained.jump_forward_enabled = jf
        outs = engine.generate([w[2] for w in work], [_params(k, v, greedy) for k, v, _ in work])
        for (kind, value, _), out in zip(work, outs):
            assert out["meta_info"]["finish_reason"]["type"] == "stop", out
            _check(kind, value, out["text"])
        results[jf] = outs
    engine.constrained.jump_forward_enabled = True
    jumped = sum(o["meta_info"]["jump_forward_tokens"] for o in results[True])
    assert jumped > 0 and all(o["meta_info"]["jump_forward_tokens"] == 0 for o in results[False])
    if greedy:
        _compare_greedy(engine, results[True], results[False])
    info = engine.get_server_info()
    assert info["kv_used"] == 0


def _compare_greedy(engine, with_jf, without_jf):
    """Equal text, except where the no-jump tokens are non-canonical (re-tokenization changes them)."""
    tok = engine.tokenizer
    differ = []
    for a, b in zip(with_jf, without_jf):
        if a["text"] != b["text"]:
            ids = b["output_ids"]
            canonical = tok.encode(tok.decode(ids, skip_special_tokens=True), add_special_tokens=False)
            assert canonical != [t for t in ids if t not in engine.eos_ids], \
                f"outputs differ although the no-jump tokens are canonical: {a['text']!r} vs {b['text']!r}"
            differ.append((a["text"], b["text"]))
    print(f"\ngreedy with/without jump-forward differ in {len(differ)}/{len(with_jf)} outputs "
          f"(all where re-tokenization changed the token sequence)")


def test_jump_boundary_keeps_tokenizer_canonical(engine):
    """A forced `"` that the tokenizer merges with the following `,`: the jump must leave it to the model."""
    tok = engine.tokenizer
    for rx in [r'abc"(,1|;2)', r'\{"key": "(x|y)", "n": [0-9]\}']:
        out = engine.generate(_chat(engine, "Go"), {"regex": rx, "temperature": 0, "max_new_tokens": 30})
        assert re.fullmatch(rx, out["text"]), out["text"]
        assert out["meta_info"]["jump_forward_tokens"] > 0
        assert out["output_ids"] == tok.encode(out["text"], add_special_tokens=False), \
            [tok.decode([t]) for t in out["output_ids"]]


def test_no_runaway_whitespace(engine):
    schema = {"type": "object", "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
              "required": ["a"]}
    out = engine.generate(_chat(engine, "Lots of spaces and newlines please"),
                          {"json_schema": schema, "temperature": 1.0, "seed": 3, "max_new_tokens": 200})
    assert not re.search(r"\s\s|\n", out["text"]), out["text"]


@pytest.mark.parametrize("sp, match", [
    ({"regex": "(a"}, "regex"),
    ({"regex": r"(a)\1"}, "backreference"),
    ({"json_schema": {"type": "object", "properties": {"x": {"type": "array", "uniqueItems": True, "minItems": 2}}}},
     "uniqueItems"),
    ({"json_schema": "{not json"}, "JSON"),
    ({"ebnf": "start: ("}, "invalid EBNF"),
])
def test_bad_constraints_are_clear_errors(engine, sp, match):
    with pytest.raises(ValueError, match=match):
        engine.generate("x", sp)
    assert engine.generate("still serving", {"max_new_tokens": 2})["meta_info"]["completion_tokens"] <= 2


def test_constraint_beats_min_new_tokens_and_stop_strings_apply(engine):
    out = engine.generate("Say yes:", {"choices": ["yes", "no"], "min_new_tokens": 10, "temperature": 0})
    assert out["text"] in ("yes", "no")
    out = engine.generate(_chat(engine, "JSON"), {"json_schema": PERSON, "stop": [","], "temperature": 0})
    assert "," not in out["text"] and out["meta_info"]["finish_reason"] == {"type": "stop", "matched": ","}

"""The wire tables (runtime/server/wire_tables.py) against SGLang 0.5.23's own request definitions, the docs, and
the validation rules they drive (no server needed)."""

import json
import pathlib
import re

import pytest

from sglpy.runtime.server.http_common import ApiError, first_bad_string
from sglpy.runtime.server.native_api import parse_generate
from sglpy.runtime.server.openai_protocol import chat_messages, check_request
from sglpy.runtime.server.wire_schema import REQUIRED, Support
from sglpy.runtime.server.wire_tables import CHAT, GENERATE, SAMPLING, SCHEMAS, SGLANG_EQUIVALENT, render_markdown

ROOT = pathlib.Path(__file__).resolve().parents[2]
SGLANG = json.loads((ROOT / "tests/server/data/sglang_schemas.json").read_text())
VOCAB = 260


def _ours(default):
    return "<required>" if default is REQUIRED else default


@pytest.mark.parametrize("name", sorted(SGLANG_EQUIVALENT))
def test_every_sglang_field_is_in_our_table_with_sglangs_default(name):
    theirs = SGLANG["schemas"][name]
    table = SGLANG_EQUIVALENT[name]
    ours = {f.name: f for f in table.fields}
    missing = sorted(set(theirs) - set(ours))
    assert missing == [], f"SGLang {SGLANG['sglang_version']} {name} fields missing from our table: {missing}"
    wrong = {k: (_ours(ours[k].default), v) for k, v in theirs.items() if _ours(ours[k].default) != v}
    assert wrong == {}, f"defaults differ (ours, SGLang's): {wrong}"
    for f in table.fields:  # every field that is not SGLang's says where it comes from
        assert (f.origin == "sglang") == (f.name in theirs), (f.name, f.origin)


def test_the_frozen_sglang_schemas_are_from_0_5_23():
    assert SGLANG["sglang_version"] == "0.5.23"
    assert len(SGLANG["schemas"]["generate"]) >= 70 and "stop_regex" in SGLANG["schemas"]["sampling_params"]


def test_tables_have_unique_fields_docs_and_checks():
    for schema in SCHEMAS:
        names = [f.name for f in schema.fields]
        assert len(names) == len(set(names)), schema.title
        for f in schema.fields:
            assert f.doc and f.check.desc, (schema.title, f.name)
            if f.default is not REQUIRED and f.default is not None:
                assert f.check(f.default), (schema.title, f.name, f.default)  # the default passes its own check


def test_docs_show_the_tables():
    doc = (ROOT / "docs/server.md").read_text()
    m = re.search(r"<!-- wire-tables:begin -->\n(.*?)<!-- wire-tables:end -->", doc, re.S)
    assert m, "docs/server.md lacks the wire-tables markers"
    assert m.group(1) == render_markdown(), (
        "docs/server.md is out of date: replace the text between the markers with the output of "
        "`python -m sglpy.runtime.server.wire_tables`")


def _err(fn, *args) -> ApiError:
    with pytest.raises(ApiError) as e:
        fn(*args)
    assert e.value.status == 400
    return e.value


def test_every_sglang_field_at_its_default_is_accepted_by_generate():
    body = {f.name: f.default for f in GENERATE.fields}
    body.update(text="hi", input_ids=None, sampling_params={f.name: f.default for f in SAMPLING.fields
                                                            if f.name not in ("seed", "choices")})
    job = parse_generate(body, VOCAB)
    assert len(job.items) == 1 and job.items[0].sampling.max_new_tokens == 128
    assert job.items[0].sampling.top_k == -1  # SGLang's 1 << 30 is the whole vocabulary


def test_what_sglang_router_and_frontend_send_is_accepted():
    router = {"text": "hi", "model": None, "log_metrics": True, "background": False, "no_logs": False,
              "return_bytes": False, "return_entropy": False, "return_hidden_states": False,
              "return_text_in_logprobs": False, "stream": False,
              "sampling_params": {"temperature": 0.0, "max_new_tokens": 4, "stop": [], "stop_token_ids": [],
                                  "n": 1, "top_k": -1, "regex": None, "json_schema": None}}
    assert parse_generate(router, VOCAB).items[0].sampling.temperature == 0.0
    frontend_sp = {"skip_special_tokens": True, "spaces_between_special_tokens": True, "max_new_tokens": 8,
                   "min_new_tokens": 0, "n": 1, "stop": [], "stop_token_ids": [], "stop_regex": [],
                   "temperature": 0.7, "top_p": 1.0, "top_k": -1, "min_p": 0.0, "frequency_penalty": 0.0,
                   "presence_penalty": 0.0, "ignore_eos": False, "regex": None, "json_schema": None}
    assert parse_generate({"text": "hi", "sampling_params": frontend_sp}, VOCAB).items[0].sampling.top_p == 1.0
    chat = {"model": "x", "messages": [{"role": "user", "content": "hi"}], "logprobs": False, "stream": False,
            "no_stop_trim": False, "ignore_eos": False, "continue_final_message": False, "skip_special_tokens": True,
            "separate_reasoning": True, "stream_reasoning": True, "return_hidden_states": False,
            "max_completion_tokens": 5, "return_flat_raw_top_logprobs_b64": True, "tool_choice": "none"}
    assert check_request(chat, chat=True)[0]["max_completion_tokens"] == 5


def test_null_means_the_default_except_max_new_tokens():
    job = parse_generate({"text": "hi", "sampling_params": {"temperature": None, "top_p": None, "stop": None,
                                                            "max_new_tokens": None}}, VOCAB)
    sp = job.items[0].sampling
    assert (sp.temperature, sp.top_p, sp.stop, sp.max_new_tokens) == (1.0, 1.0, (), None)


@pytest.mark.parametrize("sp,words", [
    ({"stop": {"a": 1}}, ["stop", "must be"]),
    ({"ignore_eos": "yes"}, ["ignore_eos", "bool"]),
    ({"ignore_eos": 1}, ["ignore_eos", "bool"]),
    ({"spaces_between_special_tokens": "x"}, ["spaces_between_special_tokens"]),
    ({"no_stop_trim": "x"}, ["no_stop_trim"]),
    ({"skip_special_tokens": "no"}, ["skip_special_tokens"]),
    ({"max_new_tokens": True}, ["max_new_tokens", "int"]),
    ({"max_new_tokens": 2.0}, ["max_new_tokens"]),
    ({"logit_bias": {"99999999": 1.0}}, ["logit_bias", "99999999", "vocabulary"]),
    ({"logit_bias": {"x": 1.0}}, ["logit_bias"]),
    ({"stop_token_ids": [VOCAB]}, ["stop_token_ids", "vocabulary"]),
    ({"stop": ["s"] * 33}, ["stop", "at most 32"]),
    ({"stop_regex": ["a"] * 33}, ["stop_regex", "at most 32"]),
    ({"stop_regex": "(unclosed"}, ["stop_regex"]),
    ({"stop_regex": "a" * 257}, ["stop_regex", "256"]),
    ({"structural_tag": "{}"}, ["structural_tag", "structures"]),
    ({"structural_tag": {"structures": [{"begin": "<a>", "schema": {}, "end": "</a>"}], "triggers": ["<b>"]}},
     ["structural_tag", "does not start with a trigger"]),
    ({"beam_width": 2}, ["beam_width", "not supported"]),
    ({"n": 0}, ["n"]),
    ({"temperature": -1}, ["temperature"]),
    ({"seed": 1, "sampling_seed": 2}, ["seed"]),
    ({"bogus": 1}, ["unknown", "bogus"]),
])
def test_generate_refuses_bad_sampling_values_at_the_door(sp, words):
    e = _err(parse_generate, {"text": "hi", "sampling_params": sp}, VOCAB)
    for w in words:
        assert w in e.message, e.message


@pytest.mark.parametrize("body,words", [
    ({"input_ids": [1, 99999999]}, ["input_ids", "vocabulary"]),
    ({"text": "hi", "return_logprob": True, "top_logprobs_num": 1000000}, ["top_logprobs_num"]),
    ({"text": "hi", "return_logprob": "yes"}, ["return_logprob"]),
    ({"text": "hi", "lora_path": 3}, ["lora_path"]),  # an adapter's name, or one per prompt
    ({"text": "hi", "lora_id": 3}, ["lora_id"]),
    ({"text": "hi", "background": True}, ["background"]),
    ({"text": "hi", "routed_dp_rank": 1}, ["routed_dp_rank"]),
    ({"text": "hi", "stream": 1}, ["stream", "bool"]),
    ({"text": "hi", "logprob_start_len": -2}, ["logprob_start_len"]),
])
def test_generate_refuses_bad_top_level_values(body, words):
    e = _err(parse_generate, body, VOCAB)
    for w in words:
        assert w in e.message, e.message


def test_default_only_fields_accept_their_empty_spellings():
    ok = {"text": "hi", "lora_path": [None], "image_data": [], "session_params": {}, "return_hidden_states": [False],
          "custom_labels": {"a": "b"}, "priority": 3, "routed_dp_rank": 0, "cache_salt": "", "extra_key": ""}
    assert parse_generate(ok, VOCAB).items[0].extra_key is None


def test_cache_salt_namespaces_like_extra_key():
    keys = {parse_generate({"text": "x", **b}, VOCAB).items[0].extra_key for b in
            ({}, {"extra_key": "a"}, {"cache_salt": "a"}, {"extra_key": "a", "cache_salt": "a"})}
    assert len(keys) == 4


@pytest.mark.parametrize("body,words", [
    ({"messages": [{"role": "user"}]}, ["content", "required"]),
    ({"messages": [{"role": "assistant", "content": None, "tool_calls": [{"id": "x"}]}]}, ["tool_calls"]),
    ({"messages": [{"role": "bot", "content": "x"}]}, ["role"]),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, ["text"]),
    ({"messages": [{"role": "user", "content": "x"}], "n": 0}, ["n"]),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]}, ["tools[0].function"]),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": "required"}, ["tool_choice", "needs tools"]),
    ({"messages": [{"role": "user", "content": "x"}], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     ["tool_choice", "no tools"]),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "retrieval"}]}, ["tools[0].type"]),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}] * 2},
     ["duplicate", "'f'"]),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "f"}}],
      "tool_choice": {"type": "function", "function": {"name": "g"}}}, ["tool_choice", "'g'"]),
    ({"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function", "function": {"name": "a b"}}]},
     ["tools[0].function.name"]),
    ({"messages": [{"role": "user", "content": "x"}], "thinking": {"type": "enabled"}}, ["thinking"]),
    ({"messages": [{"role": "user", "content": "x"}], "stream_options": {"continuous_usage_stats": True}},
     ["continuous_usage_stats"]),
])
def test_chat_requests_are_checked_at_the_door(body, words):
    def run(b):
        f, _ = check_request(b, chat=True)
        chat_messages(f["messages"])

    e = _err(run, body)
    for w in words:
        assert w in e.message, e.message


def test_completion_max_tokens_must_be_positive_as_in_sglang():
    assert "max_tokens" in _err(check_request, {"prompt": "x", "max_tokens": 0}, False).message
    assert check_request({"messages": [{"role": "user", "content": "x"}], "max_tokens": 0}, True)[0]["max_tokens"] == 0


def test_lone_surrogates_are_found_anywhere():
    assert first_bad_string({"a": ["ok", {"b": "x\ud800"}]}) == "body.a[1].b"
    assert first_bad_string({"\udfff": 1}) == "body (a key)"
    assert first_bad_string({"a": ["fine", "é", "😀"]}) is None


def test_support_kinds_are_all_used_and_noops_say_why():
    kinds = {f.support for s in SCHEMAS for f in s.fields}
    assert kinds == set(Support)
    for s in SCHEMAS:
        for f in s.fields:
            if f.support is Support.NOOP:
                assert len(f.doc) > 8, f.name
    assert CHAT.field("separate_reasoning").support is Support.IMPL  # with --reasoning-parser

"""The one way in (runtime/request.py): prompts, per-item fields, n expansion with per-sample seeds, token checks."""

import pytest

from sglpy.runtime.request import ITEM_FIELDS, RequestError, parse_request, sample_seed
from sglpy.runtime.sampling_params import SamplingParams


def test_one_request_per_prompt_and_sample():
    parsed = parse_request({"text": ["a", "b"], "sampling_params": [{"n": 3, "max_new_tokens": 4}, None],
                            "extra_key": ["k", None]}, rid_of=lambda i, j, n: f"p{i}-{j}-of-{n}")
    assert [(i.rid, p) for i, p in zip(parsed.items, parsed.prompt_of)] == [
        ("p0-0-of-3", 0), ("p0-1-of-3", 0), ("p0-2-of-3", 0), ("p1-0-of-1", 1)]
    assert all(i.sampling.n == 1 for i in parsed.items) and parsed.items[0].sampling.max_new_tokens == 4
    assert [i.extra_key for i in parsed.items] == ["k", "k", "k", None] and parsed.batch


def test_rids_name_samples_like_the_native_api():
    parsed = parse_request({"text": "hi", "sampling_params": {"n": 2, "max_new_tokens": 3}, "rid": "r"})
    assert parsed.batch and [i.rid for i in parsed.items] == ["r-0", "r-1"]
    parsed = parse_request({"input_ids": [[1, 2], [3]], "rid": ["x", "y"]})
    assert parsed.batch and [i.rid for i in parsed.items] == ["x", "y"] and parsed.items[1].input_ids == [3]
    one = parse_request({"text": "a", "rid": "one"})
    assert not one.batch and [i.rid for i in one.items] == ["one"]


def test_seeded_samples_draw_their_own_streams_reproducibly():
    sp = SamplingParams(n=3, seed=7, temperature=1.0)
    seeds = [i.sampling.seed for i in parse_request({"text": "a", "sampling_params": sp}).items]
    assert seeds[0] == 7 and len(set(seeds)) == 3
    assert seeds == [i.sampling.seed for i in parse_request({"text": "a", "sampling_params": sp}).items]
    assert sample_seed(None, 2) is None and sample_seed(7, 1) != sample_seed(8, 1)


@pytest.mark.parametrize("fields, param, words", [
    ({}, "text", "exactly one"),
    ({"text": "a", "input_ids": [1]}, "text", "exactly one"),
    ({"input_ids": [1, 999]}, "input_ids", "outside the vocabulary"),
    ({"input_ids": []}, "input_ids", "must not be empty"),
    ({"text": []}, "text", "empty"),
    ({"text": "a", "rid": ["x", "y"]}, "rid", "need a batch"),
    ({"text": ["a", "b"], "rid": ["x"]}, "rid", "1 entries for a batch of 2"),
    ({"text": ["a", "b"], "rid": "x"}, "rid", "distinct"),
    ({"text": "a", "sampling_params": {"stop_token_ids": [500]}}, "sampling_params.stop_token_ids", "vocabulary"),
    ({"text": "a", "top_logprobs_num": 101}, "top_logprobs_num", "[0, 100]"),
    ({"text": "a", "logprob_start_len": -2}, "logprob_start_len", "logprob_start_len"),
    ({"text": "a", "bogus": 1}, "bogus", "unknown"),
])
def test_bad_requests_name_their_field(fields, param, words):
    with pytest.raises(RequestError) as e:
        parse_request(fields, vocab_size=100)
    assert e.value.param == param and words in e.value.message, e.value.message


def test_every_item_field_is_taken_per_prompt():
    for name in ITEM_FIELDS:  # a per-item field accepts a list with one entry per prompt
        parse_request({"text": ["a", "b"], name: [None, None]})

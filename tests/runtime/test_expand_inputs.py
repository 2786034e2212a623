"""One batch / n-samples expansion (request_builder.expand_inputs) for the offline, native and OpenAI APIs."""

from sglpy.runtime.engine.request_builder import expand_inputs, generate_inputs
from sglpy.runtime.sampling_params import LogprobOptions, SamplingParams


def test_expand_inputs_gives_one_request_per_prompt_and_sample():
    sps = [SamplingParams(n=3, max_new_tokens=4), SamplingParams(max_new_tokens=2)]
    exp = expand_inputs([{"text": "a"}, {"input_ids": [5, 6]}], sps, [LogprobOptions()] * 2, ["k", None],
                        lambda i, j, n: f"p{i}-{j}-of-{n}")
    assert [(e.inp.rid, e.prompt, e.sample) for e in exp] == [("p0-0-of-3", 0, 0), ("p0-1-of-3", 0, 1),
                                                               ("p0-2-of-3", 0, 2), ("p1-0-of-1", 1, 0)]
    assert all(e.inp.sampling.n == 1 for e in exp) and exp[0].inp.sampling.max_new_tokens == 4
    assert [e.inp.extra_key for e in exp] == ["k", "k", "k", None] and exp[3].inp.input_ids == [5, 6]
    forced = expand_inputs([{"text": "a"}], [SamplingParams()], [LogprobOptions()], [None], lambda i, j, n: str(j),
                           n=[2])
    assert [e.inp.rid for e in forced] == ["0", "1"]


def test_offline_generate_expands_n_samples_like_the_native_api():
    inputs, is_batch = generate_inputs(prompt="hi", sampling_params={"n": 2, "max_new_tokens": 3}, rid="r")
    assert is_batch and [i.rid for i in inputs] == ["r-0", "r-1"] and all(i.sampling.n == 1 for i in inputs)
    inputs, is_batch = generate_inputs(prompt=["a", "b"], sampling_params={"max_new_tokens": 3}, rid=["x", "y"])
    assert is_batch and [i.rid for i in inputs] == ["x", "y"]
    inputs, is_batch = generate_inputs(prompt="a", rid="one")
    assert not is_batch and [i.rid for i in inputs] == ["one"]
    try:
        generate_inputs(prompt="a", sampling_params={"n": 2}, stream=True)
    except ValueError as e:
        assert "n=1" in str(e)
    else:
        raise AssertionError("stream with n > 1 must be refused")

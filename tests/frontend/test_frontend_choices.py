"""The three select methods on SGLang's mock data, and the scored-window definition."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.backend_base import plan_scoring, scores_from_logprobs
from sglpy.choices import greedy_token_selection, token_length_normalized, unconditional_likelihood_normalized

CHOICES = ["organ", "organism", "antidisestablishmentarianism"]
NORMALIZED = [-0.1, -0.2, -0.05]
LONG = [[-0.4, 3, None], [-0.25, 4, None], [-0.1, 5, None]] + [[-0.01, 6 + i, None] for i in range(5)]
INPUT = [[[-0.1, 1, None]], [[-0.1, 1, None], [-0.3, 2, None]], LONG]
UNCOND = [[[None, 1, None]], [[None, 1, None], [-1.4, 2, None]], [[None, 3, None]] + LONG[1:]]


def call(method, **extra):
    return method(choices=CHOICES, normalized_prompt_logprobs=NORMALIZED, input_token_logprobs=INPUT,
                  output_token_logprobs=[[] for _ in CHOICES], **extra)


def test_token_length_normalized_picks_highest_mean():
    d = call(token_length_normalized)
    assert d.decision == "antidisestablishmentarianism"
    assert d.meta_info["normalized_prompt_logprobs"] == NORMALIZED


def test_greedy_token_selection_matrix_and_winner():
    d = call(greedy_token_selection)
    assert d.decision == "organ"
    m = d.meta_info["greedy_logprob_matrix"]
    assert m[0] == pytest.approx([-0.1] * 8)
    assert m[1] == pytest.approx([-0.1, -0.3] + [-0.2] * 6)
    assert m[2] == pytest.approx([e[0] for e in LONG])


def test_unconditional_likelihood_normalized():
    d = call(unconditional_likelihood_normalized, unconditional_token_logprobs=UNCOND)
    assert d.decision == "organism"
    assert d.meta_info["normalized_unconditional_prompt_logprobs"] == pytest.approx([-0.1, 0.5, -0.05])


def test_unconditional_requires_matching_lengths():
    bad = [UNCOND[0], UNCOND[1][:1], UNCOND[2]]
    with pytest.raises(ValueError, match="differ"):
        call(unconditional_likelihood_normalized, unconditional_token_logprobs=bad)
    with pytest.raises(ValueError, match="needs unconditional"):
        call(unconditional_likelihood_normalized)


def test_ties_go_to_the_first_choice():
    d = token_length_normalized(choices=["a", "b"], normalized_prompt_logprobs=[-1.0, -1.0],
                                input_token_logprobs=[[[-1.0, 1, "a"]], [[-1.0, 2, "b"]]],
                                output_token_logprobs=[[], []])
    assert d.decision == "a"


# ---------------------------------------------------------------- the scored window

VOCAB = sorted({" ", "a", "b", "c", ":", " a", " b", "ab", "bc", ":a", " ab", "abc", "ca"}, key=len, reverse=True)
IDS = {piece: i for i, piece in enumerate(VOCAB)}


def toy_tokenize(text):
    """Greedy longest match: a stand-in BPE in which pieces merge across the prefix/choice boundary."""
    out, i = [], 0
    while i < len(text):
        piece = next(p for p in VOCAB if text.startswith(p, i))
        out.append(IDS[piece])
        i += len(piece)
    return out


def decode(ids):
    return "".join(VOCAB[i] for i in ids)


def test_window_includes_a_merged_first_token():
    plan = plan_scoring(toy_tokenize, "c: ", ["ab", "c"])
    full = plan.full_ids[0]
    window = full[plan.window_starts[0]:]
    assert decode(window) == " ab"  # the prefix's trailing space merged into the choice's first token
    assert decode(full[:plan.window_starts[0]]) == "c:"
    # no merge for "c": the prefix tokens stay and only the choice's token is scored
    assert decode(plan.full_ids[1][plan.window_starts[1]:]) == "c"
    assert decode(plan.full_ids[1][:plan.window_starts[1]]) == "c: "


@settings(max_examples=200, deadline=None)
@given(prefix=st.text(alphabet="abc: ", max_size=12), choice=st.text(alphabet="abc: ", min_size=1, max_size=6))
def test_window_is_exactly_the_choice_tokens(prefix, choice):
    plan = plan_scoring(toy_tokenize, prefix, [choice])
    full, start = plan.full_ids[0], plan.window_starts[0]
    assert prefix.startswith(decode(full[:start]))  # unscored tokens hold prefix text only
    assert decode(full[start:]).endswith(choice)  # every choice character is scored
    assert start < len(full)


def test_scores_are_sliced_per_choice():
    plan = plan_scoring(toy_tokenize, "c:", ["a", "bc"])
    start = plan.logprob_start_len
    logprobs = [[[-0.5, t, None] for t in ids[start:]] for ids in plan.full_ids]
    scores = scores_from_logprobs(plan, logprobs, start)
    for sc, ids, ws in zip(scores, plan.full_ids, plan.window_starts):
        assert [e[1] for e in sc.input_token_logprobs] == ids[ws:]
        assert sc.normalized_prompt_logprob == pytest.approx(-0.5)
    with pytest.raises(RuntimeError, match="expected"):
        scores_from_logprobs(plan, [lp[1:] for lp in logprobs], start)


def test_a_choice_adding_no_tokens_is_rejected():
    with pytest.raises(ValueError, match="adds no tokens"):
        plan_scoring(toy_tokenize, "ab", [""])

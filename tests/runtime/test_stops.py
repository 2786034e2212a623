"""Stop rules on text: stop strings and stop_regex (trim, no_stop_trim, min_new_tokens) and streaming hold-back."""

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sglpy.runtime.core import FinishReason, Req
from sglpy.runtime.engine.stops import append_text, visible_text
from sglpy.runtime.sampling_params import SamplingParams


def _req(**sp) -> Req:
    return Req(rid="r", input_ids=[1], sampling=SamplingParams(**sp))


def _feed(req: Req, pieces: list[str]) -> list[str]:
    """Append pieces (one token each) until a stop; the visible text after each piece."""
    shown = []
    for piece in pieces:
        req.output_ids.append(0)
        reason = append_text(req, piece)
        if reason is not None:
            req.finish_reason = reason
        shown.append(visible_text(req))
        if reason is not None:
            break
    return shown


def test_stop_regex_trims_at_the_match_and_reports_the_pattern():
    req = _req(stop_regex=[r"\d+\."])
    shown = _feed(req, ["The ", "answer ", "is 4", "2", ".", " Done"])
    assert req.text == "The answer is "
    assert req.finish_reason == FinishReason("stop", matched=r"\d+\.")
    assert shown == ["The ", "The answer ", "The answer is ", "The answer is ", "The answer is "]


def test_no_stop_trim_keeps_the_match_and_the_earliest_rule_wins():
    req = _req(stop=["STOP"], stop_regex=[r"b+c"], no_stop_trim=True)
    _feed(req, ["aab", "bbc STOP"])
    assert req.text == "aabbbc" and req.finish_reason.matched == "b+c"
    req = _req(stop=["ST"], stop_regex=[r"OP"])
    _feed(req, ["x ST", "OP"])
    assert req.text == "x " and req.finish_reason.matched == "ST"


def test_min_new_tokens_defers_stop_regex():
    req = _req(stop_regex=[r"!"], min_new_tokens=3, max_new_tokens=8)
    _feed(req, ["a!", "b", "c", "d"])
    assert req.text == "a" and req.finish_reason.matched == "!"  # found once min_new_tokens is reached


def test_hold_back_covers_a_match_that_could_still_complete():
    req = _req(stop_regex=[r"<tool>.*</tool>"])
    shown = _feed(req, ["Hi <to", "ol> call", " more"])
    assert shown == ["Hi ", "Hi ", "Hi "]
    req.finish_reason = FinishReason("length", length=3)
    assert visible_text(req) == "Hi <tool> call more"  # finished: everything is shown


@settings(max_examples=150, deadline=None)
@given(st.lists(st.text(alphabet="ab12.", min_size=1, max_size=3), min_size=1, max_size=12),
       st.sampled_from([r"\d+\.", r"a{2}b", r"(?:1|2)+a", r"b\.", r"\.\."]))
def test_streamed_text_is_always_a_prefix_of_the_final_text(pieces, pattern):
    req = _req(stop_regex=[pattern])
    shown = _feed(req, pieces)
    final = req.text if req.finished else "".join(pieces)
    assert all(final.startswith(s) for s in shown)
    for i, s in enumerate(shown):
        assert re.search(pattern, s) is None or (req.finished and i == len(shown) - 1 and req.sampling.no_stop_trim)
    if req.finished:
        whole = "".join(pieces)
        assert final == whole[: re.search(pattern, whole).start()]


@pytest.mark.timeout(60)  # Python's re alone would backtrack for hours on this output
def test_a_catastrophic_stop_regex_aborts_its_own_request():
    req = _req(stop_regex=[r"(a|aa)+b"], max_new_tokens=100)
    _feed(req, ["a"] * 60)
    assert req.finish_reason is not None and req.finish_reason.type == "abort"
    assert "stop_regex" in req.finish_reason.message


def _search_everything(req: Req, delta: str):
    """append_text as it was before the last-character pre-filter: every new text is searched (the oracle)."""
    from sglpy.runtime.engine.stops import _first_text_stop

    if not delta:
        return None
    old_len = len(req.text)
    req.text += delta
    s = req.sampling
    if (not s.stop and not s.stop_regex) or len(req.output_ids) < s.min_new_tokens:
        return None
    hit = _first_text_stop(req.text, s, old_len)
    if hit is None:
        return None
    start, end, matched = hit
    req.text = req.text[: end if s.no_stop_trim else start]
    return FinishReason("stop", matched=matched)


def _run_to_stop(append, req: Req, pieces: list[str]) -> tuple:
    for step, piece in enumerate(pieces):
        req.output_ids.append(0)
        reason = append(req, piece)
        if reason is not None:
            return step, req.text, reason
    return None, req.text, None


@settings(max_examples=400, deadline=None)
@given(st.lists(st.text(alphabet="ab.é東🙂", max_size=3), min_size=1, max_size=16),  # "" = a token with no text yet
       st.lists(st.text(alphabet="ab.é東🙂", min_size=1, max_size=5), min_size=1, max_size=3),
       st.integers(0, 4), st.booleans(), st.booleans())
def test_stop_strings_finish_where_searching_every_text_does(pieces, stop, min_new, no_trim, with_regex):
    """The pre-filter changes no finish step, text or matched string: stop strings of different lengths,
    matches spanning pieces, min_new_tokens (with which a match may lie wholly in text never searched), no_stop_trim,
    and a stop_regex beside them."""
    sp = dict(stop=stop, min_new_tokens=min_new, no_stop_trim=no_trim, stop_regex=["b\\.é"] if with_regex else [])
    assert (_run_to_stop(append_text, _req(**sp), pieces)
            == _run_to_stop(_search_everything, _req(**sp), pieces))


def test_a_short_stop_found_in_older_text_once_min_new_tokens_is_reached():
    """Searching only where a stop string could end would miss this: "ab" lies before the third token's text."""
    for min_new in (0, 3):
        req = _req(stop=["ab", "xxxxxxxx"], min_new_tokens=min_new)
        step, text, reason = _run_to_stop(append_text, req, ["z", "ab", "c", "d"])
        assert (step, text, reason.matched) == ((1, "z", "ab") if min_new == 0 else (2, "z", "ab"))

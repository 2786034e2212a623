"""Stop rules: stop token ids, EOS and length per token; stop strings and stop_regex on the text; streaming hold-back.

Text rules (SGLang semantics): after min_new_tokens, the earliest stop string or stop_regex match in the
output text ends the request; the text is cut at the match start (at its end with no_stop_trim) and
finish_reason is {"type": "stop", "matched": <the stop string, or the stop_regex pattern>}, as SGLang
reports a regex stop by its pattern. A streamed chunk never shows text that a later stop could still cut:
for a stop string, the longest suffix that is a prefix of it is held back; for a stop_regex, everything
from the earliest position where a match could still start (a partial match reaching the end of the text,
found with the `regex` module's partial matching) is held back.
With min_new_tokens <= 1 every text was searched as it grew (from its window on, and a window never starts before
the previous one), so a new match ends in the new text and includes its stop string's last character: stop strings
alone are searched only when the new text has one of those characters, with the same result. With a larger
min_new_tokens the first search also sees text that was never searched (a match may lie before the new text).
Patterns run on the `regex` module (Python `re` syntax, VERSION0) with a time budget per search, so a
pattern that backtracks catastrophically aborts its own request instead of stalling the step loop.
"""

from __future__ import annotations

import functools

import regex

from ..core import FinishReason, Req
from ..sampling_params import SamplingParams


def check_token_stop(req: Req, token: int, eos_ids: set[int], max_context: int) -> FinishReason | None:
    """Finish reason triggered by the token just appended (stop strings are checked on text)."""
    s = req.sampling
    if len(req.output_ids) >= s.min_new_tokens:
        if token in s.stop_token_ids:
            return FinishReason("stop", matched=token)
        if token in eos_ids and not s.ignore_eos:
            return FinishReason("stop", matched=token)
    if (s.max_new_tokens is not None and len(req.output_ids) >= s.max_new_tokens) or req.seq_len >= max_context:
        return FinishReason("length", length=len(req.output_ids))
    return None


STOP_REGEX_BUDGET = 0.05  # seconds one stop_regex search may take before its request is aborted


class StopRegexTimeout(Exception):
    """A stop_regex search ran over STOP_REGEX_BUDGET."""

    def __init__(self, pattern: str):
        super().__init__(pattern)
        self.pattern = pattern


def _search(pattern: str, compiled, text: str, partial: bool = False):
    """One search, on the `regex` module with the time budget (Python's `re` when `regex` reads it differently)."""
    fast = _partial_pattern(pattern)
    if fast is None:
        return None if partial else compiled.search(text)
    try:
        return fast.search(text, partial=partial, timeout=STOP_REGEX_BUDGET)
    except TimeoutError:
        raise StopRegexTimeout(pattern) from None


def _first_text_stop(text: str, s: SamplingParams, old_len: int) -> tuple[int, int, str] | None:
    """(start, end, matched) of the earliest stop string (in the new text's window) or stop_regex match."""
    best = None
    if s.stop:
        window_start = max(old_len - max(len(x) for x in s.stop) + 1, 0)
        for stop in s.stop:
            idx = text.find(stop, window_start)
            if idx != -1 and (best is None or idx < best[0]):
                best = (idx, idx + len(stop), stop)
    for pattern, compiled in zip(s.stop_regex, s.compiled_stop_regex()):
        m = _search(pattern, compiled, text)
        if m is not None and (best is None or m.start() < best[0]):
            best = (m.start(), m.end(), pattern)
    return best


def _may_end_in(stops: tuple[str, ...], delta: str) -> bool:
    """Whether a stop string's last character is in the new text: where every earlier text was searched (below)."""
    for stop in stops:
        if stop[-1] in delta:
            return True
    return False


def append_text(req: Req, delta: str) -> FinishReason | None:
    """Add decoded text; trim and finish on the first stop string or stop_regex match."""
    if not delta:
        return None
    old_len = len(req.text)
    req.text += delta
    s = req.sampling
    if (not s.stop and not s.stop_regex) or len(req.output_ids) < s.min_new_tokens:
        return None
    if not s.stop_regex and s.min_new_tokens <= 1 and not _may_end_in(s.stop, delta):
        return None
    try:
        hit = _first_text_stop(req.text, s, old_len)
    except StopRegexTimeout as e:
        return FinishReason("abort", message=f"stop_regex {e.pattern!r} took over {STOP_REGEX_BUDGET * 1000:.0f} ms "
                                             "to search the output (catastrophic backtracking); simplify it")
    if hit is None:
        return None
    start, end, matched = hit
    req.text = req.text[: end if s.no_stop_trim else start]
    return FinishReason("stop", matched=matched)


@functools.lru_cache(maxsize=256)
def _partial_pattern(pattern: str):
    """The stop_regex for partial matching, or None if the `regex` module reads it differently from `re`."""
    try:
        return regex.compile(pattern, flags=regex.VERSION0)
    except regex.error:
        return None


def visible_text(req: Req) -> str:
    """Text safe to stream: withholds a tail that a stop string or stop_regex could still cut off."""
    s = req.sampling
    if req.finished or (not s.stop and not s.stop_regex):
        return req.text
    text = req.text
    cut = len(text)
    for stop in s.stop:
        for k in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:k]):
                cut = min(cut, len(text) - k)
                break
    for pattern in s.stop_regex:
        if _partial_pattern(pattern) is None:
            return ""  # cannot tell where a match could start: show nothing until the request ends
        try:
            m = _search(pattern, None, text, partial=True)
        except StopRegexTimeout:
            return ""  # the request is being aborted (append_text hit the same budget)
        if m is not None:
            cut = min(cut, m.start())
    return text[:cut]

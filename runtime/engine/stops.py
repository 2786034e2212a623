"""Stop rules: stop token ids, EOS and length per token; stop strings and stop_regex on the text; streaming hold-back.

Text rules (SGLang semantics): after min_new_tokens, the earliest stop string or stop_regex match in the
output text ends the request; the text is cut at the match start (at its end with no_stop_trim) and
finish_reason is {"type": "stop", "matched": <the stop string, or the stop_regex pattern>}, as SGLang
reports a regex stop by its pattern. A streamed chunk never shows text that a later stop could still cut:
for a stop string, the longest suffix that is a prefix of it is held back; for a stop_regex, everything
from the earliest position where a match could still start (a partial match reaching the end of the text,
found with the `regex` module's partial matching) is held back.

A stop_regex is matched by the `regex` module (VERSION0: Python `re` syntax and semantics) with a time
limit per search, STOP_REGEX_TIMEOUT_S (20 ms): a pattern that backtracks catastrophically on the output ends its
own request (StopRegexTimeout, isolated by the step loop) instead of stalling every request in the batch.
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


STOP_REGEX_TIMEOUT_S = 0.02  # legitimate searches take microseconds on outputs of a few KB


class StopRegexTimeout(ValueError):
    """A stop_regex search ran past STOP_REGEX_TIMEOUT_S on a request's output (the request's own pattern)."""


@functools.lru_cache(maxsize=256)
def _search_pattern(pattern: str):
    """The stop_regex compiled by the `regex` module (time-limited searches), or None if it reads it differently."""
    try:
        return regex.compile(pattern, flags=regex.VERSION0)
    except regex.error:
        return None


def _search(pattern: str, compiled_re, text: str, partial: bool = False):
    compiled = _search_pattern(pattern)
    if compiled is None:
        return None if partial else compiled_re.search(text)  # rare: only Python's `re` reads it (no time limit)
    try:
        return compiled.search(text, partial=partial, timeout=STOP_REGEX_TIMEOUT_S)
    except TimeoutError:
        raise StopRegexTimeout(f"stop_regex {pattern!r} took more than {STOP_REGEX_TIMEOUT_S * 1000:.0f} ms on "
                               f"{len(text)} characters of output (catastrophic backtracking)") from None


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


def append_text(req: Req, delta: str) -> FinishReason | None:
    """Add decoded text; trim and finish on the first stop string or stop_regex match."""
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
        if _search_pattern(pattern) is None:
            return ""  # cannot tell where a match could start: show nothing until the request ends
        m = _search(pattern, None, text, partial=True)
        if m is not None:
            cut = min(cut, m.start())
    return text[:cut]

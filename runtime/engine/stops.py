"""Stop rules: stop token ids, EOS and length on each token; stop strings on the decoded text; streaming hold-back."""

from __future__ import annotations

from ..core import FinishReason, Req


def check_token_stop(req: Req, token: int, eos_ids: set[int], max_context: int) -> FinishReason | None:
    """Finish reason triggered by the token just appended (stop strings are checked on text)."""
    s = req.sampling
    if len(req.output_ids) >= s.min_new_tokens:
        if token in s.stop_token_ids:
            return FinishReason("stop", matched=token)
        if token in eos_ids and not s.ignore_eos:
            return FinishReason("stop", matched=token)
    if len(req.output_ids) >= s.max_new_tokens or req.seq_len >= max_context:
        return FinishReason("length", length=len(req.output_ids))
    return None


def append_text(req: Req, delta: str) -> FinishReason | None:
    """Add decoded text; trim and finish on the first stop string found across token boundaries."""
    if not delta:
        return None
    old_len = len(req.text)
    req.text += delta
    s = req.sampling
    if not s.stop or len(req.output_ids) < s.min_new_tokens:
        return None
    longest = max(len(x) for x in s.stop)
    window_start = max(old_len - longest + 1, 0)
    best = None
    for stop in s.stop:
        idx = req.text.find(stop, window_start)
        if idx != -1 and (best is None or idx < best[0]):
            best = (idx, stop)
    if best is None:
        return None
    idx, stop = best
    req.text = req.text[: idx + (len(stop) if s.no_stop_trim else 0)]
    return FinishReason("stop", matched=stop)


def visible_text(req: Req) -> str:
    """Text safe to stream: withholds a tail that could still become a stop string."""
    if req.finished or not req.sampling.stop:
        return req.text
    hold = 0
    for stop in req.sampling.stop:
        for k in range(min(len(stop) - 1, len(req.text)), 0, -1):
            if req.text.endswith(stop[:k]):
                hold = max(hold, k)
                break
    return req.text[: len(req.text) - hold] if hold else req.text

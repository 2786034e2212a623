"""Jump-forward helper: canonical tokens for a forced string, with llguidance-style boundary back-off."""

from __future__ import annotations

import bisect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Hashable, Sequence

import numpy as np

if TYPE_CHECKING:  # annotations only: guide.py imports this module
    from ..guide import Guide


_MEMO_MAX = 8192  # entries of a guide's jump memos before they are cleared


@dataclass(frozen=True)
class JumpResult:
    """Drop the last `rollback` generated tokens, append `new_token_ids`; the guide is then in `new_state`."""

    rollback: int
    new_token_ids: list[int]
    new_state: Hashable


def make_encoder(tokenizer: Any) -> Callable[[str], list[int]]:
    """text -> token ids without special tokens, for a transformers tokenizer or a `tokenizers.Tokenizer`."""
    backend = getattr(tokenizer, "_tokenizer", None)  # a fast transformers tokenizer's own `tokenizers.Tokenizer`
    if backend is not None and callable(getattr(backend, "encode", None)) and hasattr(backend, "token_to_id"):
        # the same ids as tokenizer.encode(text, add_special_tokens=False), without the wrapper's ~0.1 ms per call
        return lambda text: backend.encode(text, add_special_tokens=False).ids
    if callable(getattr(tokenizer, "encode", None)):
        def enc(text: str) -> list[int]:
            out = tokenizer.encode(text, add_special_tokens=False)
            return list(out.ids) if hasattr(out, "ids") else list(out)

        return enc
    if callable(tokenizer):
        return tokenizer
    raise ValueError(f"jump_tokens needs a tokenizer with .encode (got {type(tokenizer).__name__})")


def _encode_exact(enc, text_bytes: bytes, context: bytes, token_bytes) -> list[int] | None:
    """Ids whose bytes are exactly `text_bytes`, tokenized as it would be after `context`; None if impossible."""
    def spans(ids):
        parts = [token_bytes[i] if 0 <= i < len(token_bytes) else None for i in ids]
        return None if any(p is None for p in parts) else parts

    attempts = [context, b""] + ([b"\n"] if context != b"\n" else [])
    for ctx in dict.fromkeys(attempts):
        try:
            ids = enc((ctx + text_bytes).decode("utf-8"))
        except UnicodeDecodeError:
            continue
        parts = spans(ids)
        if parts is None:
            continue
        joined = b"".join(parts)
        if not joined.endswith(text_bytes):
            continue
        # a token boundary exactly where `text_bytes` starts
        start = len(joined) - len(text_bytes)
        pos = 0
        for k, p in enumerate(parts):
            if pos == start:
                return list(ids[k:])
            pos += len(p)
            if pos > start:
                break
    return None


def _can_extend(guide: Guide, state, suffix: bytes) -> bool:
    """Some vocabulary token starts with `suffix`, is longer, and is allowed in `state` (None = unknown).

    Memoized per guide for known states: requests of one schema reach the same states with the same forced text.
    """
    if state is None:
        return _can_extend_uncached(guide, None, suffix)
    memo = guide.__dict__.get("_extend_memo")
    if memo is None or len(memo) > _MEMO_MAX:
        memo = guide.__dict__["_extend_memo"] = {}
    key = (state, suffix)
    hit = memo.get(key)
    if hit is None:
        hit = memo[key] = _can_extend_uncached(guide, state, suffix)
    return hit


def _can_extend_uncached(guide: Guide, state, suffix: bytes) -> bool:
    toks, ids = guide.info.sorted_tokens
    lo = bisect.bisect_left(toks, suffix)
    up = suffix.rstrip(b"\xff")
    hi = bisect.bisect_left(toks, up[:-1] + bytes([up[-1] + 1])) if up else len(toks)
    if lo < hi and toks[lo] == suffix:
        lo += 1
    if lo >= hi:
        return False
    if state is None:
        return True
    cand = ids[lo:hi]
    mask = guide.allowed(state).view(np.uint32)
    return bool(((mask[cand >> 5] >> (cand & 31).astype(np.uint32)) & 1).any())


def _earliest_extendable(guide: Guide, state, text: bytes, tail_len: int, forced_b: bytes, first: int):
    """Earliest byte position >= first from which a longer, allowed vocabulary token covers the end of `text`."""
    longest = guide.info.longest_token
    start = max(first, len(text) - longest + 1)
    s_at: dict[int, object] = {}
    if start >= tail_len:
        s_at[start] = guide.advance_bytes(state, forced_b[: start - tail_len])
    for pos in range(start, len(text)):
        if pos >= tail_len and pos not in s_at:
            prev = s_at.get(pos - 1)
            s_at[pos] = (guide.advance_bytes(prev, text[pos - 1 : pos]) if prev is not None
                         else guide.advance_bytes(state, forced_b[: pos - tail_len]))
        if _can_extend(guide, s_at.get(pos), text[pos:]):
            return pos
    return None


def jump_tokens(
    guide: Guide,
    state,
    generated_token_ids: Sequence[int],
    forced: str | None = None,
    tokenizer: Any = None,
    *,
    max_lookback_tokens: int = 4,
    encode: Callable[[str], list[int]] | None = None,
) -> JumpResult:
    """Tokens to append for a jump over `forced`, keeping the sequence canonical.

    Contract: `state` is the guide state after `generated_token_ids`; `forced` (default
    `guide.forced_string(state)`) must be a forced continuation. The text of the last
    <= `max_lookback_tokens` generated tokens plus `forced` is re-tokenized with the real tokenizer
    (`tokenizer.encode`, or `encode`). Tokens shared with the old tail are kept; from the first
    differing one on, old tokens are dropped (`rollback`) and new ones appended (`new_token_ids`).
    Boundary rule (llguidance): find the earliest byte position (in the re-tokenized part) from which
    some vocabulary token starts with the rest of the text up to the end of `forced`, is longer than
    it, and is allowed by the guide there; the appended run stops before the token containing that
    position -- the model may legitimately merge across the end of the forced text (`"` vs `",`,
    `order` vs `orderId`, `▁"` vs `▁` + `":`), so those bytes are left for sampling. If the cut would fall inside the already
    generated text, no jump is made (rollback 0, no tokens). `new_state` is the guide state after
    the kept text (generated text + the consumed prefix of `forced`); continue decoding from it.
    """
    forced = guide.forced_string(state) if forced is None else forced
    if not forced:
        return JumpResult(0, [], state)
    forced_b = forced.encode("utf-8")
    guide.advance_bytes(state, forced_b)  # raises ValueError if `forced` is not a valid continuation
    if encode is None:
        if tokenizer is None:
            raise ValueError("jump_tokens needs `tokenizer` (or `encode`) to re-tokenize")
        encode = make_encoder(tokenizer)
    tb = guide.info.token_bytes
    gen = list(generated_token_ids)
    # the longest tail (<= max_lookback_tokens, no special tokens) that starts on a character boundary
    k = 0
    tail_b = b""
    for n in range(1, min(max_lookback_tokens, len(gen)) + 1):
        b = tb[gen[-n]] if 0 <= gen[-n] < len(tb) else None
        if b is None:
            break
        cand = b + tail_b
        tail_b = cand
        try:
            cand.decode("utf-8")
            k = n
        except UnicodeDecodeError:
            continue
    tail = gen[len(gen) - k :] if k else []
    tail_b = b"".join(tb[t] for t in tail)
    ctx_ids = gen[max(0, len(gen) - k - max_lookback_tokens) : len(gen) - k]
    ctx = b"".join(tb[t] or b"" for t in ctx_ids)
    try:
        ctx.decode("utf-8")
    except UnicodeDecodeError:
        ctx = b""
    ids = _encode_exact(encode, tail_b + forced_b, ctx, tb)
    if ids is None:
        return JumpResult(0, [], state)
    p = 0
    while p < len(tail) and p < len(ids) and ids[p] == tail[p]:
        p += 1
    offs = [0]
    for t in ids:
        offs.append(offs[-1] + len(tb[t]))
    text = tail_b + forced_b
    cut = len(ids)
    cut_pos = _earliest_extendable(guide, state, text, len(tail_b), forced_b, offs[p])
    if cut_pos is not None:
        cut = max(i for i in range(len(ids)) if offs[i] <= cut_pos)  # the token containing cut_pos
    if offs[cut] < len(tail_b) or (cut == p and p == len(tail)):
        return JumpResult(0, [], state)
    new_state = guide.advance_bytes(state, forced_b[: offs[cut] - len(tail_b)])
    return JumpResult(len(tail) - p, list(ids[p:cut]), new_state)

"""Incremental detokenization that never emits a broken UTF-8 character.

A request whose text nobody reads while it runs (not streamed, no stop string or stop_regex) is detokenized
once per emitted chunk (`catch_up`: at its finish, or when an output is built), not per token. A chunk that
ends on a complete character gives the text of pushing its tokens one by one (the decode of the window past
the last complete character either way); one that ends inside a character, and every chunk on tokenizers that
clean up spaces around punctuation across a window edge, is pushed one token at a time.

A per-token push (stop strings, streaming) on a byte-level tokenizer takes no decode call in the steady state:
such a tokenizer's text of ids is the lossy UTF-8 decode of their bytes joined, so while every token since the
last emitted text decodes alone to valid text (no U+FFFD), the window's text is the tokens' own texts joined and
the new token's text alone is the delta push would compute. Any other token takes the decoding path.
"""

from __future__ import annotations

import weakref

from ..images import text_ids

CONTEXT_TOKENS = 5  # prompt tokens decoded along with outputs so leading spaces come out right

# tokenizer -> {(skip_special_tokens, spaces_between_special_tokens): {token id: its text alone}}. decode() of
# one token is a pure function of the tokenizer, so the memo changes no result; it saves the second decode
# call of most pushes (the previous token alone), shared by every request of an engine.
_single_token_text: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def backend_decode(tokenizer):
    """The `tokenizers` library's decode(ids, skip_special_tokens=...) where tokenizer.decode is exactly that call
    (a fast tokenizer that overrides no decode step and cleans up no spaces), else None: the same text without
    ~4 us of Python per call."""
    backend = getattr(tokenizer, "_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", True):
        return None
    try:
        from transformers import PreTrainedTokenizerFast
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase
    except ImportError:
        return None
    cls = type(tokenizer)
    if (not isinstance(tokenizer, PreTrainedTokenizerFast) or cls.decode is not PreTrainedTokenizerBase.decode
            or cls._decode is not PreTrainedTokenizerFast._decode):
        return None
    return getattr(backend, "decode", None)


def _byte_level(tokenizer) -> bool:
    """Whether the backend's decoder is the byte-level one alone (text = lossy UTF-8 of the tokens' bytes joined)."""
    try:
        from tokenizers import decoders
    except ImportError:
        return False
    return type(getattr(tokenizer._tokenizer, "decoder", None)) is decoders.ByteLevel


def _single_token_cache(tokenizer, key: tuple) -> dict | None:
    try:
        per_tokenizer = _single_token_text.setdefault(tokenizer, {})
    except TypeError:  # a tokenizer that cannot be weakly referenced: no memo
        return None
    return per_tokenizer.setdefault(key, {})


class IncrementalDetokenizer:
    """Turns appended token ids into text deltas; a delta never ends in a partial character."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.kwargs = {"skip_special_tokens": skip_special_tokens,
                       "spaces_between_special_tokens": spaces_between_special_tokens}
        self.single = _single_token_cache(tokenizer, (skip_special_tokens, spaces_between_special_tokens))
        self.fast = backend_decode(tokenizer)  # spaces_between_special_tokens means nothing to a fast tokenizer
        self.chunked = not getattr(tokenizer, "clean_up_tokenization_spaces", False)
        self.concat = self.single is not None and self.fast is not None and _byte_level(tokenizer)
        self.tail_clean = False  # concat, and every token of ids[prefix_offset:] decodes alone to valid text
        self.broken = False
        self.ids: list[int] = text_ids(prompt_ids[-CONTEXT_TOKENS:])  # a prompt's image tokens have no text
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.start = len(self.ids)

    @property
    def consumed(self) -> int:
        """Output tokens pushed so far."""
        return len(self.ids) - self.start

    def _decode(self, ids: list[int]) -> str:
        if len(ids) == 1 and self.single is not None:
            text = self.single.get(ids[0])
            if text is None:
                text = self.single[ids[0]] = self._decode_call(ids)
            return text
        return self._decode_call(ids) if ids else ""

    def _decode_call(self, ids: list[int]) -> str:
        if self.fast is not None:
            return self.fast(ids, skip_special_tokens=self.kwargs["skip_special_tokens"])
        return self.tokenizer.decode(ids, **self.kwargs)

    def push(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (maybe empty)."""
        if self.tail_clean and len(token_ids) == 1:
            t = token_ids[0]
            text = self.single.get(t)
            if text is None:
                text = self.single[t] = self._decode_call(token_ids)
            if "\ufffd" not in text:  # the window's text is its tokens' texts joined (module docstring)
                self.ids.append(t)
                if text:
                    self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
                return text
        delta = self._push(token_ids)
        window = self.ids[self.prefix_offset:]
        # the fast path resumes once the window is short and clean (checked on single pushes only, so a long run
        # of tokens that end inside a character costs no rescans)
        self.tail_clean = (self.concat and len(token_ids) == 1 and len(window) <= 8
                           and all("\ufffd" not in self._decode([t]) for t in window))
        return delta

    def _push(self, token_ids: list[int]) -> str:
        """push by decoding the window with and without the new tokens."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return delta
        return ""

    def catch_up(self, output_ids: list[int]) -> str:
        """Push the output ids not pushed yet (up to an unresolved overlap placeholder, < 0); the new text."""
        if self.broken:  # a decode raised already: that failure ended the request (its phase says where)
            return ""
        try:
            if len(output_ids) == len(self.ids) - self.start + 1 and output_ids[-1] >= 0:
                return self.push(output_ids[-1:])  # the per-token case (stop strings, streaming)
            return self._catch_up(output_ids)
        except Exception:
            self.broken = True
            raise

    def _catch_up(self, output_ids: list[int]) -> str:
        pending = output_ids[self.consumed:]
        if len(pending) == 1 and pending[0] >= 0:  # the per-token case (stop strings, streaming)
            return self.push(pending)
        for i, t in enumerate(pending):
            if t < 0:
                pending = pending[:i]
                break
        if not pending:
            return ""
        if self.chunked and len(pending) > 1:
            prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
            new_text = self._decode(self.ids[self.prefix_offset:] + pending)
            if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
                self.ids.extend(pending)
                self.tail_clean = False  # the next push decodes and checks the new window
                self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
                return new_text[len(prefix_text):]
            # the chunk ends inside a character: single pushes emit what came before it, so do those
        return "".join(self.push([t]) for t in pending)

    def flush(self) -> str:
        """Text of tokens still held back, at finish; a character cut off by the finish is dropped."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        self.tail_clean = False
        return new_text[len(prefix_text):].rstrip("\ufffd")

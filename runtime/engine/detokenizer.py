"""Incremental detokenization that never emits a broken UTF-8 character."""

from __future__ import annotations

CONTEXT_TOKENS = 5  # prompt tokens decoded along with outputs so leading spaces come out right


class IncrementalDetokenizer:
    """Turns appended token ids into text deltas; a delta never ends in a partial character."""

    def __init__(self, tokenizer, prompt_ids: list[int], skip_special_tokens: bool = True,
                 spaces_between_special_tokens: bool = True):
        self.tokenizer = tokenizer
        self.kwargs = {"skip_special_tokens": skip_special_tokens,
                       "spaces_between_special_tokens": spaces_between_special_tokens}
        self.ids: list[int] = list(prompt_ids[-CONTEXT_TOKENS:])
        self.prefix_offset = 0
        self.read_offset = len(self.ids)
        self.start = len(self.ids)

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, **self.kwargs) if ids else ""

    def push(self, token_ids: list[int]) -> str:
        """Append tokens; return the newly completed text (maybe empty)."""
        self.ids.extend(token_ids)
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        if len(new_text) > len(prefix_text) and not new_text.endswith("\ufffd"):
            delta = new_text[len(prefix_text):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return delta
        return ""

    def flush(self) -> str:
        """Text of tokens still held back, at finish; a character cut off by the finish is dropped."""
        if self.read_offset >= len(self.ids):
            return ""
        prefix_text = self._decode(self.ids[self.prefix_offset:self.read_offset])
        new_text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return new_text[len(prefix_text):].rstrip("\ufffd")

"""A constraint that starts after the thinking section (SGLang's reasoner grammar): free text until the think-end
token, then the compiled guide. The thinking may not end the request (EOS is masked there: the request owes an
answer), and past max_thinking_tokens only the think-end token is allowed. An unconstrained request with a thinking
bound gets the same guide over free text (EOS allowed while thinking).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from sglpy.grammar import Guide
from sglpy.grammar.guide import JumpResult
from ..reasoning import ReasoningFormat, thinking_open


@dataclass(frozen=True)
class ThinkTokens:
    """The engine's reasoning settings: the think-end token id and the thinking budget (None: unbounded)."""

    fmt: ReasoningFormat
    end_id: int
    max_thinking_tokens: int | None

    @classmethod
    def from_tokenizer(cls, fmt: ReasoningFormat, tokenizer, max_thinking_tokens: int | None) -> "ThinkTokens":
        """ValueError when the tokenizer has no single token for the parser's think-end text."""
        ids = tokenizer.encode(fmt.end, add_special_tokens=False)
        if len(ids) != 1:
            raise ValueError(f"reasoning_parser {fmt.name!r} needs {fmt.end!r} as one token of the tokenizer "
                             f"(it encodes to {len(ids)} tokens)")
        return cls(fmt, ids[0], max_thinking_tokens)

    def bounded(self, max_thinking_tokens: int | None) -> "ThinkTokens":
        """These settings with a request's own thinking bound (None keeps the engine's)."""
        if max_thinking_tokens is None:
            return self
        return dataclasses.replace(self, max_thinking_tokens=max_thinking_tokens)

    def starts_thinking(self, prompt_text: str) -> bool:
        """A constrained request starts in the thinking section unless its prompt closed it."""
        return thinking_open(self.fmt, prompt_text) is not False


def reasoning_tokens(cfg, tokenizer) -> ThinkTokens | None:
    """The engine's ThinkTokens for cfg.reasoning_parser (None without a parser)."""
    if cfg.reasoning_parser is None:
        return None
    from ..reasoning import reasoning_format

    return ThinkTokens.from_tokenizer(reasoning_format(cfg.reasoning_parser), tokenizer, cfg.max_thinking_tokens)


class FreeText(Guide):
    """The answer of an unconstrained request whose thinking is bounded: every token, EOS included."""

    def __init__(self, info):
        self.info, self.initial_state = info, 0
        words = (info.vocab_size + 31) // 32
        every = np.full(words, 0xFFFFFFFF, dtype=np.uint32)
        if info.vocab_size % 32:  # no bits past the vocabulary
            every[-1] = np.uint32((1 << (info.vocab_size % 32)) - 1)
        self._all = every.view(np.int32)
        self._all.setflags(write=False)

    def allowed(self, state) -> np.ndarray:
        return self._all

    def advance(self, state, token_id: int):
        return 0

    def advance_bytes(self, state, data: bytes):
        return 0

    def is_final(self, state) -> bool:
        return True

    def can_continue(self, state) -> bool:
        return True

    def is_terminated(self, state) -> bool:
        return False

    def forced_bytes(self, state) -> bytes:
        return b""

    def forced_string(self, state) -> str:
        return ""

    def jump_tokens(self, state, generated_token_ids, forced: str | None = None, tokenizer: Any = None, **kw):
        return JumpResult(0, [], state)


def bounded_thinking_guide(think: ThinkTokens, info, prompt_text: str, max_thinking_tokens: int | None):
    """The guide of an unconstrained request on a reasoning model when a thinking bound applies (the request's, else
    the engine's) and its prompt leaves the thinking open: free thinking (EOS allowed: nothing is owed), `</think>`
    forced past the bound, then free text. None when no bound applies."""
    think = think.bounded(max_thinking_tokens)
    if think.max_thinking_tokens is None or not think.starts_thinking(prompt_text):
        return None
    return ThinkingGuide(FreeText(info), think, eos_while_thinking=True)


class ThinkingGuide(Guide):
    """States: ("think", tokens so far) until the end token, then ("answer", inner state)."""

    def __init__(self, inner: Guide, think: ThinkTokens, eos_while_thinking: bool = False):
        self.inner, self.think, self.info = inner, think, inner.info
        self.initial_state = ("think", 0)
        words = (inner.info.vocab_size + 31) // 32
        free = np.full(words, 0xFFFFFFFF, dtype=np.uint32)  # every token but EOS (a constrained answer is owed)
        for t in () if eos_while_thinking else inner.info.eos_token_ids:
            free[t >> 5] &= ~np.uint32(1 << (t & 31))
        only = np.zeros(words, dtype=np.uint32)
        only[think.end_id >> 5] = np.uint32(1 << (think.end_id & 31))
        self._free, self._only_end = free.view(np.int32), only.view(np.int32)
        self._free.setflags(write=False)
        self._only_end.setflags(write=False)

    def allowed(self, state) -> np.ndarray:
        phase, s = state
        if phase == "answer":
            return self.inner.allowed(s)
        budget = self.think.max_thinking_tokens
        return self._only_end if budget is not None and s >= budget else self._free

    def advance(self, state, token_id: int):
        phase, s = state
        if phase == "answer":
            return ("answer", self.inner.advance(s, token_id))
        if not self.token_allowed(state, token_id):
            raise ValueError(f"token {token_id} is not allowed while thinking")
        return ("answer", self.inner.initial_state) if token_id == self.think.end_id else ("think", s + 1)

    def advance_bytes(self, state, data: bytes):
        phase, s = state
        if phase != "answer":
            raise ValueError("no forced bytes while thinking")
        return ("answer", self.inner.advance_bytes(s, data))

    def is_final(self, state) -> bool:
        return state[0] == "answer" and self.inner.is_final(state[1])

    def can_continue(self, state) -> bool:
        return state[0] != "answer" or self.inner.can_continue(state[1])

    def is_terminated(self, state) -> bool:
        return state[0] == "answer" and self.inner.is_terminated(state[1])

    def forced_bytes(self, state) -> bytes:
        return self.inner.forced_bytes(state[1]) if state[0] == "answer" else b""

    def forced_string(self, state) -> str:
        return self.inner.forced_string(state[1]) if state[0] == "answer" else ""

    def jump_tokens(self, state, generated_token_ids, forced: str | None = None, tokenizer: Any = None, **kw):
        """The inner guide's jump over the answer's tokens only (never rolls back into the thinking)."""
        if state[0] != "answer":
            return JumpResult(0, [], state)
        ids = list(generated_token_ids)
        last = len(ids) - 1 - ids[::-1].index(self.think.end_id) if self.think.end_id in ids else -1
        res = self.inner.jump_tokens(state[1], ids[last + 1:], forced, tokenizer, **kw)
        return JumpResult(res.rollback, res.new_token_ids, ("answer", res.new_state))

"""The small interface every backend implements, plus the shared select-scoring logic."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Iterator, Optional

from .chat_template import CHATML, ChatTemplate
from .choices import ChoicesDecision, ChoicesSamplingMethod, token_length_normalized
from .nodes import GenParams


@dataclass(frozen=True)
class GenResult:
    """One gen's output: `text` (first sample), all samples when n > 1, and the runtime's meta_info."""

    text: str
    meta_info: dict = field(default_factory=dict)
    texts: tuple = ()


@dataclass(frozen=True)
class StreamChunk:
    """A streamed delta of generated text and the latest meta_info."""

    delta: str
    meta_info: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ChoiceScore:
    """Scored window of one choice: [logprob, token_id, text] triples over exactly its own tokens."""

    input_token_logprobs: list
    normalized_prompt_logprob: float
    unconditional_token_logprobs: Optional[list] = None
    cached_tokens: Optional[int] = None  # prompt tokens the runtime served from its prefix cache


class BaseBackend:
    """What the interpreter needs from a backend. Subclasses implement generate and score_choices."""

    supports_concate_and_append = False
    is_chat_model = False  # True: gens and selects go out as chat messages (generate_chat / select_chat)
    supports_api_spec = False  # num_api_spec_tokens applies (hosted APIs; a local runtime has its prefix cache)

    def get_chat_template(self) -> ChatTemplate:
        """The template role blocks use (subclasses derive it from the model's tokenizer)."""
        return CHATML

    def generate(self, text: str, params: GenParams) -> GenResult:
        """Continue `text` under `params` (dtype already lowered to a regex by the caller)."""
        raise NotImplementedError

    def generate_stream(self, text: str, params: GenParams) -> Iterator[StreamChunk]:
        """Stream deltas; default: one chunk holding the whole result."""
        res = self.generate(text, params)
        yield StreamChunk(res.text, res.meta_info)

    def score_choices(self, prefix: str, choices: list[str], need_unconditional: bool) -> list[ChoiceScore]:
        """Prompt logprobs of each choice's own tokens after `prefix`."""
        raise NotImplementedError

    def generate_chat(self, messages: list[dict], params: GenParams, partial: str = "") -> GenResult:
        """Chat models: the assistant's answer to `messages`, continuing the assistant text `partial` if given."""
        raise NotImplementedError(f"{type(self).__name__} is not a chat-model backend")

    def generate_chat_stream(self, messages: list[dict], params: GenParams, partial: str = "") -> Iterator[StreamChunk]:
        """Chat models: stream deltas; default: one chunk holding the whole answer."""
        res = self.generate_chat(messages, params, partial)
        yield StreamChunk(res.text, res.meta_info)

    def select_chat(self, messages: list[dict], partial: str, choices: list[str], temperature: float = 0.0,
                    choices_method: Optional[ChoicesSamplingMethod] = None) -> ChoicesDecision:
        """Chat models: pick one choice as the assistant's next text."""
        raise NotImplementedError(f"{type(self).__name__} is not a chat-model backend")

    def image_placeholder(self) -> str:
        """The prompt text that stands for one image (vision-model backends); others refuse sgl.image by name."""
        raise ValueError(f"sgl.image needs a vision model: {type(self).__name__} takes no images")

    def select(self, prefix: str, choices: list[str], temperature: float = 0.0,
               choices_method: Optional[ChoicesSamplingMethod] = None, **images) -> ChoicesDecision:
        """Pick one choice by `choices_method` over the scored windows (greedy: temperature must be 0)."""
        if temperature > 1e-5:
            raise ValueError(f"select scores choices deterministically; temperature must be 0, got {temperature}")
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"select needs a non-empty list of strings, got {choices!r}")
        method = choices_method or token_length_normalized
        scores = self.score_choices(prefix, list(choices), method.requires_unconditional_logprobs, **images)
        decision = method(
            choices=list(choices),
            normalized_prompt_logprobs=[sc.normalized_prompt_logprob for sc in scores],
            input_token_logprobs=[sc.input_token_logprobs for sc in scores],
            output_token_logprobs=[[] for _ in scores],
            unconditional_token_logprobs=[sc.unconditional_token_logprobs for sc in scores]
            if method.requires_unconditional_logprobs else None,
        )
        if any(sc.cached_tokens is not None for sc in scores):
            decision.meta_info["cached_tokens"] = [sc.cached_tokens for sc in scores]
        return decision

    def cache_prefix(self, text: str) -> None:
        """Prefill `text` without generating so later requests sharing it hit the prefix cache."""

    def flush_cache(self) -> bool:
        """Drop the runtime's prefix cache."""
        return False

    def get_server_info(self) -> dict:
        """Runtime configuration and state."""
        return {}

    def shutdown(self) -> None:
        """Release resources held by the backend."""


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Length of the longest common prefix of two token lists."""
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


@dataclass(frozen=True)
class ScoringPlan:
    """Token ids per choice and where each choice's own window starts."""

    prefix_ids: list
    full_ids: list  # one token list per choice: tokenize(prefix + choice)
    window_starts: list  # first scored position per choice

    @property
    def logprob_start_len(self) -> int:
        """Where to ask prompt logprobs from: the earliest window (every entry after position 0 has a value)."""
        return min(self.window_starts)

    @property
    def shared_prefix_len(self) -> int:
        """Tokens every choice shares before its window: prefilled once so the scoring requests reuse their KV."""
        return min(self.window_starts)


def plan_scoring(tokenize: Callable[[str], list[int]], prefix: str, choices: list[str]) -> ScoringPlan:
    """Define the scored window: the tokens of tokenize(prefix + choice) after its common prefix with tokenize(prefix).

    When the choice's first characters merge with the prefix's last token (" Yes" vs prefix "...:" + " "),
    the merged token carries the choice and is scored; prefix-only tokens never are.
    """
    prefix_ids = tokenize(prefix)
    fulls, starts = [], []
    for c in choices:
        ids = tokenize(prefix + c)
        start = common_prefix_len(prefix_ids, ids)
        if start >= len(ids):
            raise ValueError(f"select choice {c!r} adds no tokens after the prefix")
        fulls.append(ids)
        starts.append(start)
    return ScoringPlan(prefix_ids, fulls, starts)


def mean_logprob(entries: list) -> float:
    """Mean of the non-null logprobs of a window (the first prompt token has none)."""
    vals = [e[0] for e in entries if e[0] is not None]
    return sum(vals) / len(vals) if vals else 0.0


def scores_from_logprobs(plan: ScoringPlan, input_logprobs: list[list], start: int,
                         unconditional: Optional[list[list]] = None,
                         cached_tokens: Optional[list] = None) -> list[ChoiceScore]:
    """Slice each choice's window out of prompt logprobs that begin at position `start`."""
    out = []
    for i, entries in enumerate(input_logprobs):
        expected = len(plan.full_ids[i]) - start
        if len(entries) != expected:
            raise RuntimeError(f"runtime returned {len(entries)} prompt logprobs, expected {expected}")
        window = [list(e) for e in entries[plan.window_starts[i] - start:]]
        out.append(ChoiceScore(window, mean_logprob(window),
                               [list(e) for e in unconditional[i]] if unconditional else None,
                               cached_tokens[i] if cached_tokens else None))
    return out

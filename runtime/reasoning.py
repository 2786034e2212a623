"""Reasoning models' thinking section (SGLang's --reasoning-parser): the parsers' think tokens, the split of an
output into reasoning_content and content (whole or streamed), and whether a prompt leaves thinking open.

qwen3: `<think>...</think>`; the model opens the section itself unless the prompt already opened it.
deepseek-r1: the same tokens; the template opens the section, so the output starts inside it.
Both: a prompt whose last think token is `</think>` followed only by whitespace (Qwen3's template with
enable_thinking=false) has thinking closed, and the whole output is content. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ReasoningFormat:
    """One parser: its think tokens and whether the output starts inside the thinking section."""

    name: str
    start: str = "<think>"
    end: str = "</think>"
    starts_inside: bool = False


REASONING_PARSERS = {"qwen3": ReasoningFormat("qwen3"),
                     "deepseek-r1": ReasoningFormat("deepseek-r1", starts_inside=True)}


def reasoning_format(name: str) -> ReasoningFormat:
    """The parser called `name`; ValueError names the known ones."""
    if name not in REASONING_PARSERS:
        raise ValueError(f"reasoning_parser must be one of {sorted(REASONING_PARSERS)}, got {name!r}")
    return REASONING_PARSERS[name]


def thinking_open(fmt: ReasoningFormat, prompt: str | None) -> bool | None:
    """True: the prompt ends inside a thinking section; False: it closed one (only whitespace after `</think>`);
    None: the prompt says nothing (the output decides)."""
    if not prompt:
        return None
    s, e = prompt.rfind(fmt.start), prompt.rfind(fmt.end)
    if e >= 0 and e > s and not prompt[e + len(fmt.end):].strip():
        return False
    if s >= 0 and s > e and not prompt[s + len(fmt.start):].strip():
        return True
    return None


@dataclass(frozen=True)
class SplitOutput:
    """An output split at the thinking section: reasoning (None when there was none) and the answer."""

    reasoning: str | None
    content: str


def split_reasoning(fmt: ReasoningFormat, text: str, prompt_open: bool | None = None) -> SplitOutput:
    """Split a finished output; an unterminated section is all reasoning (as SGLang does)."""
    inside = fmt.starts_inside if prompt_open is None else prompt_open
    body = text
    if prompt_open is not False and text.lstrip().startswith(fmt.start):
        inside, body = True, text.lstrip()[len(fmt.start):]
    if not inside:
        return SplitOutput(None, text)
    end = body.find(fmt.end)
    if end < 0:
        return SplitOutput(body.strip(), "")
    return SplitOutput(body[:end].strip(), body[end + len(fmt.end):].lstrip())


class ReasoningStream:
    """Splits streamed text deltas: feed() returns (reasoning delta, content delta); a piece that may be the
    start of a think token is held until the next delta shows whether it is."""

    def __init__(self, fmt: ReasoningFormat, prompt_open: bool | None = None):
        self.fmt = fmt
        self.state = "start" if prompt_open is None and not fmt.starts_inside else (
            "think" if prompt_open is not False else "content")
        if prompt_open is None and fmt.starts_inside:
            self.state = "start_inside"
        self.held = ""

    def feed(self, delta: str, final: bool = False) -> tuple[str, str]:
        """The reasoning and content text this delta adds (final=True flushes what was held)."""
        text, self.held = self.held + delta, ""
        reasoning, content = [], []
        while text:
            if self.state in ("start", "start_inside"):
                stripped = text.lstrip()
                if not stripped and not final:
                    self.held = text
                    break
                if stripped.startswith(self.fmt.start):
                    self.state, text = "think", stripped[len(self.fmt.start):].lstrip()
                    continue
                if self.fmt.start.startswith(stripped) and not final:
                    self.held = text
                    break
                self.state = "think" if self.state == "start_inside" else "content"
                continue
            if self.state == "think":
                end = text.find(self.fmt.end)
                if end >= 0:
                    reasoning.append(text[:end])
                    self.state, text = "after", text[end + len(self.fmt.end):]
                    continue
                keep = 0 if final else _partial_suffix(text, self.fmt.end)
                reasoning.append(text[: len(text) - keep])
                self.held = text[len(text) - keep:]
                break
            if self.state == "after":  # whitespace between </think> and the answer is dropped
                text = text.lstrip()
                if text:
                    self.state = "content"
                continue
            content.append(text)
            break
        return "".join(reasoning), "".join(content)


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest suffix of text that is a proper prefix of token."""
    for n in range(min(len(token) - 1, len(text)), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0

"""sgl.separate_reasoning's step (SGLang's frontend meaning): split a finished gen's thinking off its variable into
`<name>_reasoning_content`, and keep only the answer in the program text (the prompt's end tells whether the
template opened the thinking). Skipped when streaming (as SGLang): the reasoning variable is then None."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Optional

from .nodes import SglSeparateReasoning, reasoning_name

if TYPE_CHECKING:
    from .interpreter import StreamExecutor


def model_type_of(ex: "StreamExecutor", node: SglSeparateReasoning) -> str:
    """The node's parser, else the backend engine's reasoning_parser; ValueError when neither is known."""
    if node.model_type is not None:
        return node.model_type
    engine = vars(ex.backend).get("engine")  # sgl.Engine's runtime engine (no attribute forwarding)
    parser = getattr(getattr(engine, "config", None), "reasoning_parser", None)
    if parser is None:
        raise ValueError("separate_reasoning needs model_type (a reasoning parser: qwen3 or deepseek-r1) unless the "
                         "backend is an sgl.Engine started with reasoning_parser=...")
    return parser


def _split_value(fmt, value: Any, prompt_open: Optional[bool], name: str):
    from sglpy.runtime.reasoning import split_reasoning

    if isinstance(value, str):
        s = split_reasoning(fmt, value, prompt_open)
        return s.content, s.reasoning
    if isinstance(value, list) and all(isinstance(v, str) for v in value):  # n > 1: each sample split
        parts = [split_reasoning(fmt, v, prompt_open) for v in value]
        return [p.content for p in parts], [p.reasoning for p in parts]
    raise ValueError(f"separate_reasoning: variable {name!r} holds {type(value).__name__}, not generated text")


def separate(ex: "StreamExecutor", node: SglSeparateReasoning) -> None:
    """Run one separate_reasoning node on the executor's worker thread."""
    from sglpy.runtime.reasoning import reasoning_format, thinking_open

    if ex.stream:
        for name in node.targets:
            ex._finish_var(reasoning_name(name), None, None)
        return
    fmt = reasoning_format(model_type_of(ex, node))
    # the last output first, so the earlier spans stay where they are when a text shrinks
    for name in sorted(node.targets, key=lambda n: ex.var_spans.get(n, (-1, -1))[0], reverse=True):
        span = ex.var_spans.get(name)
        prompt_open = thinking_open(fmt, ex.text_[:span[0]]) if span else None
        content, reasoning = _split_value(fmt, ex.variables.get(name), prompt_open, name)
        with ex.cond:
            if span is not None:  # the text keeps the answer where the output was (n > 1: the first sample's)
                answer = content if isinstance(content, str) else content[0]
                ex.text_ = ex.text_[:span[0]] + answer + ex.text_[span[1]:]
                ex.var_spans[name] = (span[0], span[0] + len(answer))
            ex.separating.discard(name)
        ex._finish_var(name, content, ex.meta_info.get(name))
        ex._finish_var(reasoning_name(name), reasoning, None)

"""`sgl.Anthropic`: programs on Anthropic's Messages API (api.anthropic.com, or any server speaking it, e.g.
`sglpy serve`'s POST /v1/messages or llama.cpp's server) over the official `anthropic` client.

A chat model: gens and selects run inside assistant turns. System messages become `system`; stop strings
`stop_sequences`; temperature, top_p and top_k (when not the default) go in the request body (the client has
no keywords for them); a gen after text in an assistant turn continues it as a prefill (Anthropic's own feature), so
speculative execution's per-gen fallback works here. `gen(json_schema=...)` is a forced call of one tool whose
`input_schema` is the schema (how Anthropic's structured outputs reach JSON); the value is the tool input as
JSON text. `select` asks for a forced tool call whose input is an enum of the choices (`select_method`
"tool_enum"), or generates and matches with `select_by="generate"`. Anything else the Messages API cannot take
(regex, dtype other than str-free generation, n > 1, min_tokens, logprobs, ...) raises UnsupportedFeature.
"""

from __future__ import annotations

import json
import threading
from typing import Any, Iterator, Optional

from .backend_base import BaseBackend, GenResult, StreamChunk
from .backend_openai import TokenUsage, UnsupportedFeature, select_by_enum_or_match
from .chat_template import ChatTemplate, get_chat_template
from .choices import ChoicesDecision, ChoicesSamplingMethod
from .nodes import GenParams, SamplingParams

JSON_TOOL = "json_output"
_TAKEN = ("max_new_tokens", "stop", "temperature", "top_p", "top_k", "json_schema", "skip_special_tokens",
          "spaces_between_special_tokens")


class Anthropic(BaseBackend):
    """`sgl.Anthropic(model, base_url=None, api_key=None, ...)`; other keywords go to `anthropic.Anthropic(...)`."""

    backend_name = "sgl.Anthropic"  # how errors name the backend
    is_chat_model = True
    supports_api_spec = True

    def __init__(self, model_name: str, *, base_url: Optional[str] = None, api_key: Optional[str] = None,
                 chat_template: Any = None, select_by: str = "auto", **client_kwargs):
        import anthropic

        if select_by not in ("auto", "generate"):
            raise ValueError(f"select_by must be 'auto' or 'generate', got {select_by!r}")
        if api_key is None and base_url is not None:
            import os

            api_key = os.environ.get("ANTHROPIC_API_KEY") or "EMPTY"  # local servers take any key
        self.client = anthropic.Anthropic(base_url=base_url, api_key=api_key, **client_kwargs)
        self._anthropic = anthropic
        self.model_name = model_name
        self.base_url = str(self.client.base_url).rstrip("/")
        self.select_by = select_by
        self.token_usage = TokenUsage()
        self._lock = threading.Lock()
        self.chat_template = chat_template if isinstance(chat_template, ChatTemplate) else \
            get_chat_template(chat_template or "default")  # role text is bookkeeping: the API renders its own

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def _unsupported(self, feature: str, hint: str = "") -> UnsupportedFeature:
        return UnsupportedFeature(f"{feature} is not supported by sgl.Anthropic ({self.model_name!r} at "
                                  f"{self.base_url})" + (f": {hint}" if hint else ""))

    def generate(self, text: str, params: GenParams) -> GenResult:
        raise self._unsupported("gen outside an assistant turn", "the Messages API answers messages")

    def request_kwargs(self, messages: list[dict], params: GenParams, partial: str) -> dict:
        """The anthropic-client keyword arguments; raises UnsupportedFeature for what the API cannot take."""
        sp, default = params.sampling, SamplingParams()
        if params.lora_path is not None:
            raise self._unsupported("lora_path (a LoRA adapter of an sglpy runtime)")
        if params.logprob_fields():
            raise self._unsupported(f"gen logprob options {sorted(params.logprob_fields())}")
        for f in SamplingParams.field_names():
            if f not in _TAKEN and getattr(sp, f) != getattr(default, f):
                raise self._unsupported(f"gen({f}=...)" if f != "regex" else "gen(regex=...) / dtype",
                                        "the Messages API has no such parameter")
        if sp.max_new_tokens is None:
            raise self._unsupported("max_tokens=None", "the Messages API needs a token limit")
        system = "\n".join(m["content"] for m in messages if m["role"] == "system")
        turns = [{"role": m["role"], "content": m["content"]} for m in messages if m["role"] != "system"]
        if partial:
            turns.append({"role": "assistant", "content": partial})
        kw: dict = {"model": self.model_name, "max_tokens": sp.max_new_tokens, "messages": turns}
        if system:
            kw["system"] = system
        if sp.stop:
            kw["stop_sequences"] = list(sp.stop)
        # The client has no sampling keywords; the Messages API takes them in the body when they are not the default.
        sampling = {name: getattr(sp, name) for name in ("temperature", "top_p", "top_k")
                    if getattr(sp, name) != getattr(default, name)}
        if sampling:
            kw["extra_body"] = sampling
        if sp.json_schema is not None:
            if partial:
                raise self._unsupported("gen(json_schema=...) after text in an assistant turn",
                                        "a forced tool call starts the turn")
            kw["tools"] = [{"name": JSON_TOOL, "description": "Answer with JSON matching this schema.",
                            "input_schema": json.loads(sp.json_schema)}]
            kw["tool_choice"] = {"type": "tool", "name": JSON_TOOL}
        return kw

    def _count(self, usage: Any) -> None:
        with self._lock:
            self.token_usage.calls += 1
            if usage is not None:
                self.token_usage.prompt_tokens += getattr(usage, "input_tokens", 0) or 0
                self.token_usage.completion_tokens += getattr(usage, "output_tokens", 0) or 0

    def _call(self, **kw):
        try:
            return self.client.messages.create(**kw)
        except self._anthropic.APIStatusError as e:
            raise RuntimeError(f"sgl.Anthropic ({self.model_name!r}) /v1/messages failed with HTTP {e.status_code}: "
                               f"{e.message}") from None
        except self._anthropic.APIConnectionError as e:
            raise ConnectionError(f"sgl.Anthropic cannot reach {self.base_url}: {e}") from None

    def generate_chat(self, messages: list[dict], params: GenParams, partial: str = "") -> GenResult:
        if params.sampling.n != 1:
            raise self._unsupported("n > 1", "the Messages API returns one answer")
        msg = self._call(**self.request_kwargs(messages, params, partial))
        self._count(msg.usage)
        text = ""
        for block in msg.content:
            if block.type == "tool_use":
                text += json.dumps(block.input, ensure_ascii=False)
            elif block.type == "text":
                text += block.text
        meta = {"id": msg.id, "finish_reason": {"type": msg.stop_reason, "matched": msg.stop_sequence},
                "prompt_tokens": msg.usage.input_tokens, "completion_tokens": msg.usage.output_tokens}
        return GenResult(text, meta, (text,))

    def generate_chat_stream(self, messages: list[dict], params: GenParams, partial: str = "") -> Iterator[StreamChunk]:
        if params.sampling.n != 1:
            raise self._unsupported("n > 1", "the Messages API returns one answer")
        kw = self.request_kwargs(messages, params, partial)
        try:
            stream = self.client.messages.create(stream=True, **kw)
        except self._anthropic.APIStatusError as e:
            raise RuntimeError(f"sgl.Anthropic ({self.model_name!r}) /v1/messages failed with HTTP {e.status_code}: "
                               f"{e.message}") from None
        usage_in, usage_out, meta = 0, 0, {}
        for ev in stream:
            if ev.type == "message_start":
                usage_in = ev.message.usage.input_tokens
            elif ev.type == "content_block_delta":
                d = ev.delta
                piece = d.text if d.type == "text_delta" else getattr(d, "partial_json", "")
                if piece:
                    yield StreamChunk(piece, meta)
            elif ev.type == "message_delta":
                usage_out = ev.usage.output_tokens
                meta = {"finish_reason": {"type": ev.delta.stop_reason, "matched": ev.delta.stop_sequence},
                        "prompt_tokens": usage_in, "completion_tokens": usage_out}
                yield StreamChunk("", meta)
        with self._lock:
            self.token_usage.calls += 1
            self.token_usage.prompt_tokens += usage_in or 0
            self.token_usage.completion_tokens += usage_out or 0

    def select_chat(self, messages: list[dict], partial: str, choices: list[str], temperature: float = 0.0,
                    choices_method: Optional[ChoicesSamplingMethod] = None) -> ChoicesDecision:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"select needs a non-empty list of strings, got {choices!r}")
        return select_by_enum_or_match(self, messages, partial, choices, "tool_enum", "the tool answer")

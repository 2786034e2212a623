"""`sgl.OpenAI`: programs on any OpenAI-compatible endpoint (OpenAI, vLLM, llama.cpp's server, `sglpy serve`).

Each feature runs natively where the endpoint can, else raises `UnsupportedFeature` naming the feature and the
backend (never a silent approximation). The request mapping (docs/frontend.md, "Hosted backends"):

* gen: max_tokens, stop, temperature, top_p, n, frequency/presence_penalty, seed, logit_bias as OpenAI fields;
  json_schema as `response_format` json_schema (chat) or SGLang's `json_schema` field (completions, SGLang-family
  servers only); regex, ebnf and SGLang's other sampling fields (top_k, min_p, min_tokens, stop_regex, ...) via
  `extra_body` to SGLang-family servers (ours, SGLang), detected by `GET /get_model_info` on the server root.
* dtype=int: the regex on SGLang-family servers; elsewhere an integer logit bias from a known tokenizer
  (tiktoken for OpenAI models, or `tokenizer=`), and the answer is checked against the int regex.
* select (method in the variable's meta, `select_method`): completion models score every choice from prompt
  logprobs (`echo` + `logprobs`, one request for all choices); chat models use a constrained choice (a regex on
  SGLang-family servers, else an enum `response_format`), or generation plus matching with `select_by="generate"`.
"""

from __future__ import annotations

import json
import re
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from .backend_base import BaseBackend, ChoiceScore, GenResult, StreamChunk, mean_logprob
from .chat_template import ChatTemplate, from_jinja, get_chat_template, get_chat_template_by_model_path
from .choices import ChoicesDecision, ChoicesSamplingMethod
from .nodes import GenParams, SamplingParams

INSTRUCT_MODEL_NAMES = ["gpt-3.5-turbo-instruct", "davinci-002", "babbage-002"]
MAX_LOGIT_BIAS_ENTRIES = 300  # OpenAI's limit on logit_bias entries
# SamplingParams fields sent to SGLang-family servers in extra_body (their OpenAI routes take SGLang's names).
_EXTENSION_FIELDS = {"top_k": "top_k", "min_p": "min_p", "min_new_tokens": "min_tokens",
                     "repetition_penalty": "repetition_penalty", "stop_token_ids": "stop_token_ids",
                     "stop_regex": "stop_regex", "ignore_eos": "ignore_eos", "no_stop_trim": "no_stop_trim",
                     "skip_special_tokens": "skip_special_tokens",
                     "spaces_between_special_tokens": "spaces_between_special_tokens", "regex": "regex",
                     "ebnf": "ebnf"}
_REGEX_SPECIAL = set("\\.^$*+?{}[]|()")


class UnsupportedFeature(NotImplementedError):
    """A program feature this backend/endpoint cannot honour exactly."""


@dataclass
class TokenUsage:
    """Tokens and API calls used so far (SGLang's name; `calls` counts requests)."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    calls: int = 0

    def reset(self) -> None:
        self.prompt_tokens = self.completion_tokens = self.calls = 0


def escape_regex(text: str) -> str:
    """`text` as a literal regex (only the metacharacters escaped, which every regex grammar accepts)."""
    return "".join("\\" + c if c in _REGEX_SPECIAL else c for c in text)


def choices_regex(choices: list[str]) -> str:
    """A regex matching exactly one of `choices`."""
    return "(" + "|".join(escape_regex(c) for c in choices) + ")"


def create_logit_bias_int(tokenizer) -> dict:
    """+100 logit bias on tokens made only of digits (and on EOS), at most 300 entries (SGLang's name).

    `tokenizer`: a tiktoken Encoding, or any object with `decode(ids)` and a vocabulary size (`n_vocab` or len()).
    """
    size = getattr(tokenizer, "n_vocab", None) or len(tokenizer)
    ids = []
    for i in range(size):
        try:
            s = tokenizer.decode([i])
        except Exception:  # ids without a text (tiktoken's gaps, special tokens)
            continue
        if s and s.strip().isdigit() and s.strip().isascii() and s.lstrip(" ") == s.strip():
            ids.append(i)
            if len(ids) >= MAX_LOGIT_BIAS_ENTRIES - 1:
                break
    eos = getattr(tokenizer, "eot_token", None)
    eos = getattr(tokenizer, "eos_token_id", None) if eos is None else eos
    bias = {str(i): 100 for i in ids}
    if isinstance(eos, int):
        bias[str(eos)] = 100
    return bias


def _tiktoken_for(model: str):
    try:
        import tiktoken
    except ImportError:
        return None
    try:
        return tiktoken.encoding_for_model(model)
    except Exception:  # unknown model, or the encoding files cannot be fetched here
        return None


class OpenAI(BaseBackend):
    """`sgl.OpenAI(model, base_url=None, api_key=None, is_chat_model=None, ...)` over the official `openai` client.

    `chat_template`: a ChatTemplate or a name for completion models (default: the server's own template on an
    SGLang-family server, else matched by model name). `tokenizer`: for dtype=int logit bias where the server has
    no regex constraint. `sglang_extensions`: None = detect (GET <root>/get_model_info), or force True/False.
    `select_by`: "auto" or "generate" (chat models: generation plus matching). Other keywords go to
    `openai.OpenAI(...)` (e.g. timeout, max_retries).
    """

    supports_api_spec = True
    backend_name = "sgl.OpenAI"  # how errors name the backend

    def __init__(self, model_name: str = "default", is_chat_model: Optional[bool] = None,
                 chat_template: Any = None, is_azure: bool = False, *, base_url: Optional[str] = None,
                 api_key: Optional[str] = None, tokenizer: Any = None, sglang_extensions: Optional[bool] = None,
                 select_by: str = "auto", **client_kwargs):
        import openai

        if select_by not in ("auto", "generate"):
            raise ValueError(f"select_by must be 'auto' or 'generate', got {select_by!r}")
        if api_key is None and base_url is not None:
            import os

            api_key = os.environ.get("OPENAI_API_KEY") or "EMPTY"  # local servers take any key
        cls = openai.AzureOpenAI if is_azure else openai.OpenAI
        self.client = cls(base_url=base_url, api_key=api_key, **client_kwargs)
        self._openai = openai
        self.model_name = model_name
        self.base_url = str(self.client.base_url).rstrip("/")
        self.api_key = api_key
        self.is_chat_model = model_name not in INSTRUCT_MODEL_NAMES if is_chat_model is None else bool(is_chat_model)
        self.select_by = select_by
        self.token_usage = TokenUsage()
        self._lock = threading.Lock()
        self._extensions = sglang_extensions if sglang_extensions is not None else (None if base_url else False)
        self._model_info: Optional[dict] = None
        self.tokenizer = tokenizer  # None: tiktoken's, for OpenAI's own models, loaded when dtype=int first needs it
        self._tiktoken_ok = base_url is None
        self._logit_bias_int: Optional[dict] = None
        self.chat_template = self._pick_template(chat_template)

    # ------------------------------------------------------------ endpoint facts

    def _root_url(self) -> str:
        return re.sub(r"/v1$", "", self.base_url)

    @property
    def sglang_extensions(self) -> bool:
        """Whether the server is SGLang-family (ours or SGLang): regex/ebnf/... via extra_body."""
        if self._extensions is None:
            self._extensions = self._probe_model_info() is not None
        return self._extensions

    def _probe_model_info(self) -> Optional[dict]:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            req = urllib.request.Request(self._root_url() + "/get_model_info", headers=headers)
            with urllib.request.urlopen(req, timeout=10) as r:
                info = json.loads(r.read().decode())
        except Exception:  # not an SGLang-family server (404, HTML, unreachable)
            return None
        if isinstance(info, dict) and "model_path" in info:
            self._model_info = info
            return info
        return None

    def _pick_template(self, chat_template: Any) -> ChatTemplate:
        if isinstance(chat_template, ChatTemplate):
            return chat_template
        if isinstance(chat_template, str):
            return get_chat_template(chat_template)
        if self.is_chat_model:  # role text is only bookkeeping: the endpoint renders its own template
            return get_chat_template("default")
        if self._extensions is not False and self.sglang_extensions and self._model_info:
            jinja = self._model_info.get("chat_template")
            special = self._model_info.get("special_tokens") or {}
            if isinstance(jinja, str) and jinja:
                try:
                    return from_jinja(jinja, bos_token=special.get("bos_token") or "",
                                      eos_token=special.get("eos_token") or "", name=self.model_name)
                except Exception:  # an unusual template: name matching, as for other servers
                    pass
        return get_chat_template_by_model_path(self.model_name)

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def _unsupported(self, feature: str, hint: str = "") -> UnsupportedFeature:
        kind = "chat" if self.is_chat_model else "completion"
        return UnsupportedFeature(f"{feature} is not supported by {self.backend_name} ({self.model_name!r}, {kind} model at "
                                  f"{self.base_url})" + (f": {hint}" if hint else ""))

    # ------------------------------------------------------------ request mapping

    def request_kwargs(self, params: GenParams, chat: bool) -> dict:
        """The openai-client keyword arguments for one gen; raises UnsupportedFeature for what cannot be sent."""
        sp, default = params.sampling, SamplingParams()
        if params.lora_path is not None:
            raise self._unsupported("lora_path (a LoRA adapter of an sglpy runtime)")
        if params.logprob_fields():
            raise self._unsupported(f"gen logprob options {sorted(params.logprob_fields())}")
        if sp.structural_tag is not None:
            raise self._unsupported("gen(tools=...) / structural_tag", "use sgl.RuntimeEndpoint or sgl.Engine")
        kw: dict = {"model": self.model_name, "temperature": sp.temperature, "top_p": sp.top_p, "n": sp.n}
        if sp.max_new_tokens is not None:
            kw["max_completion_tokens" if chat and re.match(r"o\d|gpt-5", self.model_name) else "max_tokens"] = \
                sp.max_new_tokens
        if sp.stop:
            kw["stop"] = list(sp.stop)
        for name in ("frequency_penalty", "presence_penalty"):
            if getattr(sp, name) != getattr(default, name):
                kw[name] = getattr(sp, name)
        if sp.seed is not None:
            kw["seed"] = sp.seed
        if sp.logit_bias:
            kw["logit_bias"] = {str(k): v for k, v in sp.logit_bias.items()}
        extra: dict = {}
        if sp.json_schema is not None:
            if chat:
                kw["response_format"] = {"type": "json_schema",
                                         "json_schema": {"name": "output", "schema": json.loads(sp.json_schema)}}
            elif self.sglang_extensions:
                extra["json_schema"] = sp.json_schema
            else:
                raise self._unsupported("gen(json_schema=...)", "a completion endpoint has no response_format; use a "
                                        "chat model or an SGLang-family server")
        int_bias = False
        for field, wire in _EXTENSION_FIELDS.items():
            value = getattr(sp, field)
            if value == getattr(default, field) or value is None:
                continue
            if self.sglang_extensions:
                extra[wire] = list(value) if isinstance(value, tuple) else value
            elif field == "regex" and self._is_int_regex(value):
                int_bias = True
            else:
                raise self._unsupported(f"gen({field}=...)", "the endpoint takes no such field (SGLang-family "
                                        "servers take it via extra_body)")
        if sp.choices is not None:
            raise self._unsupported("gen(choices=...) as a sampling field", "use sgl.select")
        if int_bias:
            kw["logit_bias"] = {**self._int_logit_bias(), **kw.get("logit_bias", {})}
        if extra:
            kw["extra_body"] = extra
        return kw

    @staticmethod
    def _is_int_regex(regex: str) -> bool:
        from sglpy.grammar import DTYPE_REGEX

        return regex == DTYPE_REGEX["int"]

    def _int_logit_bias(self) -> dict:
        if self.tokenizer is None and self._tiktoken_ok:
            self.tokenizer, self._tiktoken_ok = _tiktoken_for(self.model_name), False
        if self.tokenizer is None:
            raise self._unsupported("gen(dtype=int)", "no regex constraint on this endpoint and no tokenizer for an "
                                    "integer logit bias (pass tokenizer=, or install tiktoken for OpenAI models)")
        if self._logit_bias_int is None:
            self._logit_bias_int = create_logit_bias_int(self.tokenizer)
        return self._logit_bias_int

    def _check_int(self, params: GenParams, texts: tuple) -> None:
        regex = params.sampling.regex
        if regex is not None and not self.sglang_extensions and self._is_int_regex(regex):
            for t in texts:
                if not re.fullmatch(regex, t):
                    raise RuntimeError(f"gen(dtype=int) on {self.backend_name} ({self.model_name!r}): the integer logit bias "
                                       f"did not yield an integer ({t!r})")

    # ------------------------------------------------------------ calls

    def _count(self, usage: Any) -> None:
        with self._lock:
            self.token_usage.calls += 1
            if usage is not None:
                self.token_usage.prompt_tokens += usage.prompt_tokens or 0
                self.token_usage.completion_tokens += usage.completion_tokens or 0

    def _call(self, route: str, fn, **kw):
        try:
            return fn(**kw)
        except self._openai.APIStatusError as e:
            raise RuntimeError(f"{self.backend_name} ({self.model_name!r}) {route} failed with HTTP {e.status_code}: "
                               f"{e.message}") from None
        except self._openai.APIConnectionError as e:
            raise ConnectionError(f"{self.backend_name} cannot reach {self.base_url} ({route}): {e}") from None

    @staticmethod
    def _meta(ret, choice) -> dict:
        usage = getattr(ret, "usage", None)
        meta = {"id": ret.id, "finish_reason": {"type": choice.finish_reason}}
        if usage is not None:
            meta.update(prompt_tokens=usage.prompt_tokens, completion_tokens=usage.completion_tokens)
        return meta

    def generate(self, text: str, params: GenParams) -> GenResult:
        if self.is_chat_model:
            raise self._unsupported("gen outside an assistant turn", "a chat model answers messages")
        kw = self.request_kwargs(params, chat=False)
        ret = self._call("/completions", self.client.completions.create, prompt=text, **kw)
        self._count(ret.usage)
        texts = tuple(c.text for c in sorted(ret.choices, key=lambda c: c.index))
        self._check_int(params, texts)
        return GenResult(texts[0], self._meta(ret, ret.choices[0]), texts)

    def generate_stream(self, text: str, params: GenParams) -> Iterator[StreamChunk]:
        kw = self.request_kwargs(params, chat=False)
        stream = self._call("/completions", self.client.completions.create, prompt=text, stream=True,
                            stream_options={"include_usage": True}, **kw)
        yield from self._stream(stream, chat=False)

    def _chat_messages(self, messages: list[dict], partial: str) -> tuple[list[dict], dict]:
        msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
        if not partial:
            return msgs, {}
        if not self.sglang_extensions:
            raise self._unsupported("continuing a partial assistant message (a gen after text in an assistant turn)",
                                    "chat endpoints start a new assistant message; put the gen first in the turn")
        return msgs + [{"role": "assistant", "content": partial}], {"continue_final_message": True}

    def generate_chat(self, messages: list[dict], params: GenParams, partial: str = "") -> GenResult:
        kw = self.request_kwargs(params, chat=True)
        msgs, extra = self._chat_messages(messages, partial)
        if extra:
            kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
        ret = self._call("/chat/completions", self.client.chat.completions.create, messages=msgs, **kw)
        self._count(ret.usage)
        texts = tuple(c.message.content or "" for c in sorted(ret.choices, key=lambda c: c.index))
        self._check_int(params, texts)
        return GenResult(texts[0], self._meta(ret, ret.choices[0]), texts)

    def generate_chat_stream(self, messages: list[dict], params: GenParams, partial: str = "") -> Iterator[StreamChunk]:
        kw = self.request_kwargs(params, chat=True)
        msgs, extra = self._chat_messages(messages, partial)
        if extra:
            kw["extra_body"] = {**kw.get("extra_body", {}), **extra}
        stream = self._call("/chat/completions", self.client.chat.completions.create, messages=msgs, stream=True,
                            stream_options={"include_usage": True}, **kw)
        yield from self._stream(stream, chat=True)

    def _stream(self, stream, chat: bool) -> Iterator[StreamChunk]:
        usage, meta = None, {}
        for ev in stream:
            if getattr(ev, "usage", None) is not None:
                usage = ev.usage
            if not ev.choices:
                continue
            c = ev.choices[0]
            delta = (c.delta.content if chat else c.text) or ""
            if c.finish_reason is not None:
                meta = {"id": ev.id, "finish_reason": {"type": c.finish_reason}}
            if delta or c.finish_reason is not None:
                yield StreamChunk(delta, meta)
        self._count(usage)

    # ------------------------------------------------------------ select

    def score_choices(self, prefix: str, choices: list[str], need_unconditional: bool) -> list[ChoiceScore]:
        """Prompt logprobs of each choice's tokens (echo + logprobs); the window is the tokens reaching past the prefix."""
        windows = [w[1] for w in self._echo_logprobs([prefix + c for c in choices], len(prefix))]
        for c, w in zip(choices, windows):
            if not w:
                raise ValueError(f"select choice {c!r} adds no tokens after the prefix")
        uncond = None
        if need_unconditional:
            texts = ["".join(e[2] for e in w) for w in windows]
            uncond = [w for _, w in self._echo_logprobs(texts, 0)]
            for w, u in zip(windows, uncond):
                if len(w) != len(u):
                    raise self._unsupported("unconditional_likelihood_normalized", "the choice tokenizes differently "
                                            "without its prefix, so the windows cannot be compared")
        return [ChoiceScore(w, mean_logprob(w), uncond[i] if uncond else None) for i, w in enumerate(windows)]

    def _echo_logprobs(self, prompts: list[str], prefix_len: int) -> list[tuple[list, list]]:
        """(all prompt entries, entries reaching past prefix_len) per prompt, as [logprob, None, token text]."""
        ret = self._call("/completions (echo + logprobs)", self.client.completions.create, model=self.model_name,
                         prompt=prompts, echo=True, logprobs=0, max_tokens=1, temperature=0)
        self._count(ret.usage)
        out = []
        for c, p in zip(sorted(ret.choices, key=lambda c: c.index), prompts):
            lp = c.logprobs
            if lp is None or not lp.tokens or lp.text_offset is None:
                raise self._unsupported("select by prompt logprobs", "the endpoint returned no prompt logprobs")
            entries, window = [], []
            for tok, val, off in zip(lp.tokens, lp.token_logprobs, lp.text_offset):
                if off >= len(p):  # the generated token
                    break
                entries.append([val, None, tok])
                if off + len(tok) > prefix_len:
                    window.append([val, None, tok])
            out.append((entries, window))
        return out

    def select(self, prefix: str, choices: list[str], temperature: float = 0.0,
               choices_method: Optional[ChoicesSamplingMethod] = None) -> ChoicesDecision:
        try:
            decision = super().select(prefix, choices, temperature, choices_method)
            decision.meta_info["select_method"] = "prompt_logprobs"
            return decision
        except (UnsupportedFeature, RuntimeError) as e:
            if not self.sglang_extensions:
                raise self._unsupported("select", f"scoring by prompt logprobs failed ({e})") from None
        res = self.generate(prefix, GenParams(SamplingParams(temperature=0, max_new_tokens=_choice_budget(choices),
                                                             regex=choices_regex(choices))))
        return ChoicesDecision(res.text, {"select_method": "constrained_regex", **res.meta_info})

    def select_chat(self, messages: list[dict], partial: str, choices: list[str], temperature: float = 0.0,
                    choices_method: Optional[ChoicesSamplingMethod] = None) -> ChoicesDecision:
        if not choices or not all(isinstance(c, str) for c in choices):
            raise ValueError(f"select needs a non-empty list of strings, got {choices!r}")
        budget = _choice_budget(choices)
        if self.select_by == "auto" and self.sglang_extensions:
            res = self.generate_chat(messages, GenParams(SamplingParams(
                temperature=0, max_new_tokens=budget, regex=choices_regex(choices))), partial)
            if res.text not in choices:
                raise RuntimeError(f"select on {self.backend_name}: the constrained answer {res.text!r} is not a choice")
            return ChoicesDecision(res.text, {"select_method": "constrained_regex", **res.meta_info})
        return select_by_enum_or_match(self, messages, partial, choices, "json_schema_enum",
                                       "the enum response_format answer")


def _choice_budget(choices: list[str]) -> int:
    """Tokens enough for the longest choice (a token is at least one character)."""
    return max(len(c) for c in choices) + 2


def select_by_enum_or_match(backend, messages: list[dict], partial: str, choices: list[str], enum_method: str,
                            enum_answer: str) -> ChoicesDecision:
    """A chat select by a JSON-schema enum (a fresh turn, select_by "auto"), else by generation plus matching.

    backend: a hosted backend with generate_chat, select_by and backend_name; enum_method / enum_answer name the
    enum route in the decision's meta and in its error (a response_format on OpenAI, a forced tool on Anthropic).
    """
    budget = _choice_budget(choices)
    if backend.select_by == "auto" and not partial:
        schema = {"type": "object", "properties": {"choice": {"type": "string", "enum": list(choices)}},
                  "required": ["choice"], "additionalProperties": False}
        res = backend.generate_chat(messages, GenParams(SamplingParams(
            temperature=0, max_new_tokens=budget + 16, json_schema=json.dumps(schema))))
        try:
            value = json.loads(res.text)["choice"]
        except (ValueError, KeyError, TypeError):
            value = None
        if value not in choices:
            raise RuntimeError(f"select on {backend.backend_name}: {enum_answer} {res.text!r} names no choice")
        return ChoicesDecision(value, {"select_method": enum_method, **res.meta_info})
    res = backend.generate_chat(messages, GenParams(SamplingParams(temperature=0, max_new_tokens=budget)), partial)
    value = match_choice(res.text, choices)
    if value is None:
        raise RuntimeError(f"select on {backend.backend_name} (generation plus matching): the answer {res.text!r} "
                           f"matches none of {choices!r}")
    return ChoicesDecision(value, {"select_method": "generate_and_match", "generated": res.text, **res.meta_info})


def match_choice(answer: str, choices: list[str]) -> Optional[str]:
    """The choice an answer names: equal after stripping (case-insensitive), else the one choice it starts with."""
    a = answer.strip().strip(".\"'").strip()
    for c in choices:
        if a == c.strip():
            return c
    lowered = [c for c in choices if a.lower() == c.strip().lower()]
    if len(lowered) == 1:
        return lowered[0]
    starts = [c for c in choices if a.lower().startswith(c.strip().lower())]
    starts = [c for c in starts if len(c.strip()) == max(len(x.strip()) for x in starts)] if starts else []
    return starts[0] if len(starts) == 1 else None


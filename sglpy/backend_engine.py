"""In-process backend `sgl.Engine`: programs call the runtime engine (sglpy.runtime.engine.Engine) directly, no HTTP."""

from __future__ import annotations

from typing import Any, Iterator, Optional

from .backend_base import BaseBackend, ChoiceScore, GenResult, StreamChunk, plan_scoring, scores_from_logprobs
from .chat_template import ChatTemplate, from_hf_tokenizer, get_chat_template
from .nodes import GenParams


def check_output(out: dict) -> dict:
    """Raise on an aborted request so the program fails with the runtime's message."""
    reason = (out.get("meta_info") or {}).get("finish_reason") or {}
    if isinstance(reason, dict) and reason.get("type") == "abort":
        raise RuntimeError(f"the runtime aborted the request: {reason.get('message', 'no message')}")
    return out


class Engine(BaseBackend):
    """`sgl.Engine(model_path=None, **engine_options)`: the frontend backend running the model in-process.

    The public name is SGLang's (`sgl.Engine`); it wraps the runtime engine (sglpy.runtime.engine.Engine,
    imported here as RuntimeEngine), which it builds from `engine_options` unless `engine=` is given.
    """

    def __init__(self, model_path: Optional[str] = None, *, engine: Any = None,
                 chat_template: Optional[str] = None, **engine_options):
        if engine is None:
            from sglpy.runtime.engine import Engine as RuntimeEngine

            model = engine_options.pop("model", None) or model_path
            engine = RuntimeEngine(model=model, **engine_options)
        elif engine_options:
            raise ValueError(f"engine options {sorted(engine_options)} given together with an engine instance")
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.chat_template = (get_chat_template(chat_template) if chat_template
                              else from_hf_tokenizer(self.tokenizer, name=getattr(engine, "model_path", "hf")))

    def get_chat_template(self) -> ChatTemplate:
        return self.chat_template

    def image_placeholder(self) -> str:
        """The served model's image placeholder (a text-only model refuses sgl.image by name)."""
        info = self.engine.info()
        if not info.image_placeholder:
            raise ValueError(f"sgl.image needs a vision model; {info.model_path} is text-only")
        return info.image_placeholder

    def tokenize(self, text: str) -> list[int]:
        """Token ids exactly as the engine tokenizes a text prompt."""
        return list(self.tokenizer.encode(text)) if text else []

    def generate(self, text=None, sampling=None, images=(), **kwargs):
        """Frontend call `generate(text, GenParams) -> GenResult`; any other call (SGLang's offline
        `Engine.generate(prompt, sampling_params, ...)`) goes straight to the runtime engine."""
        if not (isinstance(text, str) and isinstance(sampling, GenParams) and not kwargs):
            if text is not None:
                kwargs["prompt"] = text
            if sampling is not None:
                kwargs["sampling_params"] = sampling
            return self.engine.generate(**kwargs)
        extra = {"image_data": list(images)} if images else {}
        out = self.engine.generate(prompt=text, sampling_params=sampling.sampling, **sampling.request_fields(),
                                   **extra)
        outs = [check_output(o) for o in (out if isinstance(out, list) else [out])]  # n > 1: a list of n samples
        return GenResult(outs[0]["text"], outs[0]["meta_info"], tuple(o["text"] for o in outs))

    def generate_stream(self, text: str, params: GenParams, images=()) -> Iterator[StreamChunk]:
        pos = 0
        extra = {"image_data": list(images)} if images else {}
        for chunk in self.engine.generate(prompt=text, sampling_params=params.sampling, stream=True,
                                          **params.request_fields(), **extra):
            check_output(chunk)
            delta, pos = chunk["text"][pos:], len(chunk["text"])
            yield StreamChunk(delta, chunk["meta_info"])

    def score_choices(self, prefix: str, choices: list[str], need_unconditional: bool,
                      images=()) -> list[ChoiceScore]:
        plan = plan_scoring(self.tokenize, prefix, choices)
        start = plan.logprob_start_len
        # One prefill of the shared prefix first, so every choice below hits the radix cache.
        shared = plan.shared_prefix_len
        with_images = {}
        if images:  # every choice's prompt holds the program's images (each placeholder is one token here)
            token = self.engine.vision.image_token_id
            if plan.prefix_ids[:shared].count(token) == len(images):
                self.engine.generate(input_ids=plan.prefix_ids[:shared], sampling_params={"max_new_tokens": 0},
                                     image_data=list(images))
            shared = 0
            with_images = {"image_data": [list(images)] * len(plan.full_ids)}
        if shared > 0:
            self.engine.generate(input_ids=plan.prefix_ids[:shared], sampling_params={"max_new_tokens": 0})
        outs = self.engine.generate(input_ids=plan.full_ids, sampling_params={"max_new_tokens": 0, "temperature": 0},
                                    return_logprob=True, logprob_start_len=start, return_text_in_logprobs=True,
                                    **with_images)
        metas = [check_output(o)["meta_info"] for o in outs]
        logprobs = [m["input_token_logprobs"] for m in metas]
        uncond = None
        if need_unconditional:
            windows = [ids[s:] for ids, s in zip(plan.full_ids, plan.window_starts)]
            uouts = self.engine.generate(input_ids=windows, sampling_params={"max_new_tokens": 0, "temperature": 0},
                                         return_logprob=True, logprob_start_len=0, return_text_in_logprobs=True)
            uncond = [check_output(o)["meta_info"]["input_token_logprobs"] for o in uouts]
        return scores_from_logprobs(plan, logprobs, start, uncond, [m.get("cached_tokens") for m in metas])

    def cache_prefix(self, text: str, images=()) -> None:
        if text:
            extra = {"image_data": list(images)} if images else {}
            check_output(self.engine.generate(prompt=text, sampling_params={"max_new_tokens": 0}, **extra))

    def flush_cache(self) -> bool:
        return bool(self.engine.flush_cache())

    def get_server_info(self) -> dict:
        return self.engine.get_server_info()

    def shutdown(self) -> None:
        self.engine.shutdown()

    def __getattr__(self, name: str):
        # The rest of the runtime engine's API (async_generate, abort, ...) stays reachable, as in SGLang.
        if name == "engine":
            raise AttributeError(name)
        return getattr(self.engine, name)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.shutdown()

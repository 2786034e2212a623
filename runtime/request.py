"""The one way in: a request's fields (SGLang's GenerateReqInput names) -> one GenerateReqInput per prompt and sample.

Every path parses here: the offline `Engine.generate()`, POST /generate, the OpenAI routes and /v1/messages. The
routes keep only their wire checks (their tables, their own field names translated to these) and map
`RequestError` to a 400 in one place (server/http_common.request_errors). Done here, once: prompts (text or
input_ids, one or a batch), per-item fields, sampling parameters, logprob options, token-id checks against the
vocabulary, the cache namespace, `n` expansion (sample j of a seeded request draws from its own seed,
`sample_seed`) and request ids.

`image_data` is per prompt too, but its own value may be a list (a prompt's images), so it is read apart
(`prompt_images`): one image or a list for a single prompt, one entry per prompt for a batch; every image is decoded
and checked against the limits here (a bad one is a RequestError naming it; the engine never sees it).

Adding a per-item field (one value, or in a batch one per prompt), e.g. an adapter path: add it to
ITEM_FIELDS with its default and give GenerateReqInput (runtime/messages.py) a field of the same name; every path
then accepts it and copies it onto each item (a route still lists it in its wire table). A request-wide field that
reaches the engine goes into REQUEST_FIELDS the same way.
"""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from dataclasses import dataclass
from typing import Callable

from .images import ImageLimits, image_list
from .messages import GenerateReqInput
from .sampling_params import LogprobOptions, SamplingParams

MAX_TOP_LOGPROBS_NUM = 256  # top_logprobs_num cap (also bounded by the vocabulary)
TOP_K_ALL = 1 << 30  # SGLang's "whole vocabulary" top_k (its default); -1 means the same

# per-item fields and their defaults: one value for every prompt, or (batch) a list with one per prompt
ITEM_FIELDS: dict[str, object] = {
    "sampling_params": None, "rid": None, "return_logprob": False, "logprob_start_len": -1, "top_logprobs_num": 0,
    "extra_key": None, "cache_salt": None, "lora_path": None,
}
# request-wide fields and their defaults (the prompt is `text` or `input_ids`)
REQUEST_FIELDS: dict[str, object] = {
    "text": None, "input_ids": None, "return_text_in_logprobs": False, "stream": False, "max_thinking_tokens": None,
    "trace": None,
}
_PARSED = {"text", "input_ids", "sampling_params", "rid", "extra_key", "cache_salt", *LogprobOptions.field_names()}
# the fields copied onto every GenerateReqInput under their own name
_COPIED = tuple(f.name for f in dataclasses.fields(GenerateReqInput)
                if f.name in {**ITEM_FIELDS, **REQUEST_FIELDS} and f.name not in _PARSED)


class RequestError(ValueError):
    """A request we cannot honour; `param` names the field at fault (a 400 on the server)."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.message, self.param = message, param


@dataclass(frozen=True)
class ParsedRequest:
    """A request as engine inputs: one per prompt x sample, each item's prompt index, and whether to answer a list."""

    items: list[GenerateReqInput]
    prompt_of: list[int]
    batch: bool


def new_rid() -> str:
    """A fresh request id (uuid4 hex, as SGLang)."""
    return uuid.uuid4().hex


def sample_seed(seed: int | None, j: int) -> int | None:
    """The seed of sample j of a request: sample 0 keeps the request's seed, the others draw their own stream."""
    if seed is None or j == 0:
        return seed
    return int.from_bytes(hashlib.blake2b(f"{seed}:{j}".encode(), digest_size=8).digest(), "big") >> 1


def check_token_ids(ids, vocab_size: int | None, param: str) -> None:
    """RequestError naming the first ids outside [0, vocab_size) (None: the vocabulary is not known here)."""
    if vocab_size is None:
        return
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise RequestError(f"{param}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})", param)


def sampling_params(value, vocab_size: int | None = None, param: str = "sampling_params") -> SamplingParams:
    """SamplingParams from a SamplingParams, None or a dict of SGLang names (JSON spellings accepted), checked."""
    if not isinstance(value, SamplingParams):
        fields = dict(value or {})
        if "seed" in fields and "sampling_seed" in fields:
            raise RequestError(f"{param}: give seed or sampling_seed, not both", "sampling_seed")
        if fields.get("top_k") == TOP_K_ALL:
            fields["top_k"] = -1
        if isinstance(fields.get("logit_bias"), dict):
            try:
                fields["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
            except ValueError as e:
                raise RequestError(f"invalid {param}: logit_bias keys must be token ids ({e})", param) from None
        if fields.get("structural_tag") is not None:
            from sglpy.grammar.structural_tag import StructuralTag

            try:  # the spec's shape is checked here; its schemas when the constraint compiles
                fields["structural_tag"] = StructuralTag.parse(fields["structural_tag"]).to_json()
            except ValueError as e:
                raise RequestError(f"{param}.structural_tag: {e}", "structural_tag") from None
        try:
            value = SamplingParams.from_dict(fields)
        except (ValueError, TypeError) as e:
            raise RequestError(f"invalid {param}: {e}", param) from None
    check_token_ids(value.stop_token_ids, vocab_size, f"{param}.stop_token_ids")
    check_token_ids(list(value.logit_bias or {}), vocab_size, f"{param}.logit_bias")
    return value


def logprob_options(return_logprob=False, start=-1, top=0, with_text=False,
                    vocab_size: int | None = None) -> LogprobOptions:
    """LogprobOptions, range-checked (top_logprobs_num capped; logprob_start_len -1 or a position)."""
    top = 0 if top is None else top
    cap = MAX_TOP_LOGPROBS_NUM if vocab_size is None else min(MAX_TOP_LOGPROBS_NUM, vocab_size)
    if not isinstance(top, bool) and isinstance(top, int) and not 0 <= top <= cap:
        raise RequestError(f"top_logprobs_num must be in [0, {cap}], got {top}", "top_logprobs_num")
    try:
        return LogprobOptions(return_logprob=bool(return_logprob), return_text_in_logprobs=bool(with_text),
                              logprob_start_len=-1 if start is None else start, top_logprobs_num=top)
    except ValueError as e:
        raise RequestError(str(e), str(e).split()[0]) from None  # the message starts with the field's name


def cache_namespace(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The prefix-cache namespace of extra_key and cache_salt (SGLang: "" means none)."""
    extra_key, cache_salt = extra_key or None, cache_salt or None
    if cache_salt is None:
        return extra_key
    return f"{extra_key or ''}\x00salt:{cache_salt}"


def parse_prompts(text, input_ids, vocab_size: int | None = None) -> tuple[list[dict], bool]:
    """The prompts ({"text"} or {"input_ids"} each) and whether they came as a batch (a list of prompts)."""
    if (text is None) == (input_ids is None):
        raise RequestError("give exactly one of text (prompt) or input_ids", "text")
    if text is not None:
        batch = isinstance(text, list)
        prompts = [{"text": t} for t in (text if batch else [text])]
        if any(not isinstance(p["text"], str) for p in prompts):
            raise RequestError("text (prompt) must be a string or a list of strings", "text")
    else:
        batch = isinstance(input_ids, list) and bool(input_ids) and isinstance(input_ids[0], list)
        rows = input_ids if batch else [input_ids]
        if not all(isinstance(r, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in r)
                   for r in rows):
            raise RequestError("input_ids must be a list of ints or a list of lists of ints", "input_ids")
        if any(not r for r in rows):
            raise RequestError("input_ids must not be empty", "input_ids")
        for r in rows:
            check_token_ids(r, vocab_size, "input_ids")
        prompts = [{"input_ids": r} for r in rows]
    if not prompts:
        raise RequestError("the batch is empty", "text" if text is not None else "input_ids")
    return prompts, batch


def _per_item(value, k: int, name: str, default) -> list:
    if isinstance(value, list):
        if len(value) != k:
            raise RequestError(f"{name} has {len(value)} entries for a batch of {k}", name)
        return [default if v is None else v for v in value]
    return [default if value is None else value] * k


def _default_rid(rids: list) -> Callable[[int, int, int], str]:
    def rid_of(i: int, j: int, n: int) -> str:
        return (str(rids[i]) if rids[i] is not None else new_rid()) + (f"-{j}" if n > 1 else "")
    return rid_of


def prompt_images(image_data, k: int, batch: bool, limits: ImageLimits | None) -> list:
    """Each prompt's images as checked bytes (None: no images); RequestError names the problem."""
    if image_data is None:
        return [None] * k
    if batch:
        if not isinstance(image_data, list) or len(image_data) != k:
            raise RequestError(f"image_data needs one entry (an image, a list of images or null) per prompt of the "
                               f"batch ({k})", "image_data")
        entries = image_data
    else:
        entries = [image_data]
    try:
        return [tuple(image_list(e, limits or ImageLimits())) if e not in (None, []) else None for e in entries]
    except ValueError as e:
        raise RequestError(f"image_data: {e}", "image_data") from None


def parse_request(fields: dict, vocab_size: int | None = None,
                  rid_of: Callable[[int, int, int], str] | None = None,
                  image_limits: ImageLimits | None = None) -> ParsedRequest:
    """Engine inputs of one request: prompt i's sample j (of its sampling's n) is one item with n=1, named
    rid_of(i, j, n) (default: its rid, or a fresh one, + `-j` when n > 1). RequestError names a bad field.
    image_limits: what images are checked against (default: ImageLimits(), no server paths)."""
    fields = dict(fields)
    image_data = fields.pop("image_data", None)
    unknown = sorted(set(fields) - set(ITEM_FIELDS) - set(REQUEST_FIELDS))
    if unknown:
        raise RequestError(f"unknown argument(s) {unknown}", unknown[0])
    f = {**REQUEST_FIELDS, **ITEM_FIELDS, **fields}
    prompts, batch = parse_prompts(f["text"], f["input_ids"], vocab_size)
    k = len(prompts)
    if not batch:  # a one-entry list is the one prompt's value
        f.update({name: f[name][0] for name in ITEM_FIELDS if isinstance(f[name], list) and len(f[name]) == 1})
        listed = [name for name in ITEM_FIELDS if isinstance(f[name], list)]
        if listed:
            raise RequestError("per-item lists need a batch of prompts", listed[0])
    per = {name: _per_item(f[name], k, name, default) for name, default in ITEM_FIELDS.items()}
    images = prompt_images(image_data, k, batch, image_limits)
    listed_sp = isinstance(f["sampling_params"], list)
    rid_of = rid_of or _default_rid(per["rid"])
    items, prompt_of = [], []
    for i, prompt in enumerate(prompts):
        sp = sampling_params(per["sampling_params"][i], vocab_size,
                             f"sampling_params[{i}]" if listed_sp else "sampling_params")
        lp = logprob_options(per["return_logprob"][i], per["logprob_start_len"][i], per["top_logprobs_num"][i],
                             f["return_text_in_logprobs"], vocab_size)
        key = cache_namespace(per["extra_key"][i], per["cache_salt"][i])
        copied = {name: per[name][i] if name in per else f[name] for name in _COPIED}
        n = sp.n
        for j in range(n):
            one = dataclasses.replace(sp, n=1, seed=sample_seed(sp.seed, j)) if n > 1 else sp
            try:
                items.append(GenerateReqInput(rid=rid_of(i, j, n), sampling=one, logprob=lp, extra_key=key,
                                              image_data=images[i], **prompt, **copied))
            except ValueError as e:
                word = str(e).split()[0]
                raise RequestError(str(e), word if word in copied or word == "extra_key" else next(iter(prompt))) \
                    from None
            prompt_of.append(i)
    if len({inp.rid for inp in items}) != len(items):
        raise RequestError("request ids in one batch must be distinct", "rid")
    return ParsedRequest(items, prompt_of, batch or len(items) > k)

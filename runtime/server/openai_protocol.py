"""OpenAI request fields -> engine arguments, and engine results -> OpenAI response pieces.

Unknown-field policy: a field is accepted when it is an OpenAI or SGLang field we implement, or one of
IGNORED (OpenAI bookkeeping fields that cannot change the output: user, metadata, store, ...).
Anything else is a 400 naming the field, so a typo never silently changes sampling.
"""

from __future__ import annotations

import json

from ..sampling_params import SamplingParams
from .http_common import (ApiError, check_fields, is_bool, is_dict, is_int, is_int_list, is_num, is_str,
                          is_str_list, nullable, one_of)

IGNORED = ("user", "metadata", "store", "service_tier", "parallel_tool_calls", "prompt_cache_key",
           "safety_identifier")

_STOP = (nullable(one_of(is_str, is_str_list)), "a string or a list of strings")
COMMON_FIELDS = {
    "model": (nullable(is_str), "a string"),
    "max_tokens": (nullable(is_int), "an int"),
    "temperature": (nullable(is_num), "a number"),
    "top_p": (nullable(is_num), "a number"),
    "n": (nullable(is_int), "an int"),
    "stop": _STOP,
    "stream": (nullable(is_bool), "a bool"),
    "stream_options": (nullable(is_dict), "an object"),
    "seed": (nullable(is_int), "an int"),
    "presence_penalty": (nullable(is_num), "a number"),
    "frequency_penalty": (nullable(is_num), "a number"),
    "logit_bias": (nullable(is_dict), "an object {token_id: bias}"),
    "response_format": (nullable(is_dict), "an object"),
    # SGLang extras
    "top_k": (nullable(is_int), "an int"),
    "min_p": (nullable(is_num), "a number"),
    "min_tokens": (nullable(is_int), "an int"),
    "repetition_penalty": (nullable(is_num), "a number"),
    "stop_token_ids": (nullable(is_int_list), "a list of ints"),
    "stop_regex": _STOP,
    "ignore_eos": (nullable(is_bool), "a bool"),
    "skip_special_tokens": (nullable(is_bool), "a bool"),
    "spaces_between_special_tokens": (nullable(is_bool), "a bool"),
    "no_stop_trim": (nullable(is_bool), "a bool"),
    "regex": (nullable(is_str), "a string"),
    "ebnf": (nullable(is_str), "a string"),
    "json_schema": (nullable(one_of(is_str, is_dict)), "a string or an object"),
    "rid": (nullable(is_str), "a string"),
    "extra_key": (nullable(is_str), "a string"),  # prefix-cache namespace (SGLang's cache salt)
}
COMPLETION_FIELDS = {
    **COMMON_FIELDS,
    "prompt": (one_of(is_str, is_str_list, is_int_list, lambda v: isinstance(v, list) and all(
        is_int_list(x) for x in v)), "a string, a list of strings, a list of ints or a list of lists of ints"),
    "logprobs": (nullable(is_int), "an int (number of top alternatives, 0-20)"),
    "echo": (nullable(is_bool), "a bool"),
    "best_of": (nullable(is_int), "an int"),
    "suffix": (nullable(is_str), "a string"),
}
CHAT_FIELDS = {
    **COMMON_FIELDS,
    "messages": (lambda v: isinstance(v, list) and len(v) > 0 and all(is_dict(m) for m in v),
                 "a non-empty list of message objects"),
    "max_completion_tokens": (nullable(is_int), "an int"),
    "logprobs": (nullable(is_bool), "a bool"),
    "top_logprobs": (nullable(is_int), "an int (0-20)"),
    "tools": (nullable(lambda v: isinstance(v, list)), "a list"),
    "tool_choice": (nullable(one_of(is_str, is_dict)), "a string or an object"),
    "chat_template_kwargs": (nullable(is_dict), "an object"),
    "continue_final_message": (nullable(is_bool), "a bool"),
}
MESSAGE_FIELDS = {
    "role": (lambda v: v in ("system", "developer", "user", "assistant", "tool"),
             "one of system, developer, user, assistant, tool"),
    "content": (nullable(one_of(is_str, lambda v: isinstance(v, list) and all(is_dict(p) for p in v))),
                "a string or a list of content parts"),
    "name": (nullable(is_str), "a string"),
    "tool_call_id": (nullable(is_str), "a string"),
    "tool_calls": (nullable(lambda v: v == []), "absent (tool calls are not supported)"),
    "refusal": (nullable(is_str), "a string"),
}
# OpenAI/SGLang request field -> SamplingParams field, derived from the one field list: every request field
# named like a field maps to it, min_tokens is renamed; max_tokens (its default differs per route), n (one
# engine request per sample) and logit_bias (string keys) are handled in sampling_params() below.
_DIRECT = {**{name: name for name in SamplingParams.field_names() if name in COMMON_FIELDS
              and name not in ("n", "logit_bias")}, "min_tokens": "min_new_tokens"}
MAX_TOP_LOGPROBS = 20
_TEMPLATE_RESERVED = {"chat_template", "conversation", "tools", "documents", "tokenize", "add_generation_prompt",
                      "continue_final_message", "padding", "truncation", "max_length", "return_tensors",
                      "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "messages"}


def check_request(body: dict, chat: bool) -> None:
    """400 for unknown fields, wrong types and unsupported features."""
    check_fields(body, CHAT_FIELDS if chat else COMPLETION_FIELDS, "request", ignored=IGNORED)
    n = body.get("n") or 1
    if n < 1 or n > 64:
        raise ApiError(400, f"n must be in [1, 64], got {n}", param="n")
    if not chat:
        if body.get("suffix"):
            raise ApiError(400, "suffix is not supported", param="suffix")
        if body.get("best_of") not in (None, n):
            raise ApiError(400, "best_of other than n is not supported", param="best_of")
        if body.get("echo") and body.get("logprobs") is not None:
            raise ApiError(400, "echo together with logprobs is not supported", param="echo")
    if chat and body.get("tools"):
        raise ApiError(400, "tools / function calling is not supported by this server", param="tools")
    if chat and body.get("tool_choice") not in (None, "none", "auto"):
        raise ApiError(400, "tool_choice needs tools, which are not supported", param="tool_choice")
    for key, value in (body.get("chat_template_kwargs") or {}).items():
        # template variables only (e.g. enable_thinking): never a template, tokenizer option or tool list
        if key in _TEMPLATE_RESERVED or not key.isidentifier() or not isinstance(value, (str, int, float, bool)):
            raise ApiError(400, f"chat_template_kwargs.{key} is not allowed (scalar template variables only)",
                           param="chat_template_kwargs")
    lp = body.get("logprobs") if not chat else body.get("top_logprobs")
    if lp is not None and not 0 <= lp <= MAX_TOP_LOGPROBS:
        raise ApiError(400, f"{'logprobs' if not chat else 'top_logprobs'} must be in [0, {MAX_TOP_LOGPROBS}]",
                       param="logprobs" if not chat else "top_logprobs")


def _response_format_schema(rf: dict) -> str | None:
    """response_format -> json_schema string (None for plain text)."""
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema", rf)
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema must be a JSON schema object",
                           param="response_format")
        return json.dumps(schema)
    raise ApiError(400, f"response_format.type must be text, json_object or json_schema, got {kind!r}",
                   param="response_format")


def sampling_params(body: dict, chat: bool) -> dict:
    """SGLang sampling_params for the engine (validated by the engine's SamplingParams later)."""
    sp = {dst: body[src] for src, dst in _DIRECT.items() if body.get(src) is not None}
    if chat and body.get("max_completion_tokens") is not None:
        sp["max_new_tokens"] = body["max_completion_tokens"]
    elif body.get("max_tokens") is not None:
        sp["max_new_tokens"] = body["max_tokens"]
    else:
        sp["max_new_tokens"] = None if chat else 16  # chat: the room left in the context (OpenAI/SGLang)
    if body.get("logit_bias"):
        try:
            sp["logit_bias"] = {int(k): float(v) for k, v in body["logit_bias"].items()}
        except (TypeError, ValueError):
            raise ApiError(400, "logit_bias must map token ids to numbers", param="logit_bias") from None
    if body.get("response_format"):
        schema = _response_format_schema(body["response_format"])
        if schema is not None:
            if "json_schema" in sp:
                raise ApiError(400, "give either response_format or json_schema, not both", param="response_format")
            sp["json_schema"] = schema
    return sp


def chat_messages(messages: list[dict]) -> list[dict]:
    """Validate messages and flatten text content parts into strings for the chat template."""
    out = []
    for i, m in enumerate(messages):
        check_fields(m, MESSAGE_FIELDS, f"messages[{i}]")
        if "role" not in m:
            raise ApiError(400, f"messages[{i}] has no role", param="messages")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not is_str(part.get("text")):
                    raise ApiError(400, f"messages[{i}]: only text content parts are supported", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        msg = {"role": m["role"], "content": content or ""}
        if m.get("name"):
            msg["name"] = m["name"]
        out.append(msg)
    return out


def finish_reason(meta: dict) -> tuple[str | None, object]:
    """OpenAI finish_reason and SGLang's matched_stop from the engine's meta_info."""
    fr = meta.get("finish_reason")
    if not isinstance(fr, dict):
        return None, None
    kind = fr.get("type")
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(kind, kind), fr.get("matched")


def _entry_text(e) -> str:
    return e[2] if len(e) > 2 and e[2] is not None else ""


def chat_logprobs(meta: dict, start: int = 0) -> dict:
    """{"content": [...]} from output logprob triples [start:] (OpenAI chat shape)."""
    toks = meta.get("output_token_logprobs") or []
    tops = meta.get("output_top_logprobs") or []
    content = []
    for k in range(start, len(toks)):
        text = _entry_text(toks[k])
        alts = tops[k] if k < len(tops) and tops[k] else []
        content.append({"token": text, "logprob": toks[k][0], "bytes": list(text.encode()),
                        "top_logprobs": [{"token": _entry_text(a), "logprob": a[0],
                                          "bytes": list(_entry_text(a).encode())} for a in alts]})
    return {"content": content}


def completion_logprobs(meta: dict, start: int = 0, offset: int = 0, want_top: bool = False) -> dict:
    """Legacy completions logprobs {tokens, token_logprobs, top_logprobs, text_offset} for entries [start:]."""
    toks = (meta.get("output_token_logprobs") or [])[start:]
    tops = (meta.get("output_top_logprobs") or [])[start:]
    texts = [_entry_text(e) for e in toks]
    offsets, pos = [], offset
    for t in texts:
        offsets.append(pos)
        pos += len(t)
    top = [{_entry_text(a): a[0] for a in (alts or [])} for alts in tops] if want_top else None
    return {"tokens": texts, "token_logprobs": [e[0] for e in toks], "top_logprobs": top, "text_offset": offsets}

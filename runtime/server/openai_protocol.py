"""OpenAI request fields -> engine arguments, and engine results -> OpenAI response pieces.

The accepted fields, their types and which ones are implemented are the tables COMPLETIONS, CHAT,
CHAT_MESSAGE and STREAM_OPTIONS of wire_tables.py (SGLang's OpenAI request models plus OpenAI's
bookkeeping fields); anything else is a 400 naming the field, so a typo never silently changes sampling.
"""

from __future__ import annotations

import json

from ..sampling_params import SamplingParams
from ..tools.spec import ToolError, parse_assistant_calls, parse_tool_choice, parse_tools
from .http_common import ApiError
from .wire_tables import CHAT, CHAT_MESSAGE, COMPLETIONS, STREAM_OPTIONS

# OpenAI/SGLang request field -> SamplingParams field, derived from the one field list: every request field
# named like a field maps to it, min_tokens is renamed; max_tokens (its default differs per route), n (one
# engine request per sample) and logit_bias are handled in sampling_fields() below.
_REQUEST_NAMES = {f.name for f in COMPLETIONS.fields} | {f.name for f in CHAT.fields}
_DIRECT = {**{name: name for name in SamplingParams.field_names() if name in _REQUEST_NAMES
              and name not in ("n", "logit_bias")}, "min_tokens": "min_new_tokens"}
MAX_N = 64
_TEMPLATE_RESERVED = {"chat_template", "conversation", "tools", "documents", "tokenize", "add_generation_prompt",
                      "continue_final_message", "padding", "truncation", "max_length", "return_tensors",
                      "return_dict", "return_assistant_tokens_mask", "tokenizer_kwargs", "messages"}


def check_request(body: dict, chat: bool) -> tuple[dict, dict]:
    """400 for unknown fields, wrong types and unsupported values; returns (implemented fields, stream_options)."""
    f = (CHAT if chat else COMPLETIONS).validate(body)
    options = STREAM_OPTIONS.validate(f.get("stream_options") or {}, "stream_options")
    n = f.get("n", 1)
    if n > MAX_N:
        raise ApiError(400, f"n must be in [1, {MAX_N}], got {n}", param="n")
    if not chat:
        if f.get("best_of") not in (None, n):
            raise ApiError(400, "best_of other than n is not supported", param="best_of")
        if f.get("echo") and f.get("logprobs") is not None and f.get("stream"):
            raise ApiError(400, "echo together with logprobs is not supported when streaming", param="echo")
    if chat:
        try:  # tool definitions and the choice are checked here; the rendering needs the model's template
            parse_tool_choice(f.get("tool_choice"), parse_tools(f["tools"]) if f.get("tools") else None)
        except ToolError as e:
            raise ApiError(400, str(e), param=e.param) from None
    for key, value in (f.get("chat_template_kwargs") or {}).items():
        # template variables only (e.g. enable_thinking): never a template, tokenizer option or tool list
        if key in _TEMPLATE_RESERVED or not key.isidentifier() or not isinstance(value, (str, int, float, bool)):
            raise ApiError(400, f"chat_template_kwargs.{key} is not allowed (scalar template variables only)",
                           param="chat_template_kwargs")
    return f, options


def _response_format_constraint(rf: dict) -> tuple[str, str] | None:
    """response_format -> (json_schema | structural_tag, JSON text), None for plain text."""
    kind = rf.get("type")
    if kind in (None, "text"):
        return None
    if kind == "json_object":
        return "json_schema", json.dumps({"type": "object"})
    if kind == "json_schema":
        spec = rf.get("json_schema", rf)
        schema = spec.get("schema", spec.get("schema_")) if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise ApiError(400, "response_format.json_schema.schema must be a JSON schema object",
                           param="response_format")
        return "json_schema", json.dumps(schema)
    if kind == "structural_tag":
        from sglpy.grammar.structural_tag import StructuralTag

        try:  # SGLang's shape: {"type": "structural_tag", "structures": [...], "triggers": [...]}
            return "structural_tag", StructuralTag.parse(rf).to_json()
        except ValueError as e:
            raise ApiError(400, f"response_format: {e}", param="response_format") from None
    raise ApiError(400, f"response_format.type must be text, json_object, json_schema or structural_tag, got {kind!r}",
                   param="response_format")


def sampling_fields(f: dict, chat: bool) -> dict:
    """SGLang sampling_params (wire names) from a request's validated fields; built by request.sampling_params."""
    sp = {dst: f[src] for src, dst in _DIRECT.items() if f.get(src) is not None}
    if chat:
        # SGLang: max_completion_tokens or max_tokens; 0 or none = the room left in the context
        sp["max_new_tokens"] = f.get("max_completion_tokens") or f.get("max_tokens") or None
    else:
        sp["max_new_tokens"] = f.get("max_tokens", 16)
    if f.get("logit_bias"):
        sp["logit_bias"] = f["logit_bias"]
    if f.get("response_format"):
        got = _response_format_constraint(f["response_format"])
        if got is not None:
            if "json_schema" in sp:
                raise ApiError(400, "give either response_format or json_schema, not both", param="response_format")
            sp[got[0]] = got[1]
    return sp


def split_images(messages: list, placeholder: str | None) -> tuple[list, list[str]]:
    """Messages with each `image_url` content part replaced by a text part holding the model's image placeholder,
    and the parts' URLs in order (checked by the request parser: data URLs; http URLs are refused by name)."""
    urls, out = [], []
    for i, m in enumerate(messages):
        parts = m.get("content") if isinstance(m, dict) else None
        if not isinstance(parts, list) or not any(isinstance(p, dict) and p.get("type") == "image_url"
                                                  for p in parts):
            out.append(m)
            continue
        new = []
        for part in parts:
            if isinstance(part, dict) and part.get("type") == "image_url":
                url = part.get("image_url")
                url = url.get("url") if isinstance(url, dict) else url
                if not isinstance(url, str):
                    raise ApiError(400, f"messages[{i}]: an image_url part needs image_url.url (a data URL)",
                                   param="messages")
                urls.append(url)
                new.append({"type": "text", "text": placeholder or ""})
            else:
                new.append(part)
        out.append({**m, "content": new})
    return out, urls


def chat_messages(messages: list[dict]) -> list[dict]:
    """Validate messages (CHAT_MESSAGE) and flatten text content parts into strings for the chat template."""
    out = []
    for i, m in enumerate(messages):
        f = CHAT_MESSAGE.validate(m, f"messages[{i}]")
        content = f.get("content")
        calls = None
        if f.get("tool_calls"):
            if f["role"].lower() != "assistant":
                raise ApiError(400, f"messages[{i}].tool_calls: only assistant messages carry tool calls",
                               param=f"messages[{i}].tool_calls")
            try:
                calls = parse_assistant_calls(f["tool_calls"], f"messages[{i}].tool_calls")
            except ToolError as e:
                raise ApiError(400, str(e), param=e.param) from None
        if content is None and not calls:
            raise ApiError(400, f"messages[{i}].content is required", param="messages")
        if isinstance(content, list):
            texts = []
            for part in content:
                if part.get("type") != "text" or not isinstance(part.get("text"), str) or set(part) - {"type", "text"}:
                    raise ApiError(400, f"messages[{i}]: only text content parts {{\"type\": \"text\", \"text\": ...}} "
                                        "are supported (image_url parts need a vision model)", param="messages")
                texts.append(part["text"])
            content = "".join(texts)
        msg = {"role": f["role"].lower(), "content": content}
        for name in ("name", "tool_call_id", "reasoning_content"):
            if f.get(name):
                msg[name] = f[name]
        if calls:
            msg["tool_calls"] = calls
        out.append(msg)
    return out


def finish_reason(meta: dict) -> tuple[str | None, object]:
    """OpenAI finish_reason and SGLang's matched_stop from the engine's meta_info."""
    fr = meta.get("finish_reason")
    if not isinstance(fr, dict):
        return None, None
    kind = fr.get("type")
    return {"stop": "stop", "length": "length", "abort": "abort"}.get(kind, kind), fr.get("matched")


def tool_call_deltas(events: list) -> tuple[str, list[dict]]:
    """Streaming parser events -> (content text, OpenAI `delta.tool_calls` entries)."""
    from ..tools.stream import CallArgs, CallBegin, Content

    text, calls = "", []
    for e in events:
        if isinstance(e, Content):
            text += e.text
        elif isinstance(e, CallBegin):
            calls.append({"index": e.index, "id": e.id, "type": "function",
                          "function": {"name": e.name, "arguments": ""}})
        elif isinstance(e, CallArgs):
            if calls and calls[-1]["index"] == e.index:
                calls[-1]["function"]["arguments"] += e.text
            else:
                calls.append({"index": e.index, "function": {"arguments": e.text}})
    return text, calls


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

"""POST /v1/messages: Anthropic's Messages API on the served model (as llama.cpp's server offers it).

What it takes (MESSAGES below; anything else is a 400 naming the field): `system` (a string or text blocks),
`messages` of user/assistant turns whose content is a string or text blocks (a last assistant message is a
prefill the answer continues), `max_tokens`, `stop_sequences`, `temperature`, `top_p`, `top_k`, `stream`, and
`tools` with a `tool_choice` that names one tool (`{"type": "tool", "name"}`, or `{"type": "any"}` with a
single tool): the answer is then constrained to that tool's `input_schema` and returned as a `tool_use` block,
which is how Anthropic's structured outputs reach JSON. `tool_choice` auto with tools (free choice between
text and calls) is refused, as are tool_use / tool_result / image blocks in the conversation.
On a reasoning model (`--reasoning-parser`) the thinking comes back as a `thinking` block before the answer's
block; `thinking: {"type": "enabled", "budget_tokens": N}` bounds it (then `</think>` is forced) and
`{"type": "disabled"}` sets the template's enable_thinking to false.
Streaming sends Anthropic's events: message_start, content_block_start, content_block_delta (thinking_delta,
text_delta or input_json_delta), content_block_stop, message_delta (stop_reason, usage), message_stop.
"""

from __future__ import annotations

import contextlib
import json

from aiohttp import web

from ..messages import ChatPromptReq, EngineError
from ..reasoning import ReasoningStream, reasoning_format, split_reasoning, thinking_open
from ..request import new_rid, parse_request
from ..sampling_params import MAX_STOPS
from .http_common import ApiError, first_item, read_json_object, request_errors, request_id_header, start_sse
from .state import ServerState
from .wire_schema import BOOL, DICT, INT, NUM, REQUIRED, STR, Schema, Support, WireField, int_range, list_of, one_of

IMPL, NOOP, DEFAULT_ONLY = Support.IMPL, Support.NOOP, Support.DEFAULT_ONLY


def _f(name, check, default, support, doc) -> WireField:
    return WireField(name, check, default, support, doc, origin="anthropic")


MESSAGES = Schema("request", (
    _f("model", STR, REQUIRED, NOOP, "any name: the server has one model"),
    _f("messages", list_of(DICT, non_empty=True), REQUIRED, IMPL, "user/assistant turns; content a string or text "
       "blocks; a last assistant message is continued (prefill)"),
    _f("max_tokens", int_range(1), REQUIRED, IMPL, "tokens to generate"),
    _f("system", one_of(STR, list_of(DICT)), None, IMPL, "system prompt: a string or text blocks"),
    _f("stop_sequences", list_of(STR, MAX_STOPS), None, IMPL, "stop strings (not included in the text)"),
    _f("temperature", NUM, 1.0, IMPL, ">= 0; 0 is greedy"),
    _f("top_p", NUM, None, IMPL, "in (0, 1]"),
    _f("top_k", INT, None, IMPL, ">= 1"),
    _f("stream", BOOL, False, IMPL, "Anthropic's server-sent events"),
    _f("tools", list_of(DICT), None, IMPL, "{name, description, input_schema}; used with a tool_choice naming one"),
    _f("tool_choice", DICT, None, IMPL, "{type: tool, name} or {type: any} with one tool (constrained to its "
       "input_schema); {type: none} ignores the tools"),
    _f("metadata", DICT, None, NOOP, "bookkeeping; cannot change the output"),
    _f("service_tier", STR, None, NOOP, "bookkeeping; cannot change the output"),
    _f("thinking", DICT, None, IMPL, "with --reasoning-parser: {type: enabled, budget_tokens} bounds the thinking, "
       "{type: disabled} turns it off in the template; the thinking is a `thinking` block"),
), "POST /v1/messages")


def _text_of(content, where: str) -> str:
    """A message's text: a string, or text blocks joined (cache_control marks are accepted and ignored)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ApiError(400, f"{where}.content must be a string or a list of text blocks", param=where)
    out = []
    for i, block in enumerate(content):
        if not (isinstance(block, dict) and block.get("type") == "text" and isinstance(block.get("text"), str)
                and set(block) <= {"type", "text", "cache_control", "citations"}):
            kind = block.get("type") if isinstance(block, dict) else type(block).__name__
            raise ApiError(400, f"{where}.content[{i}]: only text blocks are supported, got {kind!r}", param=where)
        out.append(block["text"])
    return "".join(out)


def _conversation(f: dict) -> tuple[list[dict], bool]:
    """Template messages (system first) and whether the last assistant message is a prefill to continue."""
    msgs = []
    if f.get("system") is not None:
        msgs.append({"role": "system", "content": _text_of(f["system"], "system")})
    for i, m in enumerate(f["messages"]):
        role = m.get("role")
        if role not in ("user", "assistant") or set(m) - {"role", "content"} or "content" not in m:
            raise ApiError(400, f"messages[{i}] must be {{role: user|assistant, content}}", param="messages")
        msgs.append({"role": role, "content": _text_of(m["content"], f"messages[{i}]")})
    prefill = msgs[-1]["role"] == "assistant"
    return msgs, prefill


def _tool(f: dict) -> dict | None:
    """The one tool the answer must call, or None (no tools, or tool_choice none)."""
    tools, choice = f.get("tools") or [], f.get("tool_choice") or {"type": "auto"}
    kind = choice.get("type")
    if not tools or kind == "none":
        return None
    for i, t in enumerate(tools):
        if not (isinstance(t.get("name"), str) and isinstance(t.get("input_schema"), dict)):
            raise ApiError(400, f"tools[{i}] needs a name and an input_schema object", param="tools")
    if kind == "tool":
        named = [t for t in tools if t["name"] == choice.get("name")]
        if not named:
            raise ApiError(400, f"tool_choice names {choice.get('name')!r}, which is not in tools", param="tool_choice")
        return named[0]
    if kind == "any" and len(tools) == 1:
        return tools[0]
    raise ApiError(400, f"tool_choice {kind!r} with {len(tools)} tool(s) is not supported: name one tool "
                        "({\"type\": \"tool\", \"name\": ...})", param="tool_choice")


def _thinking(f: dict, state: ServerState) -> tuple[int | None, dict | None]:
    """(the thinking budget, template variables) from the request's `thinking`."""
    th = f.get("thinking")
    if th is None:
        return None, None
    kind, budget = th.get("type"), th.get("budget_tokens")
    if kind == "disabled" and set(th) == {"type"}:
        return None, {"enable_thinking": False}
    if kind != "enabled" or set(th) != {"type", "budget_tokens"} or type(budget) is not int or budget < 0:
        raise ApiError(400, "thinking must be {\"type\": \"enabled\", \"budget_tokens\": an int >= 0} or "
                            "{\"type\": \"disabled\"}", param="thinking")
    if state.config.engine.reasoning_parser is None:
        raise ApiError(400, "thinking needs a reasoning model served with --reasoning-parser", param="thinking")
    return budget, None


def _answer_block(text: str, tool: dict | None, msg_id: str, reason: str) -> tuple[dict, str]:
    """The answer's content block (a tool_use when the tool's JSON parsed) and the stop reason."""
    if tool is not None:
        try:
            block = {"type": "tool_use", "id": "toolu_" + msg_id[4:], "name": tool["name"], "input": json.loads(text)}
            return block, ("tool_use" if reason == "end_turn" else reason)
        except ValueError:  # cut by max_tokens before the JSON closed
            pass
    return {"type": "text", "text": text}, reason


def _stop_reason(meta: dict, stops: list[str]) -> tuple[str, str | None]:
    fr = meta.get("finish_reason") or {}
    kind, matched = fr.get("type"), fr.get("matched")
    if kind == "length":
        return "max_tokens", None
    if kind == "stop" and isinstance(matched, str) and matched in stops:
        return "stop_sequence", matched
    return "end_turn", None


def _usage(meta: dict) -> dict:
    return {"input_tokens": int(meta.get("prompt_tokens") or 0), "output_tokens": int(meta.get("completion_tokens") or 0)}


async def _event(resp: web.StreamResponse, obj: dict) -> None:
    await resp.write(f"event: {obj['type']}\ndata: {json.dumps(obj, ensure_ascii=False)}\n\n".encode())


async def messages(request: web.Request) -> web.StreamResponse:
    """POST /v1/messages."""
    state: ServerState = request.app["state"]
    f = MESSAGES.validate(await read_json_object(request))
    msgs, prefill = _conversation(f)
    tool = _tool(f)
    fields = {"max_new_tokens": f["max_tokens"], "temperature": f.get("temperature", 1.0)}
    for src, dst in (("stop_sequences", "stop"), ("top_p", "top_p"), ("top_k", "top_k")):
        if f.get(src) is not None:
            fields[dst] = f[src]
    if tool is not None:
        fields["json_schema"] = json.dumps(tool["input_schema"])
    budget, kwargs = _thinking(f, state)
    prompt = await state.engine.call(ChatPromptReq(msgs, True, prefill, kwargs))
    msg_id = "msg_" + new_rid()
    with request_errors():
        (item,) = parse_request({"text": prompt, "rid": msg_id, "sampling_params": fields, "stream": True,
                                 "max_thinking_tokens": budget}, state.info.vocab_size).items
    parser = state.config.engine.reasoning_parser
    fmt = reasoning_format(parser) if parser is not None else None
    prompt_open = thinking_open(fmt, prompt) if fmt is not None else None
    state.admit([item])
    stops = list(f.get("stop_sequences") or [])
    head = {"id": msg_id, "type": "message", "role": "assistant", "model": state.model_name}
    if not f.get("stream"):
        (out,) = await state.run_many([item], request.path)
        meta = out.get("meta_info", {})
        reason, seq = _stop_reason(meta, stops)
        text, blocks = out.get("text", ""), []
        if fmt is not None:  # the thinking first, as Anthropic's extended thinking returns it
            split = split_reasoning(fmt, text, prompt_open)
            text = split.content
            if split.reasoning is not None:
                blocks.append({"type": "thinking", "thinking": split.reasoning, "signature": ""})
        block, reason = _answer_block(text, tool, msg_id, reason)
        return web.json_response({**head, "content": blocks + [block], "stop_reason": reason, "stop_sequence": seq,
                                  "usage": _usage(meta)}, headers=request_id_header(msg_id))
    stream = ReasoningStream(fmt, prompt_open) if fmt is not None else None
    return await _stream(request, state, item, head, tool, stops, stream)


async def _stream(request, state: ServerState, item, head: dict, tool: dict | None, stops: list[str],
                  thinking: ReasoningStream | None):
    async with contextlib.aclosing(state.merge_streams([item], request.path)) as gen:
        _, chunk = await first_item(gen)
        resp = await start_sse(request, head["id"])
        meta = chunk.get("meta_info", {})
        await _event(resp, {"type": "message_start", "message": {
            **head, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": int(meta.get("prompt_tokens") or 0), "output_tokens": 0}}})
        blocks = _BlockStream(resp, head["id"], tool)
        if thinking is None:
            await blocks.answer("")  # the one block opens at once, as before
        sent = 0
        try:
            while True:
                meta = chunk.get("meta_info", {})
                text = chunk.get("text", "")
                delta, sent = text[sent:], max(sent, len(text))
                last = False
                try:
                    _, chunk = await anext(gen)
                except StopAsyncIteration:
                    last = True
                r, c = thinking.feed(delta, final=last) if thinking is not None else ("", delta)
                if r:
                    await blocks.think(r)
                if c:
                    await blocks.answer(c)
                if last:
                    break
        except EngineError as e:
            await _event(resp, {"type": "error", "error": {"type": "api_error", "message": e.message}})
            return resp
        await blocks.answer("")  # an answer block even when the output was all thinking
        reason, seq = _stop_reason(meta, stops)
        if tool is not None and reason == "end_turn":
            reason = "tool_use"
        await _event(resp, {"type": "content_block_stop", "index": blocks.index})
        await _event(resp, {"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": seq},
                            "usage": {"output_tokens": int(meta.get("completion_tokens") or 0)}})
        await _event(resp, {"type": "message_stop"})
    return resp


class _BlockStream:
    """Content blocks of a streamed message: an optional thinking block, then the answer's text or tool_use block."""

    def __init__(self, resp, msg_id: str, tool: dict | None):
        self.resp, self.msg_id, self.tool = resp, msg_id, tool
        self.index, self.open = -1, None  # the open block's index and kind (thinking / answer)

    async def _start(self, kind: str, block: dict) -> None:
        if self.open is not None:
            await _event(self.resp, {"type": "content_block_stop", "index": self.index})
        self.index, self.open = self.index + 1, kind
        await _event(self.resp, {"type": "content_block_start", "index": self.index, "content_block": block})

    async def think(self, text: str) -> None:
        if self.open is None:
            await self._start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        await _event(self.resp, {"type": "content_block_delta", "index": self.index,
                                 "delta": {"type": "thinking_delta", "thinking": text}})

    async def answer(self, text: str) -> None:
        if self.open != "answer":
            await self._start("answer", {"type": "tool_use", "id": "toolu_" + self.msg_id[4:], "name": self.tool["name"],
                                         "input": {}} if self.tool is not None else {"type": "text", "text": ""})
        if text:
            d = ({"type": "input_json_delta", "partial_json": text} if self.tool is not None
                 else {"type": "text_delta", "text": text})
            await _event(self.resp, {"type": "content_block_delta", "index": self.index, "delta": d})

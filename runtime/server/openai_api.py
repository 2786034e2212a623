"""OpenAI-compatible routes: /v1/completions, /v1/chat/completions (JSON and SSE), /v1/models."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import time
from dataclasses import dataclass

from aiohttp import web

from ..reasoning import ReasoningFormat, ReasoningStream, reasoning_format, split_reasoning, thinking_open
from ..messages import ChatPromptReq, DetokenizeReq, EngineError, GenerateReqInput
from ..request import new_rid, parse_request, sampling_params
from ..tools import (Tool, ToolCallStream, ToolChoice, ToolError, ToolFormat, parse_tool_calls, parse_tool_choice,
                     parse_tools, render_conversation, tool_constraint)
from ..tools.constraint import structure_tool
from .http_common import (ApiError, error_body, first_item, read_json_object, request_errors, request_id_header,
                          send_sse, start_sse)
from .lora_routes import adapter_cards, lora_of_model
from .native_api import server_image_limits
from .openai_protocol import (chat_logprobs, chat_messages, check_request, completion_logprobs, finish_reason,
                              sampling_fields, split_images, tool_call_deltas)
from .state import ServerState


@dataclass
class _Job:
    """One OpenAI request turned into engine generations (n per prompt)."""

    id: str
    chat: bool
    items: list[GenerateReqInput]
    prompt_of: list[int]  # item index -> prompt index
    want_logprobs: bool
    top_logprobs: int
    echo_texts: list[str] | None = None
    tools: _ToolJob | None = None  # set when tool calls are parsed out of the output
    reasoning: _ReasoningJob | None = None  # set when the thinking goes to reasoning_content


@dataclass(frozen=True)
class _ReasoningJob:
    """A chat request's thinking split (--reasoning-parser, separate_reasoning): the format, and whether the
    prompt left thinking open (None: the output decides)."""

    format: ReasoningFormat
    prompt_open: bool | None


def _reasoning_of(state: ServerState, f: dict, prompt_text: str | None) -> _ReasoningJob | None:
    name = state.config.engine.reasoning_parser
    if name is None or f.get("separate_reasoning") is False:
        return None
    fmt = reasoning_format(name)
    return _ReasoningJob(fmt, thinking_open(fmt, prompt_text))


@dataclass(frozen=True)
class _ToolJob:
    """A chat request's tools: the format its calls are parsed in, and the tools (for error messages)."""

    format: ToolFormat
    tools: list[Tool]
    choice: ToolChoice


def _tools_of(f: dict, state: ServerState, messages: list[dict], sp):
    """(template messages, extra template variables, sampling params, _ToolJob | None) for a chat request."""
    try:
        tools = parse_tools(f["tools"]) if f.get("tools") else None
        choice = parse_tool_choice(f.get("tool_choice"), tools)
        setup = state.tool_setup
        shown = tools if choice.mode != "none" else None  # as SGLang: tool_choice none renders no tools
        messages, extra = render_conversation(messages, setup, shown)
    except ToolError as e:
        raise ApiError(400, str(e), param=e.param) from None
    constraint = tool_constraint(setup.format, tools or [], choice, f.get("parallel_tool_calls", True))
    if constraint is None:
        return messages, extra, sp, None
    if sp.constraint is not None:
        raise ApiError(400, f"tool_choice {choice.mode!r} constrains the output to tool calls; it cannot be combined "
                            f"with {sp.constraint[0]} (use tool_choice none)", param="tool_choice")
    return messages, extra, dataclasses.replace(sp, structural_tag=constraint), _ToolJob(setup.format, tools, choice)


def _tool_compile_error(job: _Job, e: EngineError) -> Exception:
    """A compile error of the tool constraint, re-worded to name the tool whose parameters failed."""
    m = re.search(r"structural_tag\.structures\[(\d+)\]\.schema: (.*)", e.message, re.S)
    if job.tools is None or e.status != 400 or m is None:
        return e
    i = structure_tool(job.tools.tools, job.tools.choice, int(m.group(1)))
    return ApiError(400, f"tools[{i}].function.parameters cannot be compiled: {m.group(2)}",
                    param=f"tools[{i}].function.parameters")


async def _build_job(state: ServerState, body: dict, chat: bool) -> tuple[_Job, dict]:
    f, options = check_request(body, chat)
    vocab = state.info.vocab_size
    with request_errors():
        sp = sampling_params(sampling_fields(f, chat), vocab, "request")
    sp = dataclasses.replace(sp, n=f.get("n", 1))
    tool_job = reasoning = None
    fields = {"return_text_in_logprobs": True, "stream": True}
    if chat:
        raw, urls = f["messages"], []
        if state.info.image_placeholder is not None:  # a vision model: image_url parts become its placeholder
            raw, urls = split_images(raw, state.info.image_placeholder)
        if urls:
            fields["image_data"] = urls  # checked by parse_request below (a bad one is a 400 naming it)
        messages, extra, sp, tool_job = _tools_of(f, state, chat_messages(raw), sp)
        if f.get("input_ids") is not None:  # SGLang: pre-tokenized prompt, the template is not applied
            fields["input_ids"] = f["input_ids"]
        else:
            effort = {"reasoning_effort": f["reasoning_effort"]} if f.get("reasoning_effort") is not None else {}
            kwargs = {**effort, **(f.get("chat_template_kwargs") or {}), **extra}  # SGLang forwards reasoning_effort
            fields["text"] = await state.engine.call(ChatPromptReq(messages, True,
                                                                   bool(f.get("continue_final_message")),
                                                                   kwargs or None))
        reasoning = _reasoning_of(state, f, fields.get("text"))
        want, top = bool(f.get("logprobs")), int(f.get("top_logprobs") or 0)
    else:
        p = f["prompt"]  # a string, a token list, or a list of either
        tokens = isinstance(p, list) and bool(p) and not all(isinstance(x, str) for x in p)
        fields["input_ids" if tokens else "text"] = p
        want, top = f.get("logprobs") is not None, int(f.get("logprobs") or 0)
    echo_lp = not chat and bool(f.get("echo")) and want  # echo + logprobs: the prompt's logprobs too (as vLLM)
    job_id = ("chatcmpl-" if chat else "cmpl-") + (f.get("rid") or new_rid())
    budget = (f.get("custom_params") or {}).get("thinking_budget")
    if budget is not None:  # SGLang's per-request thinking budget
        if state.config.engine.reasoning_parser is None:
            raise ApiError(400, "custom_params.thinking_budget needs a reasoning model served with --reasoning-parser",
                           param="custom_params")
        fields["max_thinking_tokens"] = budget
    fields["lora_path"] = f.get("lora_path") or lora_of_model(state, f.get("model"))
    fields.update(sampling_params=sp, return_logprob=want, top_logprobs_num=top,
                  logprob_start_len=0 if echo_lp else -1, extra_key=f.get("extra_key"), cache_salt=f.get("cache_salt"))
    with request_errors():
        parsed = parse_request(fields, vocab, lambda i, j, n: f"{job_id}-{i}-{j}", server_image_limits(state))
    items = parsed.items
    if len(items) == 1:  # one prompt, one sample: the engine request is named as the response
        items = [dataclasses.replace(items[0], rid=job_id)]
    job = _Job(job_id, chat, items, parsed.prompt_of, want, top, tools=tool_job, reasoning=reasoning)
    if not chat and f.get("echo"):
        first = {}  # prompt index -> its first item
        for inp, i in zip(items, parsed.prompt_of):
            first.setdefault(i, inp)
        job.echo_texts = [inp.text if inp.text is not None else await state.engine.call(DetokenizeReq(inp.input_ids))
                          for inp in first.values()]
    return job, {**f, "stream_options": options}


def _usage(job: _Job, metas: list[dict]) -> dict:
    seen, prompt_tokens = set(), 0
    for idx, meta in enumerate(metas):
        if job.prompt_of[idx] not in seen:  # n samples of one prompt count its tokens once
            seen.add(job.prompt_of[idx])
            prompt_tokens += int(meta.get("prompt_tokens") or 0)
    completion = sum(int(m.get("completion_tokens") or 0) for m in metas)
    cached = sum(int(m.get("cached_tokens") or 0) for m in metas)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion, "total_tokens": prompt_tokens + completion,
            "prompt_tokens_details": {"cached_tokens": cached}}


def _choice(job: _Job, idx: int, out: dict) -> dict:
    meta = out.get("meta_info", {})
    reason, matched = finish_reason(meta)
    if job.chat:
        message = {"role": "assistant", "content": out.get("text", "")}
        if job.reasoning is not None:  # the thinking first; tool calls are parsed from the answer only
            split = split_reasoning(job.reasoning.format, message["content"], job.reasoning.prompt_open)
            message["content"], message["reasoning_content"] = split.content, split.reasoning
        if job.tools is not None:
            parsed = parse_tool_calls(message["content"], job.tools.format)
            if parsed.calls:
                message = {**message, "content": parsed.content.strip() or None,
                           "tool_calls": [c.to_openai() for c in parsed.calls]}
                reason = "tool_calls" if reason == "stop" else reason
        return {"index": idx, "message": message,
                "logprobs": chat_logprobs(meta) if job.want_logprobs else None,
                "finish_reason": reason, "matched_stop": matched}
    text = out.get("text", "")
    if job.echo_texts is not None:
        text = job.echo_texts[job.prompt_of[idx]] + text
    if job.want_logprobs and job.echo_texts is not None:  # prompt entries first (the first one has no logprob)
        meta = {"output_token_logprobs": (meta.get("input_token_logprobs") or []) + (meta.get("output_token_logprobs") or []),
                "output_top_logprobs": (meta.get("input_top_logprobs") or []) + (meta.get("output_top_logprobs") or [])}
    lp = completion_logprobs(meta, want_top=job.top_logprobs > 0) if job.want_logprobs else None
    return {"index": idx, "text": text, "logprobs": lp, "finish_reason": reason, "matched_stop": matched}


async def _handle(request: web.Request, chat: bool) -> web.StreamResponse:
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    job, f = await _build_job(state, body, chat)
    state.admit(job.items)
    route = request.path
    if not f.get("stream"):
        try:
            outs = await state.run_many(job.items, route)
        except EngineError as e:
            raise _tool_compile_error(job, e) from None
        return web.json_response({
            "id": job.id, "object": "chat.completion" if chat else "text_completion", "created": int(time.time()),
            "model": state.model_name, "choices": [_choice(job, i, o) for i, o in enumerate(outs)],
            "usage": _usage(job, [o.get("meta_info", {}) for o in outs])}, headers=request_id_header(job.id))
    include_usage = bool(f["stream_options"].get("include_usage"))
    return await _stream(request, state, job, route, include_usage)


async def _stream(request, state: ServerState, job: _Job, route: str, include_usage: bool) -> web.StreamResponse:
    created = int(time.time())
    obj = "chat.completion.chunk" if job.chat else "text_completion"
    sent_text = [0] * len(job.items)
    sent_lp = [0] * len(job.items)
    metas: list[dict] = [{} for _ in job.items]

    parsers = [ToolCallStream(job.tools.format) for _ in job.items] if job.tools is not None else None
    held_ws = [""] * len(job.items)  # whitespace-only content of a tool job waits for real text
    called = [False] * len(job.items)
    thinking = [ReasoningStream(job.reasoning.format, job.reasoning.prompt_open) for _ in job.items] \
        if job.reasoning is not None else None

    def event(idx: int, text: str, reason=None, matched=None, logprobs=None, first=False, calls=None,
              reasoning: str = "") -> dict:
        if job.chat:
            delta = {"role": "assistant", "content": text} if first else ({"content": text} if text else {})
            if reasoning:
                delta["reasoning_content"] = reasoning
            if calls:
                delta["tool_calls"] = calls
            choice = {"index": idx, "delta": delta, "logprobs": logprobs, "finish_reason": reason}
        else:
            choice = {"index": idx, "text": text, "logprobs": logprobs, "finish_reason": reason}
        if reason is not None:
            choice["matched_stop"] = matched
        return {"id": job.id, "object": obj, "created": created, "model": state.model_name, "choices": [choice]}

    def tool_delta(idx: int, events: list) -> tuple[str, list]:
        text, calls = tool_call_deltas(events)
        called[idx] = called[idx] or bool(calls)
        text = held_ws[idx] + text
        held_ws[idx] = ""
        if text and not text.strip():
            held_ws[idx], text = text, ""
        return text, calls

    async with contextlib.aclosing(state.merge_streams(job.items, route)) as gen:
        try:
            idx, chunk = await first_item(gen)
        except EngineError as e:
            raise _tool_compile_error(job, e) from None
        resp = await start_sse(request, job.id)
        try:
            if job.chat:
                for i in range(len(job.items)):
                    await send_sse(resp, event(i, "", first=True))
            if job.echo_texts is not None:
                for i in range(len(job.items)):
                    await send_sse(resp, event(i, job.echo_texts[job.prompt_of[i]]))
            while True:
                meta = chunk.get("meta_info", {})
                metas[idx] = meta
                text = chunk.get("text", "")
                delta, sent_text[idx] = text[sent_text[idx]:], max(sent_text[idx], len(text))
                lp = None
                n_lp = len(meta.get("output_token_logprobs") or [])
                if job.want_logprobs and n_lp > sent_lp[idx]:
                    lp = (chat_logprobs(meta, sent_lp[idx]) if job.chat else
                          completion_logprobs(meta, sent_lp[idx], offset=sent_text[idx] - len(delta),
                                              want_top=job.top_logprobs > 0))
                    sent_lp[idx] = n_lp
                reason, matched = finish_reason(meta)
                calls, thought = None, ""
                if thinking is not None:
                    thought, delta = thinking[idx].feed(delta, final=reason is not None)
                if parsers is not None:
                    events = parsers[idx].feed(delta) + (parsers[idx].finish() if reason is not None else [])
                    delta, calls = tool_delta(idx, events)
                if delta or lp or calls or thought:
                    await send_sse(resp, event(idx, delta, logprobs=lp, calls=calls, reasoning=thought))
                if reason is not None:
                    if parsers is not None and called[idx] and reason == "stop":
                        reason = "tool_calls"
                    await send_sse(resp, event(idx, "", reason, matched))
                try:
                    idx, chunk = await anext(gen)
                except StopAsyncIteration:
                    break
            if include_usage:
                await send_sse(resp, {"id": job.id, "object": obj, "created": created, "model": state.model_name,
                                      "choices": [], "usage": _usage(job, metas)})
        except EngineError as e:
            await send_sse(resp, error_body(e.status, e.message))
        await send_sse(resp, "[DONE]")
    return resp


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _handle(request, chat=False)


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _handle(request, chat=True)


def _model_card(state: ServerState) -> dict:
    return {"id": state.model_name, "object": "model", "created": int(state.started_at), "owned_by": "sglpy",
            "root": state.info.model_path, "max_model_len": state.info.context_len}


async def models(request: web.Request) -> web.Response:
    """GET /v1/models."""
    state = request.app["state"]
    card = _model_card(state)
    return web.json_response({"object": "list", "data": [card, *adapter_cards(state, card["created"])]})


async def model(request: web.Request) -> web.Response:
    """GET /v1/models/{model}: the served model or one of its LoRA adapters, else 404."""
    state: ServerState = request.app["state"]
    card = _model_card(state)
    adapter = [c for c in adapter_cards(state, card["created"]) if c["id"] == request.match_info["model"]]
    if adapter:
        return web.json_response(adapter[0])
    if request.match_info["model"] != state.model_name:
        raise ApiError(404, f"model {request.match_info['model']!r} is not served here (serving {state.model_name!r})",
                       param="model")
    return web.json_response(_model_card(state))

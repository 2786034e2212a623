"""SGLang-native POST /generate: request validation, batch/n expansion, JSON or SSE responses."""

from __future__ import annotations

import contextlib
import dataclasses

from aiohttp import web

from ..messages import EngineError, GenerateReqInput
from ..sampling_params import LogprobOptions, SamplingParams
from .http_common import (ApiError, check_fields, error_body, is_bool, is_dict, is_int, is_int_list, is_str,
                          is_str_list, one_of, read_json_object, send_sse, start_sse)
from .state import ServerState, new_rid


def _is_list_of(pred):
    return lambda v: isinstance(v, list) and all(pred(x) for x in v)


GENERATE_FIELDS = {
    "text": (one_of(is_str, is_str_list), "a string or a list of strings"),
    "input_ids": (one_of(is_int_list, _is_list_of(is_int_list)), "a list of ints or a list of lists of ints"),
    "sampling_params": (one_of(is_dict, _is_list_of(is_dict)), "an object or a list of objects"),
    "rid": (one_of(is_str, is_str_list), "a string or a list of strings"),
    "return_logprob": (one_of(is_bool, _is_list_of(is_bool)), "a bool or a list of bools"),
    "logprob_start_len": (one_of(is_int, _is_list_of(is_int)), "an int or a list of ints"),
    "top_logprobs_num": (one_of(is_int, _is_list_of(is_int)), "an int or a list of ints"),
    "return_text_in_logprobs": (is_bool, "a bool"),
    "stream": (is_bool, "a bool"),
    "extra_key": (one_of(is_str, is_str_list), "a string or a list of strings"),  # prefix-cache namespace
    "log_metrics": (is_bool, "a bool"),  # accepted, no effect: every request is measured
}
# SGLang fields this server does not implement: accepted only when empty, else a clear 400.
UNSUPPORTED = ("image_data", "video_data", "audio_data", "input_embeds", "lora_path", "lora_id", "session_params",
               "custom_logit_processor", "token_ids_logprob", "return_hidden_states")


def validate_sampling_params(sp: dict, param: str = "sampling_params") -> SamplingParams:
    """The request's SamplingParams, validated here once; 400 naming the problem for unknown names or bad values."""
    try:
        return SamplingParams.from_dict(sp)
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"invalid {param}: {e}", param=param) from None


def request_input(rid: str, prompt: dict, sampling: SamplingParams, logprob: LogprobOptions,
                  extra_key: str | None) -> GenerateReqInput:
    """One engine request (stream=True: the server reads every step's output); 400 for a bad prompt."""
    try:
        return GenerateReqInput(rid=rid, sampling=sampling, logprob=logprob, extra_key=extra_key, stream=True,
                                **prompt)
    except ValueError as e:
        raise ApiError(400, str(e), param="text" if "text" in prompt else "input_ids") from None


def _per_item(value, n: int, name: str, default):
    if isinstance(value, list) and name != "input_ids":
        if len(value) != n:
            raise ApiError(400, f"{name} has {len(value)} entries for a batch of {n}", param=name)
        return value
    return [default if value is None else value] * n


def parse_generate(body: dict) -> tuple[list[GenerateReqInput], bool]:
    """One GenerateReqInput per prompt after n-expansion, and whether the answer is a list."""
    check_fields(body, GENERATE_FIELDS, "request", ignored=UNSUPPORTED)
    for name in UNSUPPORTED:
        if body.get(name) not in (None, False, [], "", {}):
            raise ApiError(400, f"{name} is not supported by this server", param=name)
    text, ids = body.get("text"), body.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError(400, "give exactly one of text or input_ids", param="text")
    if text is not None:
        batch = isinstance(text, list)
        prompts = [{"text": t} for t in (text if batch else [text])]
    else:
        batch = bool(ids) and isinstance(ids[0], list)
        prompts = [{"input_ids": x} for x in (ids if batch else [ids])]
        if any(not p["input_ids"] for p in prompts):
            raise ApiError(400, "input_ids must not be empty", param="input_ids")
    if not prompts:
        raise ApiError(400, "the batch is empty", param="text" if text is not None else "input_ids")
    if not batch and any(isinstance(body.get(k), list) for k in ("sampling_params", "rid", "return_logprob")):
        raise ApiError(400, "per-item lists need a batch of prompts", param="sampling_params")
    k = len(prompts)
    sps = _per_item(body.get("sampling_params"), k, "sampling_params", {})
    rids = _per_item(body.get("rid"), k, "rid", None)
    rlp = _per_item(body.get("return_logprob"), k, "return_logprob", False)
    starts = _per_item(body.get("logprob_start_len"), k, "logprob_start_len", -1)
    tops = _per_item(body.get("top_logprobs_num"), k, "top_logprobs_num", 0)
    keys = _per_item(body.get("extra_key"), k, "extra_key", None)
    items = []
    for i, p in enumerate(prompts):
        sp = validate_sampling_params(sps[i])
        n = sp.n
        if n > 1:
            sp = dataclasses.replace(sp, n=1)  # n samples are n engine requests
        try:
            logprob = LogprobOptions(return_logprob=rlp[i], logprob_start_len=starts[i], top_logprobs_num=tops[i],
                                     return_text_in_logprobs=body.get("return_text_in_logprobs", False))
        except ValueError as e:
            raise ApiError(400, str(e), param="logprob_start_len") from None
        for j in range(n):
            rid = rids[i] or new_rid()
            if n > 1:
                rid = f"{rid}-{j}"
            items.append(request_input(rid, p, sp, logprob, keys[i]))
        batch = batch or n > 1
    if len({inp.rid for inp in items}) != len(items):
        raise ApiError(400, "request ids in one batch must be distinct", param="rid")
    return items, batch


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate (SGLang GenerateReqInput)."""
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    items, batch = parse_generate(body)
    state.admit(len(items))
    if not body.get("stream"):
        results = await state.run_many(items, "/generate")
        return web.json_response(results if batch else results[0], headers={"X-Request-Id": items[0].rid})
    if not batch:
        return await _stream_single(request, state, items[0])
    return await _stream_batch(request, state, items)


async def first_item(gen):
    """The first item of an async generator (EngineError if it ends at once)."""
    try:
        return await anext(gen)
    except StopAsyncIteration:
        raise EngineError(500, "the engine finished the request without output") from None


async def _stream_single(request, state: ServerState, inp: GenerateReqInput) -> web.StreamResponse:
    async with contextlib.aclosing(state.run_one(inp, "/generate")) as gen:
        first = await first_item(gen)  # an early rejection becomes a plain 400, not a 200 stream
        resp = await start_sse(request, inp.rid)
        try:
            await send_sse(resp, first)
            async for chunk in gen:
                await send_sse(resp, chunk)
        except EngineError as e:
            await send_sse(resp, error_body(e.status, e.message))
        await send_sse(resp, "[DONE]")
    return resp


async def _stream_batch(request, state: ServerState, items: list) -> web.StreamResponse:
    async with contextlib.aclosing(state.merge_streams(items, "/generate")) as gen:
        i, first = await first_item(gen)
        resp = await start_sse(request, items[0].rid)
        try:
            await send_sse(resp, {**first, "index": i})
            async for i, chunk in gen:
                await send_sse(resp, {**chunk, "index": i})
        except EngineError as e:
            await send_sse(resp, error_body(e.status, e.message))
        await send_sse(resp, "[DONE]")
    return resp

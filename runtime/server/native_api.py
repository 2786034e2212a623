"""SGLang-native POST /generate: the wire checks (wire_tables.GENERATE / SAMPLING), then runtime/request.py; JSON or SSE."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

from aiohttp import web

from ..images import ImageLimits
from ..messages import EngineError, GenerateReqInput
from ..request import ITEM_FIELDS, REQUEST_FIELDS, parse_request, sampling_params
from ..sampling_params import SamplingParams
from .http_common import (ApiError, error_body, first_item, read_json_object, request_errors, request_id_header, send_sse,
                          start_sse)
from .state import ServerState
from .wire_tables import GENERATE, SAMPLING


def validate_sampling_params(sp, vocab_size: int, param: str = "sampling_params") -> SamplingParams:
    """A /generate sampling_params object -> SamplingParams, validated here once (table, ranges, vocabulary)."""
    fields = SAMPLING.validate(sp if sp is not None else {}, param)
    with request_errors():
        return sampling_params(fields, vocab_size, param)


@dataclass(frozen=True)
class GenerateJob:
    """A parsed /generate request: one engine input per prompt x sample, and how to answer."""

    items: list[GenerateReqInput]
    batch: bool  # answer with a list
    stream: bool
    log_metrics: bool = True
    no_logs: bool = False


def server_image_limits(state: ServerState) -> ImageLimits | None:
    """What the server checks images against (its engine flags); None when the served model reads no images."""
    if state.info.image_placeholder is None:
        return None
    e = state.config.engine
    return ImageLimits(e.max_image_bytes, e.max_image_pixels, e.max_images_per_request, e.allow_image_paths)


def check_reads_images(image_limits: ImageLimits | None) -> None:
    """400 for images sent to a text-only model."""
    if image_limits is None:
        raise ApiError(400, "image_data is not supported by this model (a text-only model reads no images)",
                       param="image_data")


def parse_generate(body: dict, vocab_size: int, image_limits: ImageLimits | None = None) -> GenerateJob:
    """Validate a /generate body against GENERATE and SAMPLING (the wire), then parse it (runtime/request.py).
    Images are decoded and checked against `image_limits` here (None: a text-only model refuses them)."""
    f = GENERATE.validate(body)
    fields = {k: v for k, v in f.items() if k in ITEM_FIELDS or k in REQUEST_FIELDS}
    if f.get("image_data") not in (None, []):
        check_reads_images(image_limits)
        fields["image_data"] = f["image_data"]
    sps = f.get("sampling_params")
    if isinstance(sps, list):
        fields["sampling_params"] = [SAMPLING.validate(sp or {}, f"sampling_params[{i}]") for i, sp in enumerate(sps)]
    else:
        fields["sampling_params"] = SAMPLING.validate(sps or {}, "sampling_params")
    with request_errors():  # every item streams its steps to the server, which answers JSON or SSE
        parsed = parse_request({**fields, "stream": True}, vocab_size, image_limits=image_limits)
    return GenerateJob(parsed.items, parsed.batch, bool(f.get("stream")), f.get("log_metrics", True),
                       bool(f.get("no_logs")))


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate (SGLang GenerateReqInput)."""
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    job = parse_generate(body, state.info.vocab_size, server_image_limits(state))
    items = job.items
    state.admit(items)
    opts = {"record_metrics": job.log_metrics, "log": not job.no_logs}
    if not job.stream:
        results = await state.run_many(items, "/generate", **opts)
        return web.json_response(results if job.batch else results[0], headers=request_id_header(items[0].rid))
    if not job.batch:
        return await _stream_single(request, state, items[0], opts)
    return await _stream_batch(request, state, items, opts)


async def _stream_single(request, state: ServerState, inp: GenerateReqInput, opts: dict) -> web.StreamResponse:
    async with contextlib.aclosing(state.run_one(inp, "/generate", **opts)) as gen:
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


async def _stream_batch(request, state: ServerState, items: list, opts: dict) -> web.StreamResponse:
    async with contextlib.aclosing(state.merge_streams(items, "/generate", **opts)) as gen:
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

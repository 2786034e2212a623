"""SGLang-native POST /generate: request validation (wire_tables.GENERATE / SAMPLING), batch/n expansion, JSON or SSE."""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

from aiohttp import web

from ..engine.request_builder import expand_inputs
from ..messages import EngineError, GenerateReqInput
from ..sampling_params import LogprobOptions, SamplingParams
from .http_common import ApiError, error_body, read_json_object, request_id_header, send_sse, start_sse
from .state import ServerState, new_rid
from .wire_tables import GENERATE, MAX_TOP_LOGPROBS_NUM, SAMPLING, TOP_K_ALL


def check_token_ids(ids, vocab_size: int, param: str) -> None:
    """400 naming the first id outside [0, vocab_size)."""
    bad = [t for t in ids if not 0 <= t < vocab_size]
    if bad:
        raise ApiError(400, f"{param}: token id(s) {bad[:5]} outside the vocabulary [0, {vocab_size})", param=param)


def check_sampling(sp: SamplingParams, vocab_size: int, param: str) -> SamplingParams:
    """Checks that need the model: token ids inside the vocabulary."""
    check_token_ids(sp.stop_token_ids, vocab_size, f"{param}.stop_token_ids")
    check_token_ids(list(sp.logit_bias or {}), vocab_size, f"{param}.logit_bias")
    return sp


def build_sampling(fields: dict, vocab_size: int, param: str) -> SamplingParams:
    """SamplingParams from validated wire fields (SGLang names); 400 naming a bad value."""
    fields = dict(fields)
    if "seed" in fields and "sampling_seed" in fields:
        raise ApiError(400, f"{param}: give seed or sampling_seed, not both", param="sampling_seed")
    if fields.get("top_k") == TOP_K_ALL:
        fields["top_k"] = -1  # SGLang's spelling of "whole vocabulary"
    if isinstance(fields.get("logit_bias"), dict):
        fields["logit_bias"] = {int(k): v for k, v in fields["logit_bias"].items()}
    if fields.get("structural_tag") is not None:
        from sglpy.grammar.structural_tag import StructuralTag

        try:  # the spec's shape is checked here; its schemas when the constraint compiles
            fields["structural_tag"] = StructuralTag.parse(fields["structural_tag"]).to_json()
        except ValueError as e:
            raise ApiError(400, f"{param}.structural_tag: {e}", param="structural_tag") from None
    try:
        sp = SamplingParams.from_dict(fields)
    except (ValueError, TypeError) as e:
        raise ApiError(400, f"invalid {param}: {e}", param=param) from None
    return check_sampling(sp, vocab_size, param)


def validate_sampling_params(sp, vocab_size: int, param: str = "sampling_params") -> SamplingParams:
    """A /generate sampling_params object -> SamplingParams, validated here once (table, ranges, vocabulary)."""
    return build_sampling(SAMPLING.validate(sp if sp is not None else {}, param), vocab_size, param)


def request_input(rid: str, prompt: dict, sampling: SamplingParams, logprob: LogprobOptions,
                  extra_key: str | None) -> GenerateReqInput:
    """One engine request (stream=True: the server reads every step's output); 400 for a bad prompt."""
    try:
        return GenerateReqInput(rid=rid, sampling=sampling, logprob=logprob, extra_key=extra_key, stream=True,
                                **prompt)
    except ValueError as e:
        raise ApiError(400, str(e), param="text" if "text" in prompt else "input_ids") from None


def cache_namespace(extra_key: str | None, cache_salt: str | None) -> str | None:
    """The prefix-cache namespace of extra_key and cache_salt (SGLang: "" means none)."""
    extra_key, cache_salt = extra_key or None, cache_salt or None
    if cache_salt is None:
        return extra_key
    return f"{extra_key or ''}\x00salt:{cache_salt}"


def logprob_options(return_logprob, start, top, with_text, vocab_size: int) -> LogprobOptions:
    """LogprobOptions with the door's range checks (top_logprobs_num capped; start -1 or a position)."""
    top = 0 if top is None else top
    cap = min(MAX_TOP_LOGPROBS_NUM, vocab_size)
    if not 0 <= top <= cap:
        raise ApiError(400, f"top_logprobs_num must be in [0, {cap}], got {top}", param="top_logprobs_num")
    try:
        return LogprobOptions(return_logprob=bool(return_logprob), return_text_in_logprobs=bool(with_text),
                              logprob_start_len=-1 if start is None else start, top_logprobs_num=top)
    except ValueError as e:
        raise ApiError(400, str(e), param="logprob_start_len") from None


@dataclass(frozen=True)
class GenerateJob:
    """A parsed /generate request: one engine input per prompt x sample, and how to answer."""

    items: list[GenerateReqInput]
    batch: bool  # answer with a list
    stream: bool
    log_metrics: bool = True
    no_logs: bool = False


def _per_item(value, n: int, name: str, default):
    if isinstance(value, list) and name != "input_ids":
        if len(value) != n:
            raise ApiError(400, f"{name} has {len(value)} entries for a batch of {n}", param=name)
        return [default if v is None else v for v in value]
    return [default if value is None else value] * n


def parse_generate(body: dict, vocab_size: int) -> GenerateJob:
    """Validate a /generate body against GENERATE and SAMPLING; one GenerateReqInput per prompt after n-expansion."""
    f = GENERATE.validate(body)
    text, ids = f.get("text"), f.get("input_ids")
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
        for p in prompts:
            check_token_ids(p["input_ids"], vocab_size, "input_ids")
    if not prompts:
        raise ApiError(400, "the batch is empty", param="text" if text is not None else "input_ids")
    per_item = ("sampling_params", "rid", "return_logprob", "logprob_start_len", "top_logprobs_num", "extra_key",
                "cache_salt")
    if not batch and any(isinstance(f.get(k), list) for k in per_item):
        raise ApiError(400, "per-item lists need a batch of prompts", param="sampling_params")
    k = len(prompts)
    sps = _per_item(f.get("sampling_params"), k, "sampling_params", {})
    rids = _per_item(f.get("rid"), k, "rid", None)
    rlp = _per_item(f.get("return_logprob"), k, "return_logprob", False)
    starts = _per_item(f.get("logprob_start_len"), k, "logprob_start_len", -1)
    tops = _per_item(f.get("top_logprobs_num"), k, "top_logprobs_num", 0)
    keys = _per_item(f.get("extra_key"), k, "extra_key", None)
    salts = _per_item(f.get("cache_salt"), k, "cache_salt", None)
    samplings, logprobs = [], []
    for i in range(k):
        where = f"sampling_params[{i}]" if isinstance(f.get("sampling_params"), list) else "sampling_params"
        samplings.append(validate_sampling_params(sps[i], vocab_size, where))
        logprobs.append(logprob_options(rlp[i], starts[i], tops[i], f.get("return_text_in_logprobs"), vocab_size))
    # n samples are n engine requests, named rid-j (one shared expansion: engine/request_builder.py)
    items = [e.inp for e in expand_inputs(prompts, samplings, logprobs,
                                          [cache_namespace(keys[i], salts[i]) for i in range(k)],
                                          lambda i, j, n: (rids[i] or new_rid()) + (f"-{j}" if n > 1 else ""),
                                          make=request_input)]
    if f.get("max_thinking_tokens") is not None:  # reasoning models: the request's thinking bound
        items = [dataclasses.replace(inp, max_thinking_tokens=f["max_thinking_tokens"]) for inp in items]
    batch = batch or any(sp.n > 1 for sp in samplings)
    if len({inp.rid for inp in items}) != len(items):
        raise ApiError(400, "request ids in one batch must be distinct", param="rid")
    return GenerateJob(items, batch, bool(f.get("stream")), f.get("log_metrics", True), bool(f.get("no_logs")))


async def generate(request: web.Request) -> web.StreamResponse:
    """POST /generate (SGLang GenerateReqInput)."""
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    job = parse_generate(body, state.info.vocab_size)
    items = job.items
    state.admit(len(items))
    opts = {"record_metrics": job.log_metrics, "log": not job.no_logs}
    if not job.stream:
        results = await state.run_many(items, "/generate", **opts)
        return web.json_response(results if job.batch else results[0], headers=request_id_header(items[0].rid))
    if not job.batch:
        return await _stream_single(request, state, items[0], opts)
    return await _stream_batch(request, state, items, opts)


async def first_item(gen):
    """The first item of an async generator (EngineError if it ends at once)."""
    try:
        return await anext(gen)
    except StopAsyncIteration:
        raise EngineError(500, "the engine finished the request without output") from None


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

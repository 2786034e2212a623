"""`sglpy serve`: the aiohttp HTTP server (SGLang-native + OpenAI-compatible) in front of an engine process.

Run: `sglpy serve --port 30000` or `python -m sglpy.runtime.server --port 30000`. See docs/server.md.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import sys
import time

from aiohttp import web

from . import anthropic_api, console_routes, lora_routes, native_api, openai_api, sglang_routes
from ..messages import (DetokenizeReq, EngineError, FlushCacheReq, GenerateReqInput, GetServerInfoReq,
                        TokenizeReq)
from ..sampling_params import SamplingParams
from .engine_client import EngineClient
from .http_common import ApiError, auth_middleware, error_middleware, error_response, read_json_object
from .metrics import CONTENT_TYPE_LATEST, PoolStats
from .config import ServerConfig, config_from_args
from .state import ServerState
from .supervisor import stall_reason, supervise
from .wire_tables import ABORT, DETOKENIZE, TOKENIZE

logger = logging.getLogger("sglpy.server")


async def health(request: web.Request) -> web.Response:
    """GET /health: 200 while the engine is alive, its step loop is not stalled and the server is not shutting down.

    Never runs a generation. The X-Engine-Restarts header counts engine processes the supervisor replaced.
    """
    state: ServerState = request.app["state"]
    headers = {"X-Engine-Restarts": str(state.engine_restarts)}
    stalled = stall_reason(state)
    state.metrics.engine_stalled.set(1 if stalled else 0)
    if state.ready and stalled is None:
        return web.Response(status=200, headers=headers)
    if state.draining:
        reason = "shutting down"
    elif stalled is not None:
        reason = stalled
    else:
        reason = state.restarting or state.engine.dead_reason or "engine starting"
    return error_response(503, f"unhealthy: {reason}", headers=headers)


async def health_generate(request: web.Request) -> web.Response:
    """GET /health_generate: run a one-token generation; 200 when it produces output in time."""
    state: ServerState = request.app["state"]
    if not state.ready:
        return await health(request)
    inp = GenerateReqInput(rid=f"HEALTH_CHECK_{time.time_ns()}", input_ids=[0], stream=True,
                           sampling=SamplingParams(max_new_tokens=1, temperature=0.0))

    async def one():
        async with contextlib.aclosing(state.engine.generate(inp)) as gen:
            async for _ in gen:
                return  # any output proves the step loop runs; closing aborts the rest

    try:
        await asyncio.wait_for(one(), state.config.health_generate_timeout)
    except asyncio.TimeoutError:
        return error_response(503, f"health generation timed out after {state.config.health_generate_timeout} s")
    except EngineError as e:
        return error_response(503, f"health generation failed: {e.message}")
    return web.Response(status=200)


async def model_info(request: web.Request) -> web.Response:
    """GET /get_model_info: SGLang fields plus the chat template and special tokens."""
    info = request.app["state"].info
    return web.json_response({
        "model_path": info.model_path, "tokenizer_path": info.model_path, "is_generation": True,
        "preferred_sampling_params": None, "weight_version": "default", "has_image_understanding": info.image_placeholder is not None,
        "has_audio_understanding": False, "model_type": info.model_type,
        "architectures": list(info.architectures), "context_len": info.context_len,
        "vocab_size": info.vocab_size, "chat_template": info.chat_template,
        "special_tokens": info.special_tokens, "supports_constraints": info.supports_constraints,
        "image_placeholder": info.image_placeholder})


async def server_info(request: web.Request) -> web.Response:
    """GET /get_server_info: every setting (API key redacted) + the engine's scheduler/pool state."""
    from sglpy import __version__

    state: ServerState = request.app["state"]
    engine_state = await state.engine.call(GetServerInfoReq())
    stats = PoolStats(engine_state)
    return web.json_response({
        **state.config.public_dict(), **{k: v for k, v in engine_state.items() if k not in ("api_key",)},
        "max_total_num_tokens": stats.total_tokens, "context_len": state.info.context_len,
        "internal_states": [engine_state],
        "kv_pool": {"total": stats.total_tokens, "used": stats.used_tokens, "cached": stats.cached_tokens,
                    "free": stats.free_tokens},
        "num_inflight_requests": state.engine.num_inflight, "version": __version__,
        "engine_restarts": state.engine_restarts, "engine_pid": state.engine.pid,
        "engine_standby_pid": state.engine.standby_pid,
        # what sglang-router reads as worker metadata (a TP group is one worker; replicas are separate workers)
        "tp_size": state.config.engine.tp_size, "dp_size": 1, "served_model_name": state.model_name, "disaggregation_mode": "null"},
        dumps=_dumps)


def _dumps(obj) -> str:
    return json.dumps(obj, default=str)  # engine info may hold paths or enums


async def flush_cache(request: web.Request) -> web.Response:
    """GET|POST /flush_cache: 200 when flushed; 400 while requests are running (SGLang semantics)."""
    if await request.app["state"].engine.call(FlushCacheReq()):
        return web.Response(text="Cache flushed.\n")
    return error_response(400, "Cache not flushed: requests are running or waiting. Retry when idle.")


async def abort_request(request: web.Request) -> web.Response:
    """POST /abort_request {"rid": str} or {"abort_all": true}."""
    state: ServerState = request.app["state"]
    body = ABORT.validate(await read_json_object(request))
    rids = state.engine.inflight_rids() if body.get("abort_all") else [body.get("rid")]
    if rids == [None]:
        raise ApiError(400, "give rid or abort_all", param="rid")
    aborted = [r for r in rids if state.engine.abort(r)]
    return web.json_response({"aborted": aborted})


async def tokenize(request: web.Request) -> web.Response:
    """POST /tokenize {"text" | "prompt": str | [str], "add_special_tokens": bool} -> {"tokens", "count", "max_model_len"}."""
    state: ServerState = request.app["state"]
    body = TOKENIZE.validate(await read_json_object(request))
    if (body.get("text") is None) == (body.get("prompt") is None):  # SGLang 0.5.23 sends `prompt`
        raise ApiError(400, "give exactly one of text or prompt", param="text")
    given = body["text"] if body.get("text") is not None else body["prompt"]
    texts = given if isinstance(given, list) else [given]
    ids = await state.engine.call(TokenizeReq(texts, body.get("add_special_tokens", True)))
    single = not isinstance(given, list)
    return web.json_response({"tokens": ids[0] if single else ids,
                              "count": len(ids[0]) if single else [len(x) for x in ids],
                              "max_model_len": state.info.context_len})


async def detokenize(request: web.Request) -> web.Response:
    """POST /detokenize {"tokens": [int], "skip_special_tokens": bool} -> {"text"}."""
    state: ServerState = request.app["state"]
    body = DETOKENIZE.validate(await read_json_object(request))
    text = await state.engine.call(DetokenizeReq(body["tokens"], body.get("skip_special_tokens", False)))
    return web.json_response({"text": text})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text format; gauges refreshed from the engine at scrape time."""
    state: ServerState = request.app["state"]
    stats = await state.pool_stats(timeout=2.0) if state.engine.alive else None
    state.metrics.update_engine_gauges(stats, state.engine.num_inflight, state.engine.alive)
    state.metrics.engine_stalled.set(1 if stall_reason(state) else 0)
    return web.Response(body=state.metrics.render(), headers={"Content-Type": CONTENT_TYPE_LATEST})


def build_app(state: ServerState) -> web.Application:
    """The aiohttp application with every route and the error/auth middlewares."""
    app = web.Application(client_max_size=state.config.max_request_bytes,
                          middlewares=[error_middleware, auth_middleware(
                              state.config.api_key, ("/health",) + console_routes.OPEN_PATHS)])
    app["state"] = state
    app["config"] = state.config
    r = app.router
    r.add_get("/health", health)
    r.add_get("/health_generate", health_generate)
    for path in ("/get_model_info", "/model_info"):
        r.add_get(path, model_info)
    for path in ("/get_server_info", "/server_info"):
        r.add_get(path, server_info)
    r.add_route("GET", "/flush_cache", flush_cache)
    r.add_post("/flush_cache", flush_cache)
    r.add_post("/abort_request", abort_request)
    r.add_post("/tokenize", tokenize)
    r.add_post("/detokenize", detokenize)
    r.add_get("/metrics", metrics)
    r.add_post("/generate", native_api.generate)
    r.add_put("/generate", native_api.generate)
    r.add_get("/v1/models", openai_api.models)
    r.add_get("/v1/models/{model:.+}", openai_api.model)  # ids may be paths
    r.add_post("/v1/completions", openai_api.completions)
    r.add_post("/v1/chat/completions", openai_api.chat_completions)
    r.add_post("/v1/messages", anthropic_api.messages)  # Anthropic Messages API
    sglang_routes.add_routes(r)
    lora_routes.add_routes(r)
    console_routes.add_routes(app)  # GET / (web console), its API, GET /trace
    return app


# After SIGTERM: graceful_shutdown_timeout for in-flight requests, then at most this long for the rest (aborts,
# handlers stuck writing to clients that stopped reading, the engine process's exit) before the engine is killed;
# then the process exits (about a second on a busy 2-core box): all within graceful_shutdown_timeout + 5 s.
SHUTDOWN_GRACE_S = 2.5
ABORT_GRACE_S = 1.0  # for aborted requests to end (the engine's next step) before their handlers are closed
HANDLERS_GRACE_S = 0.5  # aiohttp's wait for handlers still running after the drain (slow readers), then closed


async def _drain(state: ServerState, deadline: float) -> None:
    """Let in-flight requests finish until `deadline`, then abort the rest (waiting at most ABORT_GRACE_S)."""
    state.draining = True
    while state.engine.num_inflight and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    left = state.engine.inflight_rids()
    if left:
        logger.warning("shutdown: aborting %d request(s) still in flight", len(left))
        for rid in left:
            state.engine.abort(rid)
        while state.engine.num_inflight and time.monotonic() < deadline + ABORT_GRACE_S:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.1)  # let handlers write their final events


async def serve(config: ServerConfig) -> int:
    """Bind, start the engine process, serve until SIGTERM/SIGINT, shut down cleanly; return the exit code."""
    engine = EngineClient(config.engine_factory, dataclasses.asdict(config.engine), config.log_level,
                          max_inflight=config.max_inflight_requests, standby=config.engine_standby,
                          max_queue_wait=config.max_queue_wait)
    state = ServerState(config, engine)
    runner = web.AppRunner(build_app(state), handler_cancellation=True, access_log=None,
                           keepalive_timeout=config.timeout_keep_alive, shutdown_timeout=HANDLERS_GRACE_S)
    await runner.setup()
    site = web.TCPSite(runner, config.host, config.port)
    await site.start()  # bind first: /health answers 503 while the model loads
    logger.info("listening on http://%s:%d (engine loading)", config.host, config.port)
    stop = asyncio.Event()
    signalled: list[float] = []  # when the first SIGTERM/SIGINT arrived: every shutdown deadline counts from it

    def on_signal():
        if not signalled:
            signalled.append(time.monotonic())
        stop.set()

    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, on_signal)
    start = asyncio.ensure_future(engine.start(config.engine_startup_timeout))
    stopper = asyncio.ensure_future(stop.wait())
    await asyncio.wait({start, stopper}, return_when=asyncio.FIRST_COMPLETED)
    code = 0
    if start.done() and start.exception() is not None:
        logger.error("%s", start.exception())
        code = 1
    elif start.done():
        logger.info("ready: model %s, context %s tokens", engine.info.model_path, engine.info.context_len)
        gc.freeze()  # startup objects never die: keep them out of later full GC passes
        state.engine_started_at = time.monotonic()
        supervisor = asyncio.ensure_future(supervise(state))
        await stopper
        state.draining = True  # no restart from here on
        supervisor.cancel()
        # bounded: a restart under way ends at its next await (supervisor.py checks draining after each)
        await asyncio.wait({supervisor}, timeout=SHUTDOWN_GRACE_S)
    logger.info("shutting down")
    # everything ends within graceful_shutdown_timeout + SHUTDOWN_GRACE_S (+ the kill) of the signal
    deadline = (signalled[0] if signalled else time.monotonic()) + config.graceful_shutdown_timeout
    hard_deadline = deadline + SHUTDOWN_GRACE_S
    start.cancel()
    await site.stop()  # stop accepting connections; open ones get 503 while draining
    if engine.alive:
        await _drain(state, deadline)
    await runner.cleanup()  # handlers still running get HANDLERS_GRACE_S, then their connections close
    await engine.shutdown(timeout=max(0.2, hard_deadline - time.monotonic()))
    logger.info("stopped")
    return code


def main(argv: list[str] | None = None) -> int:
    """Parse flags and serve (the `sglpy serve` / `python -m sglpy.runtime.server` entry point)."""
    try:
        config = config_from_args(argv)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    logging.basicConfig(level=config.log_level.upper(), format="%(asctime)s %(name)s %(levelname)s %(message)s")
    if config.engine.node_rank > 0:  # a further node of a tensor-parallel group: its ranks only, no HTTP
        from ..model.tp_worker import serve_node

        return serve_node(config.engine, config.engine_restart_attempts, config.engine_restart_backoff)
    if config.dp_size > 1:
        from .replicas import launch  # N workers behind sglang-router; this process serves nothing itself

        return launch(config)
    sglang_routes.install_probe_log_filter()
    code = asyncio.run(serve(config))
    _stop_resource_tracker()
    return code


def _stop_resource_tracker() -> None:
    """Stop multiprocessing's resource tracker (started with the engine process) and reap it now, so no process of
    the server outlives it: orphaned, the tracker takes another second or two to notice and exit."""
    from multiprocessing import resource_tracker

    with contextlib.suppress(Exception):  # a private API: when it changes, the tracker still exits by itself
        resource_tracker._resource_tracker._stop()


"""The web console on `sglpy serve`: GET / (static page, runtime/server/console/), its JSON API, and GET /trace.

The page's three files are served without the API key (they hold no data; the page asks for the key and sends
it as a Bearer header from then on); every data route here needs the key like the rest of the server. Every
response carries a Content-Security-Policy that allows no inline script and no other origin. See docs/console.md.
"""

from __future__ import annotations

import collections
import contextlib
import pathlib
import time

from aiohttp import web

from ..messages import ChatPromptReq, EngineError, GetServerInfoReq
from ..request import parse_request
from .http_common import (ApiError, error_body, first_item, read_json_object, request_errors, request_id_header,
                          send_sse, start_sse)
from .metrics import PoolStats
from .native_api import validate_sampling_params
from .state import ServerState
from .trace import build_record

STATIC = pathlib.Path(__file__).parent / "console"
FILES = {"/": ("index.html", "text/html"), "/console/app.js": ("app.js", "text/javascript"),
         "/console/style.css": ("style.css", "text/css")}
OPEN_PATHS = tuple(FILES)  # served without the API key (auth_middleware's open paths, with /health)
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff",
                    "Referrer-Policy": "no-referrer", "X-Frame-Options": "DENY", "Cache-Control": "no-store"}
CONSTRAINT_KINDS = ("regex", "json_schema", "ebnf", "choices")
HISTORY_S = 300.0  # the dashboard plots the last five minutes
SAMPLE_MIN_S = 0.5  # polls closer together than this share one sample


async def static_file(request: web.Request) -> web.Response:
    """GET /, /console/app.js, /console/style.css: the page (no build step, no CDN)."""
    name, ctype = FILES[request.path]
    return web.Response(body=(STATIC / name).read_bytes(), content_type=ctype, charset="utf-8",
                        headers=SECURITY_HEADERS)


class History:
    """Dashboard samples of the last HISTORY_S seconds, taken when someone polls (no poll, no cost)."""

    def __init__(self):
        self.points: collections.deque = collections.deque()

    def sample(self, now: float, snap: dict) -> None:
        """Add a point (tokens/s from the previous one); drop points older than HISTORY_S."""
        if self.points and now - self.points[-1]["t"] < SAMPLE_MIN_S:
            return
        prev = self.points[-1] if self.points else None
        gen = snap["generation_tokens"]
        rate = 0.0
        if prev is not None and gen >= prev["generation_tokens"]:  # a restarted engine counts from 0 again
            rate = (gen - prev["generation_tokens"]) / (now - prev["t"])
        kv = snap["kv"]
        self.points.append({"t": now, "running": snap["running"], "queued": snap["queued"],
                            "tokens_per_s": round(rate, 2), "generation_tokens": gen,
                            "kv_used": kv["used"], "kv_cached": kv["cached"], "kv_total": kv["total"],
                            "cache_hit_rate": snap["cache_hit_rate"]})
        while self.points and now - self.points[0]["t"] > HISTORY_S:
            self.points.popleft()


def _counters(state: ServerState) -> dict:
    """The server's own request counters (/metrics; they survive engine restarts)."""
    reg, labels = state.metrics.registry, {"model_name": state.metrics.model_name}
    names = {"generation_tokens": "sglang:generation_tokens_total", "prompt_tokens": "sglang:prompt_tokens_total",
             "cached_tokens": "sglang:cached_tokens_total", "num_requests": "sglang:num_requests_total"}
    return {k: int(reg.get_sample_value(name, labels) or 0) for k, name in names.items()}


async def stats(request: web.Request) -> web.Response:
    """GET /console/api/stats: the live numbers of the dashboard and the sampled history."""
    state: ServerState = request.app["state"]
    info = {}
    if state.engine.alive:
        with contextlib.suppress(EngineError):
            info = await state.engine.call(GetServerInfoReq(), timeout=2.0)
    pool = PoolStats(info)
    grammar = info.get("grammar") or {}
    snap = {
        "time": time.time(), "ready": state.ready, "engine_alive": state.engine.alive,
        "engine_restarts": state.engine_restarts, "restarting": state.restarting,
        "inflight": state.engine.num_inflight, "running": pool.num_running, "queued": pool.num_waiting,
        "kv": {"total": pool.total_tokens, "used": pool.used_tokens, "cached": pool.cached_tokens,
               "free": pool.free_tokens},
        "cache_hit_rate": round(pool.cache_hit_rate, 4),
        **_counters(state), "steps": int(info.get("num_steps") or 0),
        "grammar": {k: grammar.get(k) for k in ("pending", "cached", "compiles", "cache_hits", "errors", "timeouts",
                                                "compile_s", "jumps", "jumped_tokens")},
        "trace_enabled": state.tracing.enabled,
        "model": state.model_name if state.engine.info is not None else None,
    }
    history: History = request.app["console_history"]
    history.sample(time.monotonic(), snap)
    t_last = history.points[-1]["t"] if history.points else 0.0
    snap["history"] = [{**p, "age_s": round(t_last - p["t"], 2)} for p in history.points]
    return web.json_response(snap)


async def compile_check(request: web.Request) -> web.Response:
    """POST /console/api/compile {"kind", "value"}: compile through the engine's compiler (a zero-token request).

    200 {"ok": true, "seconds"} or {"ok": false, "error": the compiler's message}."""
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    kind, value = body.get("kind"), body.get("value")
    if kind not in CONSTRAINT_KINDS:
        raise ApiError(400, f"kind must be one of {', '.join(CONSTRAINT_KINDS)}", param="kind")
    t0 = time.perf_counter()
    try:
        sp = validate_sampling_params({"max_new_tokens": 0, kind: value}, state.info.vocab_size, "constraint")
    except ApiError as e:
        return web.json_response({"ok": False, "error": e.message})
    (inp,) = parse_request({"input_ids": [0], "sampling_params": sp, "stream": True}).items
    state.admit([inp])
    try:
        await state.run_to_end(inp, "/console/api/compile", record_metrics=False, log=False)
    except EngineError as e:
        if e.status != 400:
            raise
        return web.json_response({"ok": False, "error": e.message})
    return web.json_response({"ok": True, "seconds": round(time.perf_counter() - t0, 4)})


GENERATE_FIELDS = {"prompt", "chat", "system", "sampling_params", "return_logprob"}


async def console_generate(request: web.Request) -> web.StreamResponse:
    """POST /console/api/generate: the playground's stream (SSE); outputs keep meta_info["trace"], and a last
    event {"record": ...} carries the request's trace record."""
    state: ServerState = request.app["state"]
    body = await read_json_object(request)
    unknown = sorted(set(body) - GENERATE_FIELDS)
    if unknown:
        raise ApiError(400, f"unknown field(s) {unknown}", param=unknown[0])
    prompt, system = body.get("prompt"), body.get("system")
    if not isinstance(prompt, str) or not prompt:
        raise ApiError(400, "prompt must be a non-empty string", param="prompt")
    if system is not None and not isinstance(system, str):
        raise ApiError(400, "system must be a string", param="system")
    sp = validate_sampling_params(body.get("sampling_params"), state.info.vocab_size)
    text = prompt
    if body.get("chat"):
        messages = ([{"role": "system", "content": system}] if system else []) + [{"role": "user", "content": prompt}]
        text = await state.engine.call(ChatPromptReq(messages))
    with request_errors():
        (inp,) = parse_request({"text": text, "sampling_params": sp, "stream": True, "trace": "live",
                                "return_logprob": body.get("return_logprob") is True}, state.info.vocab_size).items
    state.admit([inp])
    received = time.time()
    final, outcome = None, "ok"
    async with contextlib.aclosing(state.run_one(inp, "/console/api/generate")) as gen:
        final = await first_item(gen)  # a rejected constraint is a plain 400, not a 200 stream
        resp = await start_sse(request, inp.rid)
        try:
            await send_sse(resp, final)
            async for chunk in gen:
                final = chunk
                await send_sse(resp, chunk)
        except EngineError as e:
            outcome = f"error {e.status}: {e.message}"
            await send_sse(resp, error_body(e.status, e.message))
    trace = (final.get("meta_info") or {}).get("trace") or None
    await send_sse(resp, {"record": build_record(inp, "/console/api/generate", received, final, trace, outcome)})
    await send_sse(resp, "[DONE]")
    return resp


async def trace_list(request: web.Request) -> web.Response:
    """GET /trace?limit=N: summaries of the newest traces (newest first); {"enabled": false} without --enable-trace."""
    state: ServerState = request.app["state"]
    try:
        limit = int(request.query.get("limit", "50"))
    except ValueError:
        raise ApiError(400, "limit must be an int", param="limit") from None
    if not 1 <= limit <= 100_000:
        raise ApiError(400, "limit must be in [1, 100000]", param="limit")
    ring = state.tracing.ring
    return web.json_response({"enabled": ring is not None, "capacity": ring.capacity if ring else 0,
                              "traces": ring.recent(limit) if ring else []})


async def trace_get(request: web.Request) -> web.Response:
    """GET /trace/{rid}: one request's trace record; 404 when tracing is off or the request is not in the ring."""
    state: ServerState = request.app["state"]
    rid = request.match_info["rid"]
    ring = state.tracing.ring
    if ring is None:
        raise ApiError(404, "tracing is off: start the server with --enable-trace")
    record = ring.get(rid)
    if record is None:
        raise ApiError(404, f"no trace for request {rid!r} (never traced, or dropped from the ring of the newest "
                            f"{ring.capacity})", param="rid")
    return web.json_response(record, headers=request_id_header(rid))


def add_routes(app: web.Application) -> None:
    """Register the console's routes on `app` (its middlewares are set by build_app)."""
    app["console_history"] = History()
    r = app.router
    for path in FILES:
        r.add_get(path, static_file)
    r.add_get("/console/api/stats", stats)
    r.add_post("/console/api/compile", compile_check)
    r.add_post("/console/api/generate", console_generate)
    r.add_get("/trace", trace_list)
    r.add_get("/trace/{rid}", trace_get)

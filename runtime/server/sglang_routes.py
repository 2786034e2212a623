"""Routes SGLang's frontend and sglang-router call besides /generate: join, profiling, load, and the probe log filter.

* POST /concate_and_append_request: SGLang's `fork(...).join("concate_and_append")` sends the branch ids
  it uses internally (its StreamExecutor sids, never sent with any /generate), after it has joined the
  branches' text itself. There is no server state to merge, so the route validates the body and answers
  200; the next /generate carries the joined text and reuses the cached prefix.
* GET|POST /start_profile, /stop_profile: accepted; no trace is recorded (the model runs in the engine
  process, which this server does not profile). The answer says so.
* GET /get_load: what sglang-router's /get_loads polls: running and waiting requests and KV tokens in use.
"""

from __future__ import annotations

import logging

from aiohttp import web

from .http_common import read_json_object
from .state import ServerState
from .wire_tables import CONCATE_AND_APPEND

PROFILE_NOTE = "profiling is not supported by this server: no trace is recorded"


async def concate_and_append_request(request: web.Request) -> web.Response:
    """POST /concate_and_append_request {"src_rids": [str], "dst_rid": str}: 200 (the client joined the text)."""
    CONCATE_AND_APPEND.validate(await read_json_object(request))
    return web.json_response({"success": True})


async def start_profile(request: web.Request) -> web.Response:
    """GET|POST /start_profile: 200, no trace (see the module docstring)."""
    return web.Response(text=f"Start profiling: {PROFILE_NOTE}.\n")


async def stop_profile(request: web.Request) -> web.Response:
    """GET|POST /stop_profile: 200, no trace."""
    return web.Response(text=f"Stop profiling: {PROFILE_NOTE}.\n")


async def get_load(request: web.Request) -> web.Response:
    """GET /get_load: [{"dp_rank": 0, "num_reqs", "num_waiting_reqs", "num_tokens"}] (one data-parallel rank)."""
    state: ServerState = request.app["state"]
    stats = await state.pool_stats(timeout=2.0) if state.engine.alive else None
    running, waiting, tokens = (stats.num_running, stats.num_waiting, stats.used_tokens) if stats else (0, 0, 0)
    return web.json_response([{"dp_rank": 0, "num_reqs": running + waiting, "num_waiting_reqs": waiting,
                               "num_tokens": tokens}])


def add_routes(router: web.UrlDispatcher) -> None:
    """Register this module's routes."""
    router.add_post("/concate_and_append_request", concate_and_append_request)
    for path, handler in (("/start_profile", start_profile), ("/stop_profile", stop_profile)):
        router.add_get(path, handler)
        router.add_post(path, handler)
    router.add_get("/get_load", get_load)


class ProbeLogFilter(logging.Filter):
    """Turns aiohttp's traceback for a non-HTTP/1 connection (sglang-router's HTTP/2 "PRI" probe) into one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and type(exc).__name__ == "BadHttpMessage" and "PRI" in str(exc):
            record.msg = "refused a non-HTTP/1.1 connection (an HTTP/2 or gRPC probe): %s"
            record.args = (" ".join(str(exc).split()),)
            record.exc_info, record.exc_text, record.levelno, record.levelname = None, None, logging.INFO, "INFO"
        return True


def install_probe_log_filter() -> None:
    """Attach ProbeLogFilter to aiohttp's server logger (idempotent)."""
    logger = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ProbeLogFilter) for f in logger.filters):
        logger.addFilter(ProbeLogFilter())

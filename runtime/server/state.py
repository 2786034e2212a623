"""Per-server state: admission control (bounded queue, draining), metrics and the request log."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import AsyncIterator

from ..tools.registry import ToolSetup
from ..tools.registry import detect as detect_tools
from ..messages import EngineError, EngineInfo, GenerateReqInput, GetServerInfoReq
from .engine_client import EngineClient
from .http_common import ApiError
from .limits import check_request_limits
from .metrics import PoolStats, ServerMetrics
from .config import ServerConfig
from .trace import Tracing

request_log = logging.getLogger("sglpy.server.requests")


class ServerState:
    """Everything the route handlers share."""

    def __init__(self, config: ServerConfig, engine: EngineClient):
        self.config = config
        self.engine = engine
        self.draining = False
        self.started_at = time.time()
        self.engine_started_at = time.monotonic()  # the current engine process's start (supervisor backoff)
        self.engine_restarts = 0
        self.restarting: str | None = None  # what /health says while the supervisor starts a new engine
        self.metrics = ServerMetrics(config.served_model_name or config.engine.model or "default")
        self._unrecorded = ServerMetrics("unrecorded")  # never exported
        self._tool_setup: tuple[str | None, ToolSetup] | None = None
        self.tracing = Tracing(config.enable_trace, config.trace_capacity)  # trace.py: --enable-trace's ring
        # LoRA adapters served, name -> path (server/lora_routes.py keeps it: startup ones, then loads and unloads)
        self.loras: dict[str, str] = {r.name: r.path for r in config.engine.lora_paths or ()}

    @property
    def model_name(self) -> str:
        """The id reported by /v1/models and in OpenAI responses."""
        return self.config.served_model_name or (self.engine.info.model_path if self.engine.info else "default")

    @property
    def info(self) -> EngineInfo:
        """What the engine reported at startup (model path, context, template, special tokens)."""
        if self.engine.info is None:
            raise ApiError(503, "the engine is still starting", headers={"Retry-After": str(self.config.retry_after)})
        return self.engine.info

    @property
    def tool_setup(self) -> ToolSetup:
        """The tool-call format and rendering for the served model's chat template (or --tool-call-parser)."""
        template = self.info.chat_template
        if self._tool_setup is None or self._tool_setup[0] != template:
            self._tool_setup = (template, detect_tools(template, self.config.tool_call_parser))
        return self._tool_setup[1]

    @property
    def ready(self) -> bool:
        """Engine alive and not shutting down (what /health reports)."""
        return self.engine.alive and not self.draining

    def admit(self, items: list[GenerateReqInput]) -> None:
        """Refuse new generations: 400 past a per-request limit (limits.py); 503 + Retry-After when shutting down,
        engine down or queue full."""
        c = self.config
        for inp in items:
            check_request_limits(inp, c.max_prompt_chars, c.max_constraint_bytes, c.max_schema_depth)
        n = len(items)
        headers = {"Retry-After": str(self.config.retry_after)}
        if self.draining:
            raise ApiError(503, "the server is shutting down", headers=headers)
        if not self.engine.alive:
            why = self.restarting or self.engine.dead_reason or "starting"
            raise ApiError(503, f"the engine is unavailable: {why}", headers=headers)
        limit = self.config.max_inflight_requests
        if n > limit:
            raise ApiError(400, f"this request needs {n} generations; the server admits at most {limit} at once")
        if self.engine.num_inflight + n > limit:
            self.metrics.num_rejected.inc()
            raise ApiError(503, f"server busy: {self.engine.num_inflight} requests in flight (limit {limit}); "
                                "retry later", headers=headers)
        refused = self.engine.backlog.refusal(self.engine.num_inflight, n)
        if refused is not None:  # the whole request, before any of its generations is sent
            self.metrics.num_rejected.inc()
            raise ApiError(503, refused[0], headers={"Retry-After": str(refused[1])})

    async def pool_stats(self, timeout: float = 5.0) -> PoolStats | None:
        """The engine's current pool/scheduler numbers, or None when it does not answer."""
        try:
            return PoolStats(await self.engine.call(GetServerInfoReq(), timeout=timeout))
        except EngineError:
            return None

    async def run_one(self, inp: GenerateReqInput, route: str, record_metrics: bool = True,
                      log: bool = True) -> AsyncIterator[dict]:
        """Stream one generation's cumulative chunks, recording metrics and one log line at the end (unless told not to:
        SGLang's log_metrics / no_logs)."""
        rid = inp.rid
        t0 = time.perf_counter()
        first = last_t = None
        last_n = 0
        final: dict | None = None
        outcome = "ok"
        m = self.metrics if record_metrics else self._unrecorded  # log_metrics: false
        try:
            async with contextlib.aclosing(self.tracing.generate(self.engine, inp, route)) as gen:
                async for chunk in gen:
                    now = time.perf_counter()
                    n = int(chunk.get("meta_info", {}).get("completion_tokens") or 0)
                    if n > last_n:
                        if first is None:
                            first = now
                            m.ttft.observe(now - t0)
                        else:
                            m.itl.observe((now - last_t) / (n - last_n))
                        last_t, last_n = now, n
                    final = chunk
                    yield chunk
        except EngineError as e:
            outcome = f"error {e.status}: {e.message}"
            m.num_errors.inc()
            raise
        except (asyncio.CancelledError, GeneratorExit):
            outcome = "client disconnected (aborted)"
            raise
        finally:
            e2e = time.perf_counter() - t0
            meta = (final or {}).get("meta_info", {})
            reason = meta.get("finish_reason") or {}
            aborted = outcome != "ok" or (isinstance(reason, dict) and reason.get("type") == "abort")
            if final is not None or outcome.startswith("client"):
                m.record_finished(meta, aborted, inp.sampling.constraint is not None)
                m.e2e.observe(e2e)
            if self.config.log_requests and log:
                ttft = f"{first - t0:.3f}s" if first is not None else "-"
                request_log.info(
                    "rid=%s route=%s outcome=%s finish=%s prompt_tokens=%s completion_tokens=%s "
                    "cached_tokens=%s ttft=%s e2e=%.3fs", rid, route, outcome,
                    reason.get("type") if isinstance(reason, dict) else reason, meta.get("prompt_tokens", "-"),
                    meta.get("completion_tokens", "-"), meta.get("cached_tokens", "-"), ttft, e2e)

    async def run_to_end(self, inp: GenerateReqInput, route: str, **opts) -> dict:
        """The final (complete) object of one generation."""
        final = None
        async with contextlib.aclosing(self.run_one(inp, route, **opts)) as gen:
            async for chunk in gen:
                final = chunk
        if final is None:
            raise EngineError(500, "the engine finished the request without output")
        return final

    async def run_many(self, items: list[GenerateReqInput], route: str, **opts) -> list[dict]:
        """Run several generations concurrently; the first failure aborts the others."""
        tasks = [asyncio.ensure_future(self.run_to_end(inp, route, **opts)) for inp in items]
        try:
            return list(await asyncio.gather(*tasks))
        finally:
            for t in tasks:
                t.cancel()

    async def merge_streams(self, items: list[GenerateReqInput], route: str, **opts) -> AsyncIterator[tuple[int, dict]]:
        """Interleave the chunk streams of several generations as (index, chunk) in arrival order."""
        queue: asyncio.Queue = asyncio.Queue()
        done_marker = object()

        async def pump(i, inp):
            try:
                async with contextlib.aclosing(self.run_one(inp, route, **opts)) as gen:
                    async for chunk in gen:
                        await queue.put((i, chunk))
                await queue.put((i, done_marker))
            except BaseException as e:  # noqa: BLE001 - forwarded to the consumer
                await queue.put((i, e))

        tasks = [asyncio.ensure_future(pump(i, inp)) for i, inp in enumerate(items)]
        remaining = len(tasks)
        try:
            while remaining:
                i, item = await queue.get()
                if item is done_marker:
                    remaining -= 1
                elif isinstance(item, BaseException):
                    raise item
                else:
                    yield i, item
        finally:
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

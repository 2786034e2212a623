"""Server-process side of the engine process: spawn it, send it messages, route its per-step outputs to handlers.

The engine runs in its own process (so the HTTP event loop never waits on the model). Two one-way pipes
carry the dataclasses of runtime/messages.py: GenerateReqInput / AbortReq / Call / ShutdownReq out,
StepOutputs (every output of one engine step), Failed, CallResult, Ready / StartupFailed back. Outputs are
cumulative; the server keeps the last for non-streaming responses. A closed pipe means the engine process
died: pending requests fail at once.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import multiprocessing
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator

from ..messages import (AbortReq, Call, CallRequest, CallResult, EngineError, EngineInfo, EngineProgress, Failed,
                        GenerateReqInput, LoadModel, Ready, ReqOutput, ShutdownReq, StartupFailed, StepOutputs)
from .backlog import BacklogGate
from .engine_process import engine_main

logger = logging.getLogger("sglpy.server.engine")


class _Pending:
    """Messages of one in-flight generation, read by its HTTP handler."""

    def __init__(self):
        self.items: collections.deque = collections.deque()
        self.ready = asyncio.Event()
        self.abandoned = False  # the HTTP side left; drop its chunks until the engine reports the end

    def put(self, msg) -> None:
        """Queue a message from the engine (event-loop thread only)."""
        self.items.append(msg)
        self.ready.set()

    async def get(self):
        """The next message; consecutive outputs collapse to the newest (they are cumulative)."""
        while not self.items:
            self.ready.clear()
            await self.ready.wait()
        msg = self.items.popleft()
        while isinstance(msg, ReqOutput) and self.items and isinstance(self.items[0], ReqOutput):
            msg = self.items.popleft()
        return msg


@dataclass
class EngineClient:
    """Server-side handle of the engine process; all methods run on the server's event loop.

    `start` may be called again after the process died (the supervisor restarts it): each start is a new
    incarnation with its own pipes and reader thread, and a late message of an old one is ignored.
    """

    factory: str
    engine_kwargs: dict
    log_level: str = "info"
    max_inflight: int = 0  # generations in flight at most (0: no bound); more fail with 503 at once
    standby: str = "off"  # keep a spare engine process: "imports" done, or the "model" loaded (engine_process.py)
    max_queue_wait: float = 0.0  # refuse a generation expected to wait longer (backlog.py; 0: never)
    info: EngineInfo | None = None  # set once the engine reported Ready
    alive: bool = False
    dead_reason: str | None = None

    def __post_init__(self):
        self._pending: dict[str, _Pending] = {}
        self._calls: dict[int, asyncio.Future] = {}
        self._ids = itertools.count()
        self._ready: asyncio.Future | None = None
        self._proc = None
        self._spare: _Spawned | None = None  # the standby process, waiting for LoadModel
        self.backlog = BacklogGate(self.max_queue_wait)
        self._send_lock = threading.Lock()
        self._stopping = False  # shutdown() was asked: the process exiting is expected
        self._incarnation = 0
        self.died: asyncio.Event | None = None  # set when a started engine dies unexpectedly (the supervisor waits)
        self.progress: EngineProgress | None = None  # the last heartbeat
        self.progress_at = 0.0  # time.monotonic() when it arrived

    @property
    def num_inflight(self) -> int:
        """Generations sent to the engine and not yet reported finished (abandoned ones included)."""
        return len(self._pending)

    @property
    def pid(self) -> int | None:
        """The engine process id (None before start)."""
        return self._proc.pid if self._proc else None

    @property
    def standby_pid(self) -> int | None:
        """The standby engine process id (None when there is none)."""
        return self._spare.proc.pid if self._spare else None

    async def start(self, timeout: float) -> EngineInfo:
        """Spawn the engine process and wait until its model is loaded; return the engine info."""
        loop = asyncio.get_running_loop()
        if self._stopping:
            raise RuntimeError("the server is shutting down")
        if self.died is None:
            self.died = asyncio.Event()
        self.died.clear()
        self._incarnation += 1
        self._ready = loop.create_future()
        spawned = self._take_spare() or self._spawn("off")
        self._proc = proc = spawned.proc
        self._cmd_w = spawned.cmd_w
        threading.Thread(target=self._read_loop, args=(loop, spawned.out_r, proc, self._incarnation), daemon=True,
                         name="engine-reader").start()
        try:
            self.info = await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except asyncio.TimeoutError:
            self.kill()
            raise RuntimeError(f"the engine did not start within {timeout:.0f} s") from None
        except BaseException:  # failed to start, or cancelled (shutdown during a restart)
            self.kill()
            raise
        self.alive, self.dead_reason = True, None
        self.progress, self.progress_at = None, time.monotonic()
        if self.standby != "off" and not self._stopping:  # after the load: the two never compete for the cores
            self._spare = self._spawn(self.standby)
        return self.info

    def _spawn(self, standby: str) -> _Spawned:
        """Start an engine process (a standby one waits for LoadModel: after its imports, or with its model)."""
        ctx = multiprocessing.get_context("spawn")
        cmd_r, cmd_w = ctx.Pipe(duplex=False)
        out_r, out_w = ctx.Pipe(duplex=False)
        # daemon: if the server dies without cleanup, multiprocessing's exit hook still ends the engine.
        proc = ctx.Process(target=engine_main, name="sglpy-engine", daemon=True,
                           args=(self.factory, self.engine_kwargs, cmd_r, out_w, self.log_level, standby))
        proc.start()
        cmd_r.close()
        out_w.close()  # the engine holds the only write end, so its death closes the pipe
        return _Spawned(proc, cmd_w, out_r)

    def _take_spare(self) -> _Spawned | None:
        """The standby process told to load the model, or None when there is none (or it died)."""
        spare, self._spare = self._spare, None
        if spare is None:
            return None
        try:
            if spare.proc.is_alive():
                spare.cmd_w.send(LoadModel())
                return spare
        except (BrokenPipeError, OSError):
            pass
        spare.kill()
        return None

    def _read_loop(self, loop, conn, proc, incarnation: int) -> None:
        while True:
            try:
                batch = [conn.recv()]
                while len(batch) < 512 and conn.poll():  # one loop wake-up per burst, not per message
                    batch.append(conn.recv())
            except (EOFError, OSError):
                break
            loop.call_soon_threadsafe(self._dispatch_many, batch, incarnation)
        proc.join(2.0)  # reap it so the exit code is known
        loop.call_soon_threadsafe(self._on_dead, f"engine process exited (exit code {proc.exitcode})", incarnation)

    def _dispatch_many(self, batch: list, incarnation: int) -> None:
        if incarnation != self._incarnation:
            return  # a message of a process that was replaced
        for msg in batch:
            self._dispatch(msg)

    def _dispatch(self, msg) -> None:
        if isinstance(msg, EngineProgress):
            self.progress, self.progress_at = msg, time.monotonic()
        elif isinstance(msg, StepOutputs):
            for out in msg.outputs:
                self._deliver(out.rid, out, out.finished)
        elif isinstance(msg, Failed):
            self._deliver(msg.rid, msg, True)
        elif isinstance(msg, CallResult):
            fut = self._calls.pop(msg.call_id, None)
            if fut is not None and not fut.done():
                if msg.error is None:
                    fut.set_result(msg.value)
                else:
                    fut.set_exception(EngineError(msg.status, msg.error))
        elif isinstance(msg, Ready):
            if not self._ready.done():
                self._ready.set_result(msg.info)
        elif isinstance(msg, StartupFailed):
            if not self._ready.done():
                self._ready.set_exception(RuntimeError(f"engine failed to start: {msg.message}"))

    def _deliver(self, rid: str, msg: ReqOutput | Failed, last: bool) -> None:
        pend = self._pending.get(rid)
        if pend is None:
            return
        if last:
            del self._pending[rid]
            self.backlog.finished(len(self._pending))
        if not pend.abandoned:
            pend.put(msg)

    def _on_dead(self, reason: str, incarnation: int | None = None) -> None:
        if incarnation is not None and incarnation != self._incarnation:
            return  # an old process's end, reported after its replacement started
        was_alive = self.alive and not self._stopping
        self.alive = False
        self.dead_reason = self.dead_reason or reason
        if was_alive:
            logger.error("%s; failing %d in-flight request(s)", reason, len(self._pending))
            if self.died is not None:
                self.died.set()
        if self._ready is not None and not self._ready.done():
            self._ready.set_exception(RuntimeError(f"engine failed to start: {reason}"))
        for rid, pend in list(self._pending.items()):
            pend.put(Failed(rid, f"the engine is unavailable: {reason}", 503))
        self._pending.clear()
        self.backlog.changed(0)
        for fut in self._calls.values():
            if not fut.done():
                fut.set_exception(EngineError(503, f"the engine is unavailable: {reason}"))
        self._calls.clear()

    def _send(self, msg) -> None:
        if not self.alive:
            raise EngineError(503, f"the engine is unavailable: {self.dead_reason or 'not started'}")
        try:
            with self._send_lock:
                self._cmd_w.send(msg)
        except (BrokenPipeError, OSError) as e:
            self._on_dead(f"engine pipe broken ({e})")
            raise EngineError(503, "the engine is unavailable: pipe broken") from None

    async def generate(self, inp: GenerateReqInput) -> AsyncIterator[dict]:
        """Stream cumulative outputs (SGLang /generate objects) of one generation; EngineError on rejection or death."""
        rid = inp.rid
        if rid in self._pending:
            raise EngineError(400, f"request id {rid!r} is already in flight")
        if self.max_inflight and len(self._pending) >= self.max_inflight:
            # the bound itself: ServerState.admit checks it at the door, but requests admitted in the same instant
            # (a burst) all passed that check before any of them got here; from this line to the registration
            # below nothing awaits, so the count cannot be overtaken
            raise EngineError(503, f"server busy: {len(self._pending)} requests in flight (limit {self.max_inflight}); "
                                   "retry later")
        refused = self.backlog.refusal(len(self._pending), 1)
        if refused is not None:
            raise EngineError(503, refused[0], retry_after=refused[1])
        pend = _Pending()
        self._send(inp)
        self._pending[rid] = pend
        self.backlog.changed(len(self._pending))
        finished = False
        try:
            while not finished:
                msg = await pend.get()  # a lagging consumer skips to the newest cumulative output
                finished = msg.finished if isinstance(msg, ReqOutput) else True
                if isinstance(msg, Failed):
                    raise EngineError(msg.status, msg.message)
                yield msg.to_json()
        finally:
            if not finished:  # the consumer left early (client disconnect, shutdown): free the KV now
                pend.abandoned = True
                self.abort(rid)

    def abort(self, rid: str) -> bool:
        """Ask the engine to abort `rid`; False when it is not in flight."""
        if rid not in self._pending or not self.alive:
            return False
        try:
            self._send(AbortReq(rid))
        except EngineError:
            return False
        return True

    def inflight_rids(self) -> list[str]:
        """Request ids the engine has not reported finished."""
        return list(self._pending)

    async def call(self, request: CallRequest, timeout: float = 30.0):
        """Send one call (FlushCacheReq, GetServerInfoReq, TokenizeReq, ...) and return the engine's answer."""
        call_id = next(self._ids)
        fut = asyncio.get_running_loop().create_future()
        self._calls[call_id] = fut
        try:
            self._send(Call(call_id, request))
            return await asyncio.wait_for(fut, timeout)
        except asyncio.TimeoutError:
            raise EngineError(503, f"the engine did not answer {type(request).__name__} within {timeout:.0f} s") \
                from None
        finally:
            self._calls.pop(call_id, None)

    async def shutdown(self, timeout: float = 10.0) -> None:
        """Ask the engine process to exit; kill it if it does not within `timeout`."""
        self._stopping = True
        self.stop_spare()
        if self._proc is None:
            return
        if not self.alive:  # still loading (or already dead): nothing to finish
            self.kill()
            return
        try:
            self._send(ShutdownReq())
        except EngineError:
            pass
        await asyncio.to_thread(self._proc.join, timeout)
        if self._proc.is_alive():
            logger.warning("engine process did not exit in %.0f s; killing it", timeout)
            self.kill()
        self.alive = False

    def kill(self) -> None:
        """Hard-stop the engine process (startup timeout, failed shutdown)."""
        if self._proc is not None and self._proc.is_alive():
            self._proc.kill()
            self._proc.join(5)

    def stop_spare(self) -> None:
        """End the standby process (shutdown)."""
        spare, self._spare = self._spare, None
        if spare is not None:
            spare.kill()


@dataclass
class _Spawned:
    """One engine process and the server's ends of its two pipes."""

    proc: multiprocessing.process.BaseProcess
    cmd_w: object
    out_r: object

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.cmd_w.close()
        self.out_r.close()

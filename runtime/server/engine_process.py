"""Engine-process side of the server: build the engine, then serve the pipe (requests, aborts, calls, per-step outputs).

Each GenerateReqInput is built (tokenized, validated: engine.build_request) on a small pool and submitted at
once: `submit` never waits, and a request whose constraint still compiles waits for it inside the engine
(engine/admission.py, on the loop thread), where an abort while compiling is handled too; an abort that arrives
while a request is still being built is kept by admission's BuildWindow. Requests are
submitted with one shared sink that writes each engine step's outputs to the pipe as one StepOutputs
message. A heartbeat thread sends the engine's step-loop progress every HEARTBEAT_S (the server's
/health liveness) and ends the process when the step loop died.
"""

from __future__ import annotations

import gc
import importlib
import logging
import os
import signal
import threading
from concurrent.futures import ThreadPoolExecutor

from ..core import EngineProtocol, missing_engine_methods
from ..engine.admission import BuildWindow
from ..engine.output import aborted_output
from ..messages import (AbortReq, Call, CallResult, ChatPromptReq, DetokenizeReq, Failed, FlushCacheReq, ListLorasReq,
                        LoadLoraReq, UnloadLoraReq,
                        GenerateReqInput, GetServerInfoReq, LoadModel, Ready, ShutdownReq, StartupFailed, StepOutputs,
                        TokenizeReq)

logger = logging.getLogger("sglpy.server.engine")

# Call request type -> the engine method answering it (no request field ever names a method).
CALLS = {
    FlushCacheReq: lambda e, r: bool(e.flush_cache()),
    GetServerInfoReq: lambda e, r: e.get_server_info(),
    TokenizeReq: lambda e, r: e.tokenize(r.texts, r.add_special_tokens),
    DetokenizeReq: lambda e, r: e.detokenize(r.ids, r.skip_special_tokens),
    ChatPromptReq: lambda e, r: e.chat_prompt(r.messages, r.add_generation_prompt, r.continue_final_message,
                                              r.template_kwargs),
    LoadLoraReq: lambda e, r: e.load_lora_adapter(r.lora_name, r.lora_path),
    UnloadLoraReq: lambda e, r: e.unload_lora_adapter(r.lora_name),
    ListLorasReq: lambda e, r: e.list_lora_adapters(),
}


class PipeSender:
    """Thread-safe writer for the engine -> server pipe; also the sink every request's outputs go to."""

    def __init__(self, conn):
        self.conn = conn
        self.lock = threading.Lock()

    def send(self, msg) -> None:
        """Send one message; a broken pipe is ignored (the command loop sees EOF and exits)."""
        with self.lock:
            try:
                self.conn.send(msg)
            except (BrokenPipeError, OSError):
                pass

    def __call__(self, step: StepOutputs) -> None:
        self.send(step)


class EngineProcess:
    """Serves one engine over the pipe: builds requests off the command thread, forwards aborts, answers calls."""

    def __init__(self, engine: EngineProtocol, sender: PipeSender, build_workers: int = 4, call_workers: int = 4):
        self.engine, self.sender = engine, sender
        self._builds = ThreadPoolExecutor(build_workers, thread_name_prefix="engine-build")
        self._calls = ThreadPoolExecutor(call_workers, thread_name_prefix="engine-call")
        self._window = BuildWindow()  # requests being built: an abort meanwhile ends them at submit

    def handle(self, msg) -> bool:
        """Dispatch one message from the server; False when it asks the process to stop."""
        if isinstance(msg, GenerateReqInput):
            self._window.open(msg.rid)  # before the build starts, so an abort is never lost
            self._builds.submit(self._build, msg)
        elif isinstance(msg, AbortReq):
            if not self._window.abort(msg.rid):
                self.engine.abort(msg.rid)  # submitted: the engine ends it (compiling, waiting or running)
        elif isinstance(msg, Call):
            self._calls.submit(self._answer, msg)
        elif isinstance(msg, ShutdownReq):
            return False
        else:
            logger.error("unexpected message %s from the server", type(msg).__name__)
        return True

    def _build(self, inp: GenerateReqInput) -> None:
        """Tokenize, validate and submit (a constrained request's compile runs on; the engine admits it when done)."""
        try:
            req = self.engine.build_request(inp)
        except Exception as e:  # noqa: BLE001
            self._window.close(inp.rid)
            self._reject(inp.rid, e)
            return
        try:  # a failed compile comes back through on_error as a 400, like any bad input
            aborted = self._window.close(inp.rid, lambda: self.engine.submit(
                req, self.sender, on_error=lambda e, rid=inp.rid: self._reject(rid, e)))
        except Exception as e:  # noqa: BLE001
            self._reject(inp.rid, e)
            return
        if aborted:
            if req.guide is not None:
                req.guide.cancel()  # stops the compile in its worker
            self.sender(StepOutputs([aborted_output(inp.rid, len(req.input_ids), "aborted before start")]))

    def _reject(self, rid: str, e: Exception) -> None:
        from ..engine.grammar_service import CompileServiceError  # here: the server process never loads grammar

        if isinstance(e, ValueError):  # GrammarError included: the request's own constraint is at fault
            self.sender.send(Failed(rid, str(e), 400))
        elif isinstance(e, CompileServiceError):  # a compile worker died under it: the server's fault, retryable
            logger.warning("request %s: %s", rid, e)
            self.sender.send(Failed(rid, str(e), 503))
        else:
            logger.error("request %s failed in the engine", rid, exc_info=(type(e), e, e.__traceback__))
            self.sender.send(Failed(rid, f"engine error: {type(e).__name__}: {e}", 500))

    def _answer(self, call: Call) -> None:
        try:
            answer = CALLS.get(type(call.request))
            if answer is None:
                raise ValueError(f"unknown engine call {type(call.request).__name__}")
            self.sender.send(CallResult(call.call_id, answer(self.engine, call.request)))
        except ValueError as e:
            self.sender.send(CallResult(call.call_id, error=str(e), status=400))
        except Exception as e:  # noqa: BLE001
            logger.exception("engine call %s failed", type(call.request).__name__)
            self.sender.send(CallResult(call.call_id, error=f"{type(e).__name__}: {e}", status=500))

    def close(self) -> None:
        """Stop the worker pools (pending calls are dropped: the server is going away)."""
        self._builds.shutdown(wait=False, cancel_futures=True)
        self._calls.shutdown(wait=False, cancel_futures=True)


HEARTBEAT_S = 0.5


def _heartbeat(engine: EngineProtocol, sender: PipeSender, stopping: threading.Event) -> None:
    """Send the step loop's progress every HEARTBEAT_S; a dead step loop ends the process (the server restarts it)."""
    while not stopping.wait(HEARTBEAT_S):
        if not engine.is_alive():
            logger.error("the engine step loop died; exiting the engine process")
            logging.shutdown()
            os._exit(70)
        sender.send(engine.progress())


def load_factory(path: str):
    """Resolve 'module:callable' (an operator-given setting, never a request field)."""
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


def preload(factory: str, engine_kwargs: dict) -> None:
    """A standby's head start: import the factory's module and run its module-level `preload(**engine_kwargs)`
    where it has one (the runtime engine's imports torch, transformers and reads the model's config)."""
    module = importlib.import_module(factory.partition(":")[0])
    hook = getattr(module, "preload", None)
    if callable(hook):
        hook(**engine_kwargs)


STANDBY_MODES = ("off", "imports", "model")


def _wait_for_load(cmd_conn) -> bool:
    """A standby waits here for LoadModel; False when the server is gone or dropped it."""
    try:
        return isinstance(cmd_conn.recv(), LoadModel)
    except (EOFError, OSError):
        return False


def engine_main(factory: str, engine_kwargs: dict, cmd_conn, out_conn, log_level: str, standby: str = "off") -> None:
    """Entry point of the engine process: build the engine, then serve commands until told to stop.

    standby (a spare process EngineClient keeps while an engine serves; STANDBY_MODES): "imports" does its
    imports and waits for LoadModel before it builds the engine; "model" builds the whole engine, then waits for
    LoadModel before it reports Ready and serves. Either way a restart after an engine death skips that work."""
    # The server process coordinates shutdown (drain, then ShutdownReq): a Ctrl-C or a SIGTERM sent to the
    # whole process group must not kill the engine under requests that are still finishing. A standby serves
    # nothing yet: a SIGTERM ends it (multiprocessing's exit hook relies on that).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN if standby == "off" else signal.SIG_DFL)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s engine %(levelname)s %(message)s")
    sender = PipeSender(out_conn)
    if standby == "imports":
        try:
            preload(factory, engine_kwargs)
        except Exception:  # noqa: BLE001 - the start proper reports the same failure by name
            logger.warning("standby engine preload failed", exc_info=True)
        if not _wait_for_load(cmd_conn):
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    try:
        engine = load_factory(factory)(**engine_kwargs)
        missing = missing_engine_methods(engine)
        if missing:
            raise TypeError(f"{factory} does not implement EngineProtocol (missing {missing})")
        info = engine.info()
    except BaseException as e:  # noqa: BLE001 - report any startup failure to the server
        sender.send(StartupFailed(f"{type(e).__name__}: {e}"))
        return
    if standby == "model":
        if not _wait_for_load(cmd_conn):
            engine.shutdown()
            return
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # The ~370k objects of imports, model and tokenizer live as long as the process: frozen, they are
    # never rescanned by a full GC pass during serving.
    gc.freeze()
    sender.send(Ready(info))
    stopping = threading.Event()
    threading.Thread(target=_heartbeat, args=(engine, sender, stopping), daemon=True, name="engine-heartbeat").start()
    proc = EngineProcess(engine, sender)
    while True:
        try:
            msg = cmd_conn.recv()
        except (EOFError, OSError):
            break  # the server process is gone
        if not proc.handle(msg):
            break
    stopping.set()
    try:
        engine.shutdown()
    except Exception:  # noqa: BLE001
        logger.exception("engine shutdown failed")
    proc.close()

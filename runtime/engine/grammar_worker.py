"""The grammar compile worker process: compiles one constraint at a time, off the engine's GIL. Torch-free.

Started by the engine's GrammarService (engine/grammar_service.py) as this module run as __main__ with
READ_FD WRITE_FD (after `os.nice`, before any import): a fresh interpreter (no fork of the engine, no
re-import of the caller's __main__). It receives a `WorkerInit` (the tokenizer's vocabulary and the compile limits), warms its tables, then
answers `CompileJob`s with `CompileDone` (the guide pickled without its TokenizerInfo: `pack_guide` /
`unpack_guide`). A `CancelJob` sets the running compile's cancel flag (honoured where the grammar
package checks a budget); the service kills a worker that does not stop in time.

Containment: the worker runs at a low CPU priority (`nice`), dies with the engine process (Linux
PR_SET_PDEATHSIG) and, once warmed up, refuses through an audit hook every file open other than Python
code, every socket connection and every process launch: a constraint can never reach the filesystem or
the network, whatever the compiler does with it.
"""

from __future__ import annotations

import inspect
import io
import os
import pickle
import queue
import signal
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

# ---------------------------------------------------------------- messages (engine <-> worker)


@dataclass(frozen=True)
class WorkerInit:
    """First message to a worker: the vocabulary (TokenizerInfo fields) and the compile limits."""

    info_fields: dict
    max_states: int
    timeout_s: float | None  # the compiler's own budget (its default clock: the compiling thread's CPU time)
    nice: int


@dataclass(frozen=True)
class WorkerReady:
    """The worker warmed up and is waiting for jobs."""

    pid: int


@dataclass(frozen=True)
class CompileJob:
    """Compile one constraint (kind as in SamplingParams.constraint; value a str or a tuple of str)."""

    job_id: int
    kind: str
    value: Any


@dataclass(frozen=True)
class CancelJob:
    """Stop job_id if it is still running (the client went away, or it ran out of budget)."""

    job_id: int


@dataclass(frozen=True)
class CompileDone:
    """A job's result: the packed guide, or the error text (a GrammarError's message names the problem)."""

    job_id: int
    payload: bytes | None
    error: str | None
    seconds: float
    refused_opens: int  # file opens the audit hook refused so far in this worker
    over_budget: bool = False  # the error is the compile budget's (counted as a timeout)


# ---------------------------------------------------------------- guide transfer


def _info_refs(info) -> dict[int, str]:
    """id() of the TokenizerInfo and of each of its non-scalar attributes -> the name to look it up by."""
    refs = {id(info): "."}
    for name, value in vars(info).items():
        if not isinstance(value, (int, float, str, bool, type(None))):
            refs[id(value)] = name
    return refs


def pack_guide(guide, info) -> bytes:
    """Pickle a compiled guide; the TokenizerInfo and its tables travel as references, not copies."""
    refs = _info_refs(info)
    lock_type, rlock_type = type(threading.Lock()), type(threading.RLock())

    class _Pickler(pickle.Pickler):
        dispatch_table = {lock_type: lambda _: (threading.Lock, ()), rlock_type: lambda _: (threading.RLock, ())}

        def persistent_id(self, obj):
            return refs.get(id(obj))

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(guide)
    return buf.getvalue()


def unpack_guide(payload: bytes, info):
    """The guide `pack_guide` wrote, bound to this process's TokenizerInfo (same vocabulary)."""

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            return info if pid == "." else getattr(info, pid)

    return _Unpickler(io.BytesIO(payload)).load()


# ---------------------------------------------------------------- worker process side


class _Sandbox:
    """Audit hook: after `arm()`, refuse file opens other than Python code, sockets and process launches."""

    CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pth")
    REFUSED = ("socket.connect", "socket.bind", "socket.getaddrinfo", "subprocess.Popen", "os.system", "os.exec",
               "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.startfile", "os.remove", "os.rename",
               "os.mkdir", "os.rmdir", "shutil.rmtree", "urllib.Request")

    def __init__(self):
        self.armed = False
        self.refused = 0

    def arm(self) -> None:
        self.armed = True
        sys.addaudithook(self._hook)

    def _hook(self, event: str, args: tuple) -> None:
        if not self.armed:
            return
        if event == "open":
            path = args[0]
            if isinstance(path, (str, bytes)) and os.fsdecode(path).endswith(self.CODE_SUFFIXES):
                return  # a lazy import reads Python code, never a request's data
            self.refused += 1
            raise PermissionError(f"the grammar compiler may not open files (refused: {path!r})")
        if event in self.REFUSED:
            self.refused += 1
            raise PermissionError(f"the grammar compiler may not use {event}")


def _die_with_parent() -> None:
    """Linux: the kernel kills this process when the engine process (its parent) dies."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def compile_with_budget(compiler, job: CompileJob, cancel: threading.Event, timeout_s: float | None):
    """compiler.compile with the budget arguments when this grammar package has them."""
    value = list(job.value) if job.kind == "choices" else job.value
    if {"cancel", "timeout_s"} <= set(inspect.signature(compiler.compile).parameters):
        return compiler.compile(job.kind, value, cancel=cancel, timeout_s=timeout_s)
    return compiler.compile(job.kind, value)  # a grammar package without budgets: the engine's kill bounds it


def worker_main(read_fd: int, write_fd: int) -> None:
    """Serve compile jobs until the engine closes the pipe."""
    from multiprocessing.connection import Connection

    _die_with_parent()
    parent = os.getppid()
    conn_in, conn_out = Connection(read_fd, writable=False), Connection(write_fd, readable=False)
    try:
        init: WorkerInit = conn_in.recv()  # (the launcher already lowered this process's priority by init.nice)
    except (EOFError, OSError):
        os._exit(0)  # the engine went away before this worker started
    from sglpy.grammar import GrammarCompiler, GrammarError, TokenizerInfo
    from sglpy.grammar.ebnf.imports import bundled_grammars
    from sglpy.grammar.errors import BudgetExceeded

    info = TokenizerInfo(**init.info_fields)
    # the engine caches results; the budget is GrammarCompiler's own, on its own clock (the same answer as a
    # direct compile), while the engine bounds the worker's wall time
    compiler = GrammarCompiler(info, max_states=init.max_states, cache_size=0)
    compiler.warmup()
    bundled_grammars()  # lark's own grammars, read once before the sandbox closes
    import lark  # noqa: F401 - imported now, not under the sandbox
    import lark.parsers.lalr_parser  # noqa: F401
    sandbox = _Sandbox()
    sandbox.arm()
    jobs: queue.Queue = queue.Queue()
    cancels: dict[int, threading.Event] = {}

    def read_loop():
        while True:
            try:
                msg = conn_in.recv()
            except (EOFError, OSError):
                os._exit(0)  # the engine is gone: so is this worker
            if isinstance(msg, CompileJob):
                cancels[msg.job_id] = threading.Event()
                jobs.put(msg)
            elif isinstance(msg, CancelJob) and msg.job_id in cancels:
                cancels[msg.job_id].set()

    threading.Thread(target=read_loop, name="grammar-worker-reader", daemon=True).start()
    conn_out.send(WorkerReady(os.getpid()))
    while True:
        job = jobs.get()
        if os.getppid() != parent:
            os._exit(0)
        t0 = time.perf_counter()
        payload = error = None
        over = False
        try:
            payload = pack_guide(compile_with_budget(compiler, job, cancels[job.job_id], init.timeout_s), info)
        except GrammarError as e:
            error, over = str(e), isinstance(e, BudgetExceeded)
        except RecursionError:
            error = f"{job.kind} constraint is nested too deeply to compile"
        except Exception as e:  # noqa: BLE001 - any failure is this constraint's, reported to its sender
            error = f"{job.kind} constraint failed to compile: {type(e).__name__}: {e}"
        cancels.pop(job.job_id, None)
        conn_out.send(CompileDone(job.job_id, payload, error, time.perf_counter() - t0, sandbox.refused, over))


if __name__ == "__main__":
    # run the module under its package name, so the messages it pickles name sglpy.runtime.engine.grammar_worker
    from sglpy.runtime.engine.grammar_worker import worker_main as _main

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 20_000))  # deep schemas: refused by name, not by crash
    threading.stack_size(256 * 1024 * 1024)
    main_thread = threading.Thread(target=_main, args=(int(sys.argv[1]), int(sys.argv[2])))
    main_thread.start()
    main_thread.join()

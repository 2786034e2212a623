"""GrammarService: constraint compiles in worker processes, bounded by a CPU-time budget, cached, cancellable.

`compile(kind, value)` returns a Future of the Guide at once: a cache hit is already done; otherwise the
job runs in a worker process (runtime/engine/grammar_worker.py), so a compile never holds the engine's GIL and
never stalls the step loop. Identical constraints in flight share one job. Each job runs under the grammar
package's own budget, `timeout_s` seconds of the compiling thread's CPU time (the same budget, clock and
error as a direct GrammarCompiler compile, so one constraint gets one answer on every path). As protection
against a compile that does not stop by itself, a job that uses more than `backstop_s` of the worker's CPU
time (read from /proc; elsewhere wall time) or `WALL_FACTOR * timeout_s + 10` seconds of wall time (a starved
worker on a busy box) fails with a GrammarError naming the budget, and its worker is cancelled, then killed
and replaced if it does not stop within `GRACE_S`. A job whose waiters are all cancelled (client gone) is
stopped the same way. A worker that crashes fails only the job it was running, with a CompileServiceError
(the server's fault, not the constraint's: a server answers 503 and the client may retry). Results are kept in an
LRU cache bounded by entries and bytes. workers=0 compiles on a thread of this process instead (no
isolation: the compile holds the GIL; kept for comparison and for hosts that cannot start processes).
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from multiprocessing.connection import Connection, wait
from typing import Any

from sglpy.grammar import GrammarCompiler, GrammarError, Guide, TokenizerInfo
from sglpy.grammar.budget import COMPILE_TIME_S
from sglpy.grammar.errors import BudgetExceeded
from sglpy.kernels.automata import native_automata
from .grammar_worker import (CancelJob, CompileDone, CompileJob, WorkerInit, WorkerReady, compile_with_budget,
                              unpack_guide)

logger = logging.getLogger(__name__)

START_TRIES = 5  # failed worker starts in a row before pending compiles fail and starts pause
RETRY_MAX_S = 30.0  # the longest pause between tries to start a worker
UNSENT_TRIES = 3  # workers found dead at hand-over before a compile fails with "the compile worker is gone"
GRACE_S = 1.0  # a cancelled worker that is still busy after this is killed and replaced
CACHE_BYTES = 1 << 30  # compiled guides kept at most (a 20k-state guide is tens of MB)
# Worker priority. Measured on the 2-core box (plain request during a 5 s compile, vs alone): nice 0
# 1.27-1.67x, nice 10 0.92-1.48x, nice 19 0.7-1.0x, but at nice 19 ordinary compiles starved behind other
# jobs on a busy shared box (a 1 s compile ran past a 25 s wall cap; at load 6 even nice 10 got ~4% of a
# core). So a compile starts at nice 5 and, once it has used DEMOTE_S of CPU (ordinary compiles take well
# under a second), drops to nice 19 for the rest of its budget; a demoted worker is replaced after that job
# (an unprivileged process cannot raise its priority back).
NICE = 5
DEMOTED_NICE = 19
DEMOTE_S = 1.0
WALL_FACTOR = 10.0  # a starved worker (busy box) still gets budget * 10 + 10 s of wall time
# CPU past the budget before the service stops a worker itself: the compiler's checks overshoot by up to ~0.3 s
# and packing a large guide takes a fraction of a second, neither of which may turn an answer into a refusal
BACKSTOP_FACTOR, BACKSTOP_MIN_S = 0.5, 1.0


class CompileServiceError(RuntimeError):
    """A compile failed for a reason of the service (a worker died, workers cannot start), not of the constraint."""


_CLK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (Linux /proc), None where unavailable."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK
    except (OSError, IndexError, ValueError):
        return None


@dataclasses.dataclass
class _Job:
    job_id: int
    kind: str
    value: Any
    waiters: set = dataclasses.field(default_factory=set)
    worker: Any = None
    started: float = 0.0  # monotonic, when a worker took it
    cpu0: float | None = None
    over: bool = False  # answered (result, error, budget) or cancelled: a late reply is ignored
    unsent: int = 0  # workers found dead when this job was handed to them (it never started on those)


class _Worker:
    """One worker process and its two pipe ends (driven by the dispatcher thread only)."""

    def __init__(self, init: WorkerInit):
        r_cmd, w_cmd = os.pipe()
        r_out, w_out = os.pipe()
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p))
        # lower the priority before any import, so even the worker's startup yields the CPU to the engine
        boot = (f"import os, runpy, sys; os.nice({init.nice}); sys.argv[1:] = [{r_cmd}, {w_out}]; "
                "runpy.run_module('sglpy.runtime.engine.grammar_worker', run_name='__main__', alter_sys=True)")
        self.proc = subprocess.Popen([sys.executable, "-c", boot], pass_fds=(r_cmd, w_out), stdin=subprocess.DEVNULL,
                                     env=env)
        os.close(r_cmd)
        os.close(w_out)
        self.send_conn, self.recv_conn = Connection(w_cmd, readable=False), Connection(r_out, writable=False)
        self.ready = False
        self.job: _Job | None = None
        self.kill_at: float | None = None
        self.demoted = False  # reniced to DEMOTED_NICE during a long compile: replaced once it is free
        self.refused = 0  # file opens its sandbox refused so far
        try:  # blocks until the worker reads it (the vocabulary is megabytes); it may die meanwhile (killed, OOM)
            self.send_conn.send(init)
        except (OSError, ValueError):
            self.kill()
            raise

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.send_conn.close()
        self.recv_conn.close()


class GrammarService:
    """Compiles constraints for one tokenizer in `workers` processes; results cached (LRU) in this process."""

    def __init__(self, info: TokenizerInfo, workers: int = 2, timeout_s: float = COMPILE_TIME_S,
                 max_states: int = 20_000, cache_size: int = 128, nice: int = NICE):
        self.info, self.timeout_s, self.cache_size = info, timeout_s, cache_size
        self.backstop_s = timeout_s + max(BACKSTOP_MIN_S, BACKSTOP_FACTOR * timeout_s)
        self.wall_s = WALL_FACTOR * timeout_s + 10.0
        self.num_workers = workers
        self._cache: collections.OrderedDict[tuple, tuple[Guide, int]] = collections.OrderedDict()
        self._cache_bytes = 0
        self._lock = threading.Lock()
        self._jobs: dict[tuple, _Job] = {}  # in flight, by constraint
        self._queue: collections.deque[_Job] = collections.deque()
        self._ids = itertools.count()
        self.stats = {"compiles": 0, "cache_hits": 0, "errors": 0, "timeouts": 0, "cancelled": 0, "crashes": 0,
                      "worker_starts": 0, "refused_opens": 0, "compile_s": 0.0,
                      "pending": 0, "cached": 0}  # pending: compiles queued or running; cached: guides in the LRU
        self._closed = False
        self._threads = None
        if workers == 0:
            # threads share this process's native kernels (automata built natively; Python where they cannot load)
            self._compiler = GrammarCompiler(info, max_states=max_states, cache_size=cache_size,
                                             native_automata=native_automata())
            self._threads = ThreadPoolExecutor(2, thread_name_prefix="grammar-compile")
            return
        # the vocabulary only: the native mask walker stays here (workers compile; masks are computed in this process)
        fields = {f.name: getattr(info, f.name) for f in dataclasses.fields(info) if f.name != "walker"}
        self._init = WorkerInit(fields, max_states, timeout_s, nice)
        self._workers: list[_Worker] = []
        self._start_failures = 0  # consecutive: reset when a worker reads its vocabulary
        self._pauses = 0  # pauses since a worker last started (1 s, 2 s, 4 s ... RETRY_MAX_S)
        self._retry_at = 0.0  # after START_TRIES failed starts in a row: no start before this (monotonic)
        self._wake_r, self._wake_w = os.pipe()
        self._thread = threading.Thread(target=self._run, name="sglpy-grammar-service", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ callers (any thread)
    def compile(self, kind: str, value: Any) -> Future:
        """A Future of the Guide for (kind, value); its exception is a GrammarError (ValueError) naming the problem."""
        key = (kind, value)
        fut: Future = Future()
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                self.stats["cache_hits"] += 1
                fut.set_result(hit[0])
                return fut
            if self._threads is not None:
                self._threads.submit(self._compile_in_thread, key, fut)
                return fut
            job = self._jobs.get(key)
            if job is None:
                job = self._jobs[key] = _Job(next(self._ids), kind, value)
                self._queue.append(job)
                self.stats["pending"] = len(self._jobs)
            job.waiters.add(fut)
        fut.add_done_callback(lambda f: self._waiter_done(job, f))
        self._wake()
        return fut

    def _compile_in_thread(self, key: tuple, fut: Future) -> None:
        if not fut.set_running_or_notify_cancel():
            return
        t0 = time.perf_counter()
        try:  # the grammar package's own (wall-clock) budget is the only bound on a thread
            fut.set_result(compile_with_budget(self._compiler, CompileJob(0, key[0], key[1]), threading.Event(),
                                               self.timeout_s))
        except RecursionError:
            fut.set_exception(GrammarError(f"{key[0]} constraint is nested too deeply to compile"))
        except BudgetExceeded as e:
            self.stats["timeouts"] += 1
            fut.set_exception(e)
        except Exception as e:  # noqa: BLE001 - delivered to the caller
            fut.set_exception(e if isinstance(e, GrammarError) else GrammarError(f"{type(e).__name__}: {e}"))
        self.stats["compile_s"] += time.perf_counter() - t0

    def _waiter_done(self, job: _Job, fut: Future) -> None:
        if not fut.cancelled():
            return
        with self._lock:
            job.waiters.discard(fut)
            if job.waiters or job.over:
                return
            job.over = True
            self.stats["cancelled"] += 1
            self._jobs.pop((job.kind, job.value), None)
            self.stats["pending"] = len(self._jobs)
            if job in self._queue:
                self._queue.remove(job)
        self._wake()  # a running job is stopped by the dispatcher

    def close(self) -> None:
        """Stop the workers; pending compiles fail."""
        self._closed = True
        if self._threads is not None:
            self._threads.shutdown(wait=False, cancel_futures=True)
            return
        self._wake()
        self._thread.join(timeout=5)

    # ------------------------------------------------------------------ dispatcher thread
    def _wake(self) -> None:
        if self._threads is None:
            try:
                os.write(self._wake_w, b"x")
            except OSError:
                pass

    def _run(self) -> None:
        try:
            while not self._closed:
                self._ensure_workers()
                self._dispatch()
                busy = any(w.job is not None or w.kill_at is not None or not w.ready for w in self._workers)
                pause = max(0.0, self._retry_at - time.monotonic()) if self._retry_at else None
                timeout = 0.05 if busy else pause
                if len(self._workers) < self.num_workers and not self._retry_at:
                    timeout = 0.0  # workers were lost while dispatching: start their replacements now
                ready = wait([self._wake_r] + [w.recv_conn for w in self._workers], timeout=timeout)
                for obj in ready:
                    if obj == self._wake_r:
                        os.read(self._wake_r, 4096)
                    else:
                        w = next((w for w in self._workers if w.recv_conn is obj), None)
                        if w is not None:  # (a worker replaced earlier in this round is gone)
                            self._receive(w)
                self._check_budgets()
        except Exception:  # noqa: BLE001 - keep callers from waiting forever
            logger.exception("grammar service failed")
        finally:
            self._fail_all("the grammar compile service stopped")
            for w in self._workers:
                w.kill()

    def _ensure_workers(self) -> None:
        for w in [w for w in self._workers if w.proc.poll() is not None]:
            self._lost(w, f"the compile worker died (exit code {w.proc.returncode}) while compiling this constraint")
        while len(self._workers) < self.num_workers:
            if self._start_failures >= START_TRIES:
                # a pause, not the end: workers killed while starting (an operator, the OOM killer) come back later
                self._fail_all("constrained decoding is unavailable: the compile worker process fails to start")
                now = time.monotonic()
                if not self._retry_at:
                    self._retry_at = now + min(RETRY_MAX_S, 2.0 ** self._pauses)
                    self._pauses += 1
                if now < self._retry_at:
                    return
                self._retry_at = 0.0
                self._start_failures = START_TRIES - 1  # one try; another failure pauses again, for longer
            self.stats["worker_starts"] += 1
            try:
                self._workers.append(_Worker(self._init))
            except (OSError, ValueError) as e:  # died before it read its vocabulary: a failed start, retried
                self._start_failures += 1
                logger.warning("a compile worker died while starting (%s); starting another", e)

    def _lost(self, w: _Worker, message: str) -> None:
        """A worker exited or was killed: fail its job (if still answered by nobody) and drop it."""
        self._workers.remove(w)
        if not w.ready:
            self._start_failures += 1
        job = w.job
        w.kill()
        if job is not None and not job.over:
            self.stats["crashes"] += 1
            self._finish(job, error=message, error_type=CompileServiceError)

    def _dispatch(self) -> None:
        for w in list(self._workers):
            if not (w.ready and w.job is None and w.kill_at is None):
                continue
            with self._lock:
                job = self._queue.popleft() if self._queue else None
            if job is None:
                return
            job.worker, job.started, job.cpu0 = w, time.monotonic(), _cpu_seconds(w.proc.pid)
            w.job = job
            try:
                w.send_conn.send(CompileJob(job.job_id, job.kind, job.value))
            except (OSError, ValueError) as e:
                # the worker died between jobs (killed, or exited before its death was read): the job never
                # reached it, so it goes back to the front of the queue for the next worker, a few times at most
                job.unsent += 1
                if job.unsent < UNSENT_TRIES:
                    w.job, job.worker = None, None
                    with self._lock:
                        self._queue.appendleft(job)
                self._lost(w, f"the compile worker is gone ({e})")

    def _receive(self, w: _Worker) -> None:
        try:
            msg = w.recv_conn.recv()
        except (EOFError, OSError):
            self._lost(w, f"the compile worker died (exit code {w.proc.poll()}) while compiling this constraint")
            return
        if isinstance(msg, WorkerReady):
            w.ready, self._start_failures, self._pauses = True, 0, 0
        elif isinstance(msg, CompileDone) and w.job is not None and msg.job_id == w.job.job_id:
            job, w.job, w.kill_at = w.job, None, None
            if w.demoted:
                self._lost(w, "")  # its priority stays low: a fresh worker takes its place
            self.stats["refused_opens"] += msg.refused_opens - w.refused
            w.refused = msg.refused_opens
            self.stats["compile_s"] += msg.seconds
            if job.over:
                return
            if msg.error is not None:
                self.stats["timeouts"] += msg.over_budget
                self._finish(job, error=msg.error, error_type=BudgetExceeded if msg.over_budget else GrammarError)
                return
            try:
                guide = unpack_guide(msg.payload, self.info)
            except Exception as e:  # noqa: BLE001
                self._finish(job, error=f"the compiled guide could not be read: {type(e).__name__}: {e}",
                             error_type=CompileServiceError)
                return
            self._finish(job, guide=guide, nbytes=len(msg.payload))

    def _check_budgets(self) -> None:
        now = time.monotonic()
        for w in list(self._workers):
            job = w.job
            if w.kill_at is not None and now > w.kill_at:
                self._lost(w, "the compile was stopped")
                continue
            if job is None or w.kill_at is not None:
                continue
            if job.over:  # every waiter left
                self._stop(w, job)
                continue
            cpu = _cpu_seconds(w.proc.pid)
            used = cpu - job.cpu0 if cpu is not None and job.cpu0 is not None else now - job.started
            if used > DEMOTE_S and not w.demoted:
                w.demoted = True
                try:
                    os.setpriority(os.PRIO_PROCESS, w.proc.pid, DEMOTED_NICE)
                except (OSError, AttributeError):
                    pass
            if used > self.backstop_s or now - job.started > self.wall_s:
                self.stats["timeouts"] += 1
                self._finish(job, error=f"{job.kind} constraint ran past its compile budget ({self.timeout_s:g} s "
                                        f"of CPU; stopped at {used:.1f} s of CPU, {now - job.started:.1f} s of "
                                        "wall time): simplify it, or raise --grammar-compile-timeout",
                             error_type=BudgetExceeded)
                self._stop(w, job)

    def _stop(self, w: _Worker, job: _Job) -> None:
        w.kill_at = time.monotonic() + GRACE_S
        try:
            w.send_conn.send(CancelJob(job.job_id))
        except (OSError, ValueError):
            pass

    def _finish(self, job: _Job, guide: Guide | None = None, nbytes: int = 0, error: str | None = None,
                error_type: type[Exception] = GrammarError) -> None:
        """Answer every waiter of a job once; a guide also enters the cache."""
        with self._lock:
            if job.over:
                return
            job.over = True
            self._jobs.pop((job.kind, job.value), None)
            self.stats["pending"] = len(self._jobs)
            waiters = list(job.waiters)
            if guide is not None:
                self.stats["compiles"] += 1
                self._remember((job.kind, job.value), guide, nbytes)
            else:
                self.stats["errors"] += 1
        for fut in waiters:
            if fut.set_running_or_notify_cancel():
                if guide is not None:
                    fut.set_result(guide)
                else:
                    fut.set_exception(error_type(error))

    def _remember(self, key: tuple, guide: Guide, nbytes: int) -> None:
        if not self.cache_size:
            return
        self._cache[key] = (guide, nbytes)
        self._cache_bytes += nbytes
        while self._cache and (len(self._cache) > self.cache_size or self._cache_bytes > CACHE_BYTES):
            _, (_, n) = self._cache.popitem(last=False)
            self._cache_bytes -= n
        self.stats["cached"] = len(self._cache)

    def _fail_all(self, message: str) -> None:
        with self._lock:
            jobs = list(self._jobs.values())
            self._queue.clear()
        for job in jobs:
            self._finish(job, error=message, error_type=CompileServiceError)

"""sglang-router in front of `sglpy serve` workers for tests: free ports, readiness, and teardown that always runs.

    with router_cluster(2, "--engine-factory", FAKE) as c:      # two fake-engine workers behind the router
        requests.post(c.url + "/generate", json=...)           # c.workers: the sglpy Servers

    with run_router([worker.url]) as router: ...               # a router in front of servers you already run

The router binds 127.0.0.1 (its defaults bind 0.0.0.0:30000 and a Prometheus port 0.0.0.0:29000) and is
ready only when GET /readiness reports every worker healthy: its /health is 200 before any worker is
registered. It probes each worker with two HTTP/2 prefaces first (sglpy logs one line for each).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import requests

from ..server.replicas import router_command
from .server_harness import Server, free_port, run_server


def router_missing_reason(python: str = sys.executable) -> str | None:
    """Why `python -m sglang_router.launch_router` cannot run (None when it can)."""
    p = subprocess.run([python, "-c", "import sglang_router.launch_router"], capture_output=True, text=True,
                       timeout=120)
    if p.returncode != 0:
        tail = p.stderr.strip().splitlines()[-1] if p.stderr.strip() else str(p.returncode)
        return f"sglang-router is not installed (make venv installs sglang-router==0.3.2): {tail}"
    return None


@dataclass
class Router:
    """A running sglang-router; `url` is where clients go."""

    url: str
    proc: subprocess.Popen
    log_path: str
    worker_urls: list[str]

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextlib.contextmanager
def run_router(worker_urls: list[str], policy: str = "cache_aware", extra_args: tuple[str, ...] = (),
               python: str = sys.executable, startup_timeout: float = 120.0):
    """Yield a Router over `worker_urls` once it reports them all healthy; stop it (SIGTERM, then SIGKILL)."""
    port, metrics_port = free_port(), free_port()
    log_fd, log_path = tempfile.mkstemp(prefix="sglang-router-", suffix=".log")
    cmd = router_command("127.0.0.1", port, worker_urls, policy, metrics_port, extra_args, python)
    proc = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, "NO_COLOR": "1"})
    os.close(log_fd)
    router = Router(f"http://127.0.0.1:{port}", proc, log_path, list(worker_urls))
    try:
        deadline = time.monotonic() + startup_timeout
        while not _ready(router.url, len(worker_urls)):
            if proc.poll() is not None:
                raise RuntimeError(f"sglang-router exited with {proc.returncode}:\n{router.log()[-3000:]}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"sglang-router not ready after {startup_timeout:.0f} s:\n{router.log()[-3000:]}")
            time.sleep(0.2)
        yield router
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(5)
        with contextlib.suppress(OSError):
            os.unlink(log_path)


def _ready(url: str, n: int) -> bool:
    try:
        r = requests.get(url + "/readiness", timeout=2)
        return r.status_code == 200 and json.loads(r.text).get("healthy_workers") == n
    except (requests.RequestException, ValueError):
        return False


@dataclass
class Cluster:
    """Workers and the router in front of them."""

    router: Router
    workers: list[Server] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.router.url


@contextlib.contextmanager
def router_cluster(n: int, *server_args: str, env: dict | None = None, policy: str = "cache_aware",
                   router_args: tuple[str, ...] = (), startup_timeout: float = 300.0):
    """`n` sglpy workers (`python -m sglpy.runtime.server *server_args`) behind one sglang-router."""
    with contextlib.ExitStack() as stack:
        workers = [stack.enter_context(run_server(*server_args, env=env, startup_timeout=startup_timeout))
                   for _ in range(n)]
        router = stack.enter_context(run_router([w.url for w in workers], policy, router_args))
        yield Cluster(router, workers)

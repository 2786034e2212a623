"""`sglpy serve --dp-size N`: a launcher of N `sglpy serve` workers behind one sglang-router process (no routing of its own).

Layout: the router listens on HOST:PORT (what clients use); worker i listens on 127.0.0.1:PORT+1+i; the
router's Prometheus endpoint on 127.0.0.1:PORT+N+1. Each worker gets the launcher's flags with `--dp-size`
and `--router-policy` left out and its share of the torch threads (`--num-threads`, or the CPUs this process
may use when unset, divided by N, at least 1). With `--api-key` the router gets the key too: it then checks
clients itself and authenticates its own calls to the workers (/server_info, /model_info, /flush_cache).

Lifecycle: workers first (the launcher waits for each /health), then the router (it waits for /readiness to
count N healthy workers). SIGTERM/SIGINT: the router stops first (its grace period is
--graceful-shutdown-timeout), then every worker drains as a single server does; exit 0. A child that exits on
its own stops everything else and the launcher exits 1: restarting is left to the supervisor that runs the
launcher (systemd, Kubernetes), which sees one failed unit instead of a silently degraded one.
Children run in their own sessions, with a parent-death signal on Linux so they never outlive the launcher.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass, replace

from .config import ServerConfig, config_to_args

logger = logging.getLogger("sglpy.replicas")

ROUTER_LOG_LEVELS = {"debug": "debug", "info": "info", "warning": "warn", "error": "error"}
ANSI_COLOUR = re.compile(r"\x1b\[[0-9;]*m")
STOP_WAIT_S = 15.0  # beyond a child's own grace period, before SIGKILL


@dataclass(frozen=True)
class Child:
    """One launched process: its role name ("worker 0", "router"), URL, handle and output copier."""

    name: str
    url: str
    proc: subprocess.Popen
    pump: threading.Thread


def router_missing_reason() -> str | None:
    """Why sglang-router cannot be launched from this interpreter (None when it can)."""
    if importlib.util.find_spec("sglang_router") is None:
        return "sglang-router is not installed: pip install sglang-router==0.3.2 (or `pip install sglpy[router]`)"
    return None


# `python -m sglang_router.launch_router`, except that SGLang's own Python package is made unimportable first:
# the launcher's module imports `sglang.srt.tracing` (optional, for its --mini-lb mode only; an ImportError is
# handled), and where sglang is installed that import pulls in torch and transformers: 10 s and hundreds of MB
# per router start, measured here, for nothing the Rust router uses.
ROUTER_BOOT = ("import runpy, sys; sys.modules['sglang'] = None; "
               "runpy.run_module('sglang_router.launch_router', run_name='__main__', alter_sys=True)")


def router_command(host: str, port: int, worker_urls: list[str], policy: str, metrics_port: int,
                   extra: tuple[str, ...] = (), python: str = sys.executable) -> list[str]:
    """sglang-router's launcher over `worker_urls` (see ROUTER_BOOT), its Prometheus endpoint on loopback."""
    return [python, "-c", ROUTER_BOOT, "--host", host, "--port", str(port),
            "--prometheus-host", "127.0.0.1", "--prometheus-port", str(metrics_port), "--policy", policy,
            "--worker-urls", *worker_urls, *extra]


def worker_threads(config: ServerConfig) -> int:
    """Torch threads for each worker: the launcher's --num-threads (or usable CPUs) split N ways, at least 1."""
    total = config.engine.num_threads or len(os.sched_getaffinity(0))
    return max(1, total // config.dp_size)


def worker_args(config: ServerConfig, index: int) -> list[str]:
    """The `sglpy serve` flags of worker `index`: the launcher's own, on its loopback port and thread share."""
    one = replace(config, host="127.0.0.1", port=config.port + 1 + index, dp_size=1,
                  engine=replace(config.engine, num_threads=worker_threads(config)))
    return config_to_args(replace(one, router_policy=ServerConfig.router_policy))


def _parent_death_signal():
    """A preexec_fn that asks Linux to SIGTERM the child when the launcher dies (None elsewhere).

    libc is loaded here, before any fork: the function run in the child only makes the one prctl call."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


def _spawn(name: str, url: str, cmd: list[str]) -> Child:
    """Start `cmd`, copying its output to ours line by line with a `[name]` prefix."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            start_new_session=True, preexec_fn=_parent_death_signal())

    def pump():
        for raw in proc.stdout:  # the router colours its log even into a pipe: plain text here
            sys.stdout.write(f"[{name}] {ANSI_COLOUR.sub('', raw.decode(errors='replace'))}")
            sys.stdout.flush()

    thread = threading.Thread(target=pump, name=f"log-{name}", daemon=True)
    thread.start()
    logger.info("%s: pid %d, %s", name, proc.pid, url)
    return Child(name, url, proc, thread)


def _get(url: str, timeout: float = 2.0) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode(errors="replace")
    except OSError as e:  # URLError, HTTPError, refused, timeout
        return getattr(e, "code", 0) or 0, ""


def _port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


class Launcher:
    """Starts, watches and stops the children; `run` returns the exit code."""

    def __init__(self, config: ServerConfig):
        self.config = config
        self.children: list[Child] = []
        self.stop = threading.Event()

    def _failed_child(self) -> Child | None:
        return next((c for c in self.children if c.proc.poll() is not None), None)

    def _wait_until(self, what: str, ok, timeout: float) -> bool:
        """Poll `ok()` until true; False (logged) on timeout, a dead child or a stop signal."""
        deadline = time.monotonic() + timeout
        while not ok():
            dead = self._failed_child()
            if dead is not None:
                logger.error("%s exited with code %s while waiting for %s", dead.name, dead.proc.returncode, what)
                return False
            if self.stop.is_set():
                return False
            if time.monotonic() > deadline:
                logger.error("timed out after %.0f s waiting for %s", timeout, what)
                return False
            self.stop.wait(0.2)
        return True

    def _start(self) -> bool:
        c = self.config
        n = c.dp_size
        busy = [p for p in range(c.port, c.port + n + 2) if _port_taken(p)]
        if busy:
            logger.error("ports %s are in use (the router uses PORT, workers PORT+1..PORT+%d, the router's "
                         "metrics PORT+%d)", busy, n, n + 1)
            return False
        for i in range(n):
            args = worker_args(c, i)
            url = f"http://127.0.0.1:{c.port + 1 + i}"
            self.children.append(_spawn(f"worker {i}", url, [sys.executable, "-m", "sglpy.runtime.server", *args]))
        workers = list(self.children)
        if not self._wait_until("the workers' /health", lambda: all(_get(w.url + "/health")[0] == 200
                                                                       for w in workers),
                                c.engine_startup_timeout + 60):
            return False
        extra = ("--log-level", ROUTER_LOG_LEVELS[c.log_level],
                 "--shutdown-grace-period-secs", str(max(1, round(c.graceful_shutdown_timeout))))
        if c.api_key:
            extra += ("--api-key", c.api_key)
        host = "127.0.0.1" if c.host in ("0.0.0.0", "::") else c.host
        url = f"http://{f'[{host}]' if ':' in host else host}:{c.port}"
        cmd = router_command(c.host, c.port, [w.url for w in workers], c.router_policy, c.port + n + 1, extra)
        self.children.append(_spawn("router", url, cmd))

        def ready():
            status, body = _get(url + "/readiness")
            with contextlib.suppress(ValueError, AttributeError):
                return status == 200 and json.loads(body).get("healthy_workers") == n
            return False

        if not self._wait_until("the router's /readiness", ready, 120):
            return False
        logger.info("ready: %d workers behind sglang-router on %s (policy %s)", n, url, c.router_policy)
        return True

    def _stop_all(self) -> None:
        """Router first (no new requests), then the workers drain; SIGKILL whatever outlives its grace."""
        router = [c for c in self.children if c.name == "router"]
        workers = [c for c in self.children if c.name != "router"]
        grace = self.config.graceful_shutdown_timeout + STOP_WAIT_S
        for group in (router, workers):
            for c in group:
                if c.proc.poll() is None:
                    c.proc.send_signal(signal.SIGTERM)
            deadline = time.monotonic() + grace
            for c in group:
                try:
                    c.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    logger.warning("%s did not stop within %.0f s: killing it", c.name, grace)
                    c.proc.kill()
                    c.proc.wait(5)
        for c in self.children:  # their last lines ("stopped") before ours
            c.pump.join(2.0)

    def run(self) -> int:
        """Launch, watch until a stop signal (exit 0) or a child's death (exit 1), then stop everything."""
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: self.stop.set())
        code = 1
        try:
            if self._start():
                while not self.stop.wait(0.5):
                    dead = self._failed_child()
                    if dead is not None:
                        logger.error("%s exited with code %s: stopping the others", dead.name, dead.proc.returncode)
                        break
                else:
                    code = 0
            elif self.stop.is_set() and self._failed_child() is None:
                code = 0  # a stop signal during startup
            logger.info("shutting down")
        finally:
            self._stop_all()
        logger.info("stopped")
        return code


def launch(config: ServerConfig) -> int:
    """Run `config.dp_size` workers behind sglang-router until stopped; the process exit code."""
    reason = router_missing_reason()
    if reason:
        logger.error("--dp-size %d needs sglang-router: %s", config.dp_size, reason)
        return 2
    return Launcher(config).run()

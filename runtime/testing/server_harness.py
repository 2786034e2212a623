"""Start `python -m sglpy.runtime.server` on a free loopback port for a test, and always stop it."""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

import requests

FAKE = "sglpy.runtime.testing.fake_engine:FakeEngine"  # an --engine-factory importable from anywhere


def free_port() -> int:
    """A TCP port that was free a moment ago on the loopback interface."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    url: str
    proc: subprocess.Popen
    log_path: pathlib.Path
    api_key: str | None = None
    final_log: str | None = None  # kept after the log file is deleted

    def log(self) -> str:
        if self.final_log is not None:
            return self.final_log
        return self.log_path.read_text(errors="replace")

    @property
    def headers(self) -> dict:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def get(self, path: str, **kw):
        return requests.get(self.url + path, headers={**self.headers, **kw.pop("headers", {})}, timeout=60, **kw)

    def post(self, path: str, json=None, **kw):
        return requests.post(self.url + path, json=json, headers={**self.headers, **kw.pop("headers", {})},
                             timeout=kw.pop("timeout", 120), **kw)

    def sigterm(self, timeout: float = 30.0) -> int:
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)


@contextlib.contextmanager
def run_server(*args: str, env: dict | None = None, startup_timeout: float = 180.0, api_key: str | None = None,
               new_session: bool = False, cwd: str | None = None):
    """Yield a running Server (ready: /health is 200); terminate it (then kill) on exit. cwd: its working folder."""
    port = free_port()
    cmd = [sys.executable, "-m", "sglpy.runtime.server", "--host", "127.0.0.1", "--port", str(port), *args]
    if api_key:
        cmd += ["--api-key", api_key]
    full_env = {**os.environ, **(env or {})}
    log_fd, log_name = tempfile.mkstemp(prefix="sglpy-server-", suffix=".log")
    proc = subprocess.Popen(cmd, stdout=log_fd, stderr=subprocess.STDOUT, env=full_env, start_new_session=new_session,
                            cwd=cwd)
    os.close(log_fd)
    server = Server(f"http://127.0.0.1:{port}", proc, pathlib.Path(log_name), api_key)
    try:
        deadline = time.monotonic() + startup_timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited with {proc.returncode} during startup:\n{server.log()}")
            try:
                if requests.get(server.url + "/health", timeout=2).status_code == 200:
                    break
            except requests.ConnectionError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"server not healthy after {startup_timeout:.0f} s:\n{server.log()}")
            time.sleep(0.1)
        yield server
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
        with contextlib.suppress(OSError):
            server.final_log = server.log()
            os.unlink(log_name)


def sse_events(resp) -> list:
    """Parse an SSE response body into JSON objects (and the literal "[DONE]")."""
    import json

    events = []
    for line in resp.iter_lines(decode_unicode=True):
        if line and line.startswith("data: "):
            data = line[len("data: "):]
            events.append(data if data == "[DONE]" else json.loads(data))
    return events

"""`sglpy serve --dp-size N` (runtime/server/replicas.py): flags, the workers' arguments, and a real launch of two
fake-engine workers behind sglang-router: serving, a clean SIGTERM, and a dead worker ending the launcher."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.server import replicas
from sglpy.runtime.server.config import ServerConfig, config_from_args, config_to_args
from sglpy.runtime.testing.server_harness import FAKE


def test_dp_flags_map_onto_the_config_and_are_validated():
    cfg = config_from_args(["--dp-size", "2", "--router-policy", "round_robin"])
    assert (cfg.dp_size, cfg.router_policy) == (2, "round_robin")
    assert config_from_args([]).dp_size == 1  # --dp-size 1 = one server, as before
    for kwargs, name in (({"dp_size": 0}, "dp_size"), ({"router_policy": "fastest"}, "router_policy"),
                         ({"dp_size": 4, "port": 65533}, "port")):
        with pytest.raises(ValueError, match=name):
            ServerConfig(**kwargs)


@pytest.mark.parametrize("argv", [[], ["--port", "31000", "--api-key", "k", "--no-log-requests", "--num-threads", "3",
                                       "--graceful-shutdown-timeout", "2.5", "--max-context-len", "256",
                                       "--dp-size", "2", "--router-policy", "power_of_two"]])
def test_config_to_args_round_trips(argv):
    cfg = config_from_args(argv)
    assert config_from_args(config_to_args(cfg)) == cfg


def test_each_worker_gets_the_launcher_flags_on_its_port_and_thread_share():
    cfg = ServerConfig(host="0.0.0.0", port=31000, dp_size=2, router_policy="round_robin", api_key="k",
                       engine=EngineConfig(num_threads=5, max_total_tokens=2048))
    w1 = config_from_args(replicas.worker_args(cfg, 1))
    assert (w1.host, w1.port, w1.dp_size, w1.router_policy, w1.api_key) == ("127.0.0.1", 31002, 1, "cache_aware", "k")
    assert w1.engine == EngineConfig(num_threads=2, max_total_tokens=2048)  # 5 threads // 2 workers
    one = ServerConfig(port=31000, dp_size=4, engine=EngineConfig(num_threads=2))
    assert replicas.worker_threads(one) == 1  # never 0
    assert replicas.worker_threads(ServerConfig(dp_size=2)) == max(1, len(os.sched_getaffinity(0)) // 2)


def test_missing_router_is_a_clear_error(monkeypatch, caplog):
    monkeypatch.setattr(replicas, "router_missing_reason", lambda: "sglang-router is not installed: pip install it")
    assert replicas.launch(ServerConfig(dp_size=2, port=31000)) == 2
    assert "needs sglang-router" in caplog.text


# ---------------------------------------------------------------- a real launch


def _base_port(n: int) -> int:
    """A port P with P..P+n+1 free on loopback."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        if p + n + 1 < 65536 and all(_free(q) for q in range(p, p + n + 2)):
            return p
    raise RuntimeError("no run of free ports")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


class Launched:
    def __init__(self, *args: str):
        self.port = _base_port(2)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_file = tempfile.NamedTemporaryFile("w+", prefix="sglpy-dp-", suffix=".log", delete=False)
        self.proc = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--port", str(self.port),
                                      "--dp-size", "2", "--engine-factory", FAKE, "--graceful-shutdown-timeout",
                                      "3", *args], stdout=self.log_file, stderr=subprocess.STDOUT,
                                     env={**os.environ, "SGLPY_FAKE_TOKEN_DELAY": "0.01"})

    def log(self) -> str:
        with open(self.log_file.name, errors="replace") as f:
            return f.read()

    def wait_ready(self, timeout: float = 180.0):
        deadline = time.monotonic() + timeout
        while "sglpy.replicas INFO ready:" not in self.log():
            assert self.proc.poll() is None, f"launcher exited with {self.proc.returncode}:\n{self.log()[-3000:]}"
            assert time.monotonic() < deadline, self.log()[-3000:]
            time.sleep(0.2)

    def child_pids(self) -> dict[str, int]:
        return {m[0]: int(m[1]) for m in re.findall(r"sglpy\.replicas INFO (worker \d|router): pid (\d+)", self.log())}

    def close(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)
        for pid in self.child_pids().values():  # never leave children behind, whatever the test did
            _kill_group(pid)
        os.unlink(self.log_file.name)


def _kill_group(pid: int):
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:  # a zombie (exited, not yet reaped) is not alive
        return f.read().split(")")[-1].split()[0] != "Z"


def _wait_gone(pids, timeout=30.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if _alive(p)]


@pytest.fixture
def launched():
    reason = replicas.router_missing_reason()
    if reason:
        pytest.skip(reason)
    la = Launched("--num-threads", "4", "--router-policy", "round_robin")
    try:
        la.wait_ready()
        yield la
    finally:
        la.close()


def test_dp2_serves_through_the_router_on_both_workers_and_stops_cleanly(launched):
    pids = launched.child_pids()
    assert set(pids) == {"worker 0", "worker 1", "router"}
    workers = requests.get(launched.url + "/workers", timeout=30).json()["workers"]
    urls = sorted(w["url"] for w in workers)
    assert urls == [f"http://127.0.0.1:{launched.port + 1}", f"http://127.0.0.1:{launched.port + 2}"]
    for u in urls:  # each worker: one DP rank with half the threads
        info = requests.get(u + "/get_server_info", timeout=30).json()
        assert (info["num_threads"], info["dp_size"]) == (2, 1)
    with ThreadPoolExecutor(8) as pool:  # round_robin (--router-policy) alternates between the workers
        outs = list(pool.map(lambda i: requests.post(launched.url + "/generate", json={
            "text": f"distinct prompt {i}", "rid": f"dp-{i}", "sampling_params": {"max_new_tokens": 20}},
            timeout=60), range(8)))
    assert [r.status_code for r in outs] == [200] * 8
    log = launched.log()
    assert "[worker 0]" in log and "[worker 1]" in log  # child output arrives prefixed
    served = [sum(f"rid=dp-{i} " in line for i in range(8) for line in log.splitlines() if line.startswith(w))
              for w in ("[worker 0]", "[worker 1]")]
    assert served == [4, 4], served
    with ThreadPoolExecutor(1) as pool:  # a request in flight when SIGTERM arrives still completes
        long = pool.submit(requests.post, launched.url + "/generate", json={
            "text": "in flight", "sampling_params": {"max_new_tokens": 150}}, timeout=60)
        time.sleep(0.3)
        launched.proc.send_signal(signal.SIGTERM)
        assert long.result().status_code == 200 and long.result().json()["meta_info"]["completion_tokens"] == 150
    assert launched.proc.wait(60) == 0
    assert _wait_gone(list(pids.values())) == []
    assert "sglpy.replicas INFO stopped" in launched.log()


def test_a_dead_worker_stops_the_launcher_with_a_non_zero_exit(launched):
    pids = launched.child_pids()
    _kill_group(pids["worker 1"])  # the worker and its engine process
    assert launched.proc.wait(60) == 1
    assert "worker 1 exited with code -9: stopping the others" in launched.log()
    assert _wait_gone([pids["worker 0"], pids["router"]]) == []


def test_a_busy_port_is_a_clear_error_before_anything_starts():
    if replicas.router_missing_reason():
        pytest.skip(replicas.router_missing_reason())
    port = _base_port(2)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port + 2))
        taken.listen()
        p = subprocess.run([sys.executable, "-m", "sglpy.runtime.server", "--port", str(port), "--dp-size", "2",
                            "--engine-factory", FAKE], capture_output=True, text=True, timeout=120)
    assert p.returncode == 1
    assert f"ports [{port + 2}] are in use" in p.stderr + p.stdout and "worker 0: pid" not in p.stderr + p.stdout

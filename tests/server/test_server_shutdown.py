"""SIGTERM at every moment ends the server and every process of its group within --graceful-shutdown-timeout + 5 s.

Idle, under load (streams still running and clients that stopped reading), while the engine starts, with an engine
whose step loop hangs. (During an engine restart: test_server_supervisor.py; during a compile:
test_server_hostile.py.) Each signal goes to the whole process group, as a terminal's Ctrl-C or a container stop.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import requests

from sglpy.runtime.testing.server_harness import FAKE, free_port, run_server

GRACE = 2.0
LIMIT = GRACE + 5
ARGS = ("--engine-factory", FAKE, "--graceful-shutdown-timeout", str(GRACE))


def group_alive(pgid: int) -> bool:
    return subprocess.run(["pgrep", "-g", str(pgid)], capture_output=True).returncode == 0


def sigterm_group_and_wait(proc) -> float:
    """SIGTERM the process group; seconds until the server exited 0 and no process of its group is left."""
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(LIMIT) == 0
    while group_alive(proc.pid):
        assert time.monotonic() - t0 < LIMIT, "a process of the server's group outlived the shutdown bound"
        time.sleep(0.05)
    took = time.monotonic() - t0
    assert took < LIMIT, took
    return took


def test_sigterm_when_idle():
    with run_server(*ARGS, new_session=True) as s:
        sigterm_group_and_wait(s.proc)


def slow_reader(url: str) -> socket.socket:
    """A client that starts a long stream and never reads it."""
    host, port = url.split("//")[1].split(":")
    sock = socket.create_connection((host, int(port)))
    body = json.dumps({"text": "story", "stream": True, "sampling_params": {"max_new_tokens": 4000,
                                                                             "ignore_eos": True}}).encode()
    sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
    return sock


def test_sigterm_under_load_with_clients_that_stopped_reading():
    env = {"SGLPY_FAKE_TOKEN_DELAY": "0.003"}
    with run_server(*ARGS, env=env, new_session=True) as s:
        readers = [slow_reader(s.url) for _ in range(3)]
        ends = []

        def stream():
            r = requests.post(s.url + "/generate", json={"text": "go", "stream": True, "sampling_params": {
                "max_new_tokens": 4000, "ignore_eos": True}}, stream=True, timeout=60)
            ends.append([line for line in r.iter_lines() if line][-2:])

        threads = [threading.Thread(target=stream) for _ in range(4)]
        for t in threads:
            t.start()
        time.sleep(2.0)  # the unread streams' cumulative events fill their sockets' buffers
        assert s.get("/get_server_info").json()["num_inflight_requests"] == 7
        sigterm_group_and_wait(s.proc)
        for t in threads:
            t.join(10)
        assert len(ends) == 4
        for last_two in ends:  # the reading clients got their stream's end: an abort, then [DONE]
            assert last_two[1] == b"data: [DONE]"
            assert json.loads(last_two[0][6:])["meta_info"]["finish_reason"]["type"] == "abort"
        for r in readers:
            r.close()


def test_sigterm_while_the_engine_starts():
    port = free_port()
    env = {**os.environ, "SGLPY_FAKE_STARTUP_DELAY": "60"}
    proc = subprocess.Popen([sys.executable, "-m", "sglpy.runtime.server", "--port", str(port), *ARGS], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:  # bound, engine loading
            try:
                if requests.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 503:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.1)
        time.sleep(0.5)
        sigterm_group_and_wait(proc)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)


def test_sigterm_with_a_hung_engine_kills_it_in_time():
    with run_server(*ARGS, new_session=True) as s:
        def hang():
            try:
                requests.post(s.url + "/generate", json={"text": "__hang__"}, timeout=30)
            except requests.RequestException:  # the server closes it: what this test is about
                pass

        threading.Thread(target=hang, daemon=True).start()
        time.sleep(1.0)  # its step loop blocks forever: the engine cannot finish or stop
        sigterm_group_and_wait(s.proc)
    assert "killing it" in s.log()

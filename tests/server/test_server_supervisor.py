"""Engine supervision and liveness against the fake engine: restarts after death, bounded retries, stall detection."""

import asyncio
import os
import re
import signal
import subprocess
import threading
import time
import types

from sglpy.runtime.server.metrics import ServerMetrics
from sglpy.runtime.server.supervisor import supervise
from sglpy.runtime.testing.server_harness import FAKE, run_server

ENV = {"SGLPY_FAKE_TOKEN_DELAY": "0.01"}


def assert_error(resp, status, *words):
    assert resp.status_code == status, resp.text
    msg = resp.json()["error"]["message"]
    for w in words:
        assert w in msg, msg
    return msg


def wait_health(s, status, timeout=60.0):
    deadline = time.monotonic() + timeout
    while True:
        r = s.get("/health")
        if r.status_code == status:
            return r
        assert time.monotonic() < deadline, f"/health stayed {r.status_code}: {r.text}"
        time.sleep(0.05)


def metric(text, name):
    m = re.search(rf"^{re.escape(name)}{{[^}}]*}} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def test_a_dead_engine_is_restarted_and_serves_again():
    with run_server("--engine-factory", FAKE, env=ENV) as s:
        pid = s.get("/get_server_info").json()["engine_pid"]
        slow = {}

        def long_request():
            slow["resp"] = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 1000}})

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(0.3)
        died = s.post("/generate", {"text": "__die__"})
        assert_error(died, 503, "engine")
        t.join(10)
        assert not t.is_alive(), "in-flight request hung after the engine died"
        assert_error(slow["resp"], 503, "exit code 3")  # failed cleanly, naming why
        # retryable, and the client is told when (the engine's death reaches the handler as an EngineError)
        assert died.headers["Retry-After"] == slow["resp"].headers["Retry-After"] == "1"
        r = wait_health(s, 200)
        assert r.headers["X-Engine-Restarts"] == "1"
        ok = s.post("/generate", {"text": "again", "sampling_params": {"max_new_tokens": 3}})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 3
        info = s.get("/get_server_info").json()
        assert info["engine_restarts"] == 1 and info["engine_pid"] != pid
        text = s.get("/metrics").text
        assert metric(text, "sglpy:engine_restarts_total") == 1.0 and metric(text, "sglang:engine_up") == 1.0
    assert "engine restarted" in s.log()


def test_a_restart_loads_the_model_in_the_standby_process():
    with run_server("--engine-factory", FAKE, env=ENV) as s:
        info = s.get("/get_server_info").json()
        spare = info["engine_standby_pid"]
        assert spare and spare != info["engine_pid"]
        os.kill(info["engine_pid"], signal.SIGKILL)
        time.sleep(0.5)
        wait_health(s, 200)
        info = s.get("/get_server_info").json()
        assert info["engine_pid"] == spare  # the spare became the engine
        assert info["engine_standby_pid"] not in (None, spare)  # and a new spare waits
        assert s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        os.kill(info["engine_standby_pid"], signal.SIGKILL)  # a dead spare: the next restart starts afresh
        os.kill(info["engine_pid"], signal.SIGKILL)
        time.sleep(0.5)
        wait_health(s, 200)
        assert s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
    assert s.log().count("engine restarted") == 2


def test_a_model_standby_serves_again_without_loading():
    # every engine start takes 8 s here; the model standby did its start while the engine served
    env = {**ENV, "SGLPY_FAKE_STARTUP_DELAY": "8"}
    with run_server("--engine-factory", FAKE, "--engine-standby", "model", env=env) as s:
        deadline = time.monotonic() + 30
        while not s.get("/get_server_info").json()["engine_standby_pid"]:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        time.sleep(8.5)  # the spare has built its engine
        info = s.get("/get_server_info").json()
        t0 = time.monotonic()
        os.kill(info["engine_pid"], signal.SIGKILL)
        time.sleep(0.2)
        wait_health(s, 200)
        assert time.monotonic() - t0 < 6.0  # no 8 s start (a loaded box takes seconds to notice and switch)
        assert s.get("/get_server_info").json()["engine_pid"] == info["engine_standby_pid"]
        assert s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_no_standby_when_off():
    with run_server("--engine-factory", FAKE, "--engine-standby", "off", env=ENV) as s:
        assert s.get("/get_server_info").json()["engine_standby_pid"] is None


def test_the_standby_modes_agree_with_the_flag_choices():
    from sglpy.runtime.server.config import STANDBY_CHOICES
    from sglpy.runtime.server.engine_process import STANDBY_MODES

    assert STANDBY_CHOICES == STANDBY_MODES


def test_a_dead_step_loop_is_restarted_too():
    with run_server("--engine-factory", FAKE, env=ENV) as s:
        assert_error(s.post("/generate", {"text": "__stall__"}), 503, "exit code 70")
        wait_health(s, 200)
        assert s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 2}}).status_code == 200


def test_restart_attempts_are_bounded(tmp_path):
    flag = tmp_path / "fail"
    env = {**ENV, "SGLPY_FAKE_STARTUP_FAIL_IF": str(flag)}
    with run_server("--engine-factory", FAKE, "--engine-restart-attempts", "2", "--engine-restart-backoff", "0.1",
                    env=env) as s:
        flag.write_text("x")  # from now on the engine cannot start
        assert_error(s.post("/generate", {"text": "__die__"}), 503)
        deadline = time.monotonic() + 60
        while "restart attempts failed" not in s.get("/health").text:
            assert time.monotonic() < deadline, s.get("/health").text
            time.sleep(0.1)
        assert_error(s.get("/health"), 503, "2 restart attempts failed")
        assert_error(s.post("/generate", {"text": "x"}), 503)
        assert s.proc.poll() is None
    assert s.log().count("engine restart attempt") == 2


def test_no_restart_when_disabled():
    with run_server("--engine-factory", FAKE, "--engine-restart-attempts", "0", env=ENV) as s:
        assert_error(s.post("/generate", {"text": "__die__"}), 503)
        time.sleep(1.0)
        assert_error(s.get("/health"), 503, "exit code 3")


def test_health_reports_a_stuck_step_loop_but_not_an_idle_one():
    with run_server("--engine-factory", FAKE, "--health-stall-timeout", "3", env=ENV) as s:
        time.sleep(5)  # idle longer than the stall timeout: still healthy
        assert s.get("/health").status_code == 200

        def hang():
            try:
                s.post("/generate", {"text": "__hang__", "sampling_params": {"max_new_tokens": 5}}, timeout=30)
            except Exception:  # noqa: BLE001 - the server is killed under it
                pass

        threading.Thread(target=hang, daemon=True).start()
        r = wait_health(s, 503, timeout=60)
        assert "no progress" in r.json()["error"]["message"]
        assert metric(s.get("/metrics").text, "sglpy:engine_stalled") == 1.0
        s.proc.kill()  # a stuck engine cannot drain; not what this test is about


def test_no_engine_is_started_once_shutdown_began():
    # SIGTERM to the process group during a restart kills the engine being started; that failure can reach the
    # supervisor before its cancellation does (wait_for then raises the start's error), so it must not retry.
    starts = []

    async def run():
        died = asyncio.Event()
        cfg = types.SimpleNamespace(engine_restart_attempts=3, engine_restart_backoff=0.01, engine_startup_timeout=5)

        async def start(timeout):
            starts.append(timeout)
            state.draining = True  # the SIGTERM arrived meanwhile
            raise RuntimeError("engine failed to start: engine process exited (exit code -15)")

        engine = types.SimpleNamespace(died=died, dead_reason="exit code -9", start=start)
        state = types.SimpleNamespace(config=cfg, engine=engine, draining=False, engine_started_at=0.0,
                                      restarting=None, engine_restarts=0, metrics=ServerMetrics("m"))
        died.set()
        await asyncio.wait_for(supervise(state), 5)
        assert state.restarting is None

    asyncio.run(run())
    assert len(starts) == 1


def test_sigterm_to_the_group_during_a_restart_ends_every_process():
    env = {**ENV, "SGLPY_FAKE_STARTUP_DELAY": "2"}
    with run_server("--engine-factory", FAKE, "--graceful-shutdown-timeout", "2", env=env, new_session=True) as s:
        os.kill(s.get("/get_server_info").json()["engine_pid"], signal.SIGKILL)
        assert "restarting" in wait_health(s, 503, timeout=10).text or "exit code -9" in s.get("/health").text
        time.sleep(0.3)  # the new engine is loading
        t0 = time.monotonic()
        os.killpg(s.proc.pid, signal.SIGTERM)
        assert s.proc.wait(2 + 5) == 0
        assert time.monotonic() - t0 < 2 + 5
        deadline = time.monotonic() + 3
        while subprocess.run(["pgrep", "-g", str(s.proc.pid)], capture_output=True).returncode == 0:
            assert time.monotonic() < deadline, "a process of the server's group outlived it"
            time.sleep(0.1)
    assert "engine restarted" not in s.log()

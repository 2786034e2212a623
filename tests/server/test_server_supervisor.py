"""Engine supervision and liveness against the fake engine: restarts after death, bounded retries, stall detection."""

import re
import threading
import time

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
        assert_error(s.post("/generate", {"text": "__die__"}), 503, "engine")
        t.join(10)
        assert not t.is_alive(), "in-flight request hung after the engine died"
        assert_error(slow["resp"], 503, "exit code 3")  # failed cleanly, naming why
        r = wait_health(s, 200)
        assert r.headers["X-Engine-Restarts"] == "1"
        ok = s.post("/generate", {"text": "again", "sampling_params": {"max_new_tokens": 3}})
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 3
        info = s.get("/get_server_info").json()
        assert info["engine_restarts"] == 1 and info["engine_pid"] != pid
        text = s.get("/metrics").text
        assert metric(text, "sglpy:engine_restarts_total") == 1.0 and metric(text, "sglang:engine_up") == 1.0
    assert "engine restarted" in s.log()


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

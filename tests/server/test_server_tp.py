"""`sglpy serve --tp 2` on the tiny model: it serves, reports its ranks, and a killed rank takes the engine down
(the request in flight fails cleanly, never hangs) until the supervisor restarts the whole group."""

import os
import signal
import threading
import time

from sglpy.runtime.testing.server_harness import run_server


def _wait_restarted(s, timeout=120.0):
    """/health once it is 200 again after one engine restart; also whether a 503 was seen on the way."""
    deadline, saw_503 = time.monotonic() + timeout, False
    while True:
        r = s.get("/health")
        saw_503 |= r.status_code == 503
        if r.status_code == 200 and r.headers.get("X-Engine-Restarts") == "1":
            return r, saw_503
        assert time.monotonic() < deadline, f"/health stayed {r.status_code}: {r.text}"
        time.sleep(0.1)


def test_tp2_server_serves_and_restarts_after_a_rank_dies(tiny_model_path):
    args = ("--model", tiny_model_path, "--tp", "2", "--num-threads", "1", "--max-total-tokens", "16384",
            "--grammar-workers", "0")
    with run_server(*args) as s:
        body = {"text": "The capital of France is", "sampling_params": {"max_new_tokens": 8, "temperature": 0}}
        first = s.post("/generate", body)
        assert first.status_code == 200 and len(first.json()["output_ids"]) == 8
        info = s.get("/get_server_info").json()
        assert info["tp_size"] == 2 and len(info["tp_rank_pids"]) == 1
        rank1 = info["tp_rank_pids"][0]
        slow = {}

        def long_request():
            slow["resp"] = s.post("/generate", {"text": "x", "sampling_params": {
                "max_new_tokens": 1800, "ignore_eos": True, "temperature": 0}})

        t = threading.Thread(target=long_request)
        t.start()
        time.sleep(1.0)
        os.kill(rank1, signal.SIGKILL)
        t.join(60)
        assert not t.is_alive(), "the request in flight hung after a rank died"
        r = slow["resp"]
        if r.status_code == 200:  # the step loop aborted it before the process exited
            assert r.json()["meta_info"]["finish_reason"]["type"] == "abort", r.text
        else:
            assert r.status_code == 503, r.text
        _wait_restarted(s)
        again = s.post("/generate", body)
        assert again.status_code == 200 and again.json()["output_ids"] == first.json()["output_ids"]
        assert s.get("/get_server_info").json()["tp_rank_pids"] != [rank1]
    assert "tensor-parallel" in s.log()


def test_rank_dying_while_idle_makes_the_server_unhealthy(tiny_model_path):
    args = ("--model", tiny_model_path, "--tp", "2", "--num-threads", "1", "--max-total-tokens", "4096",
            "--grammar-workers", "0", "--engine-restart-attempts", "0")
    with run_server(*args) as s:
        os.kill(s.get("/get_server_info").json()["tp_rank_pids"][0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while s.get("/health").status_code != 503:  # noticed with no request running (rank liveness)
            assert time.monotonic() < deadline, "/health stayed 200 after a rank died"
            time.sleep(0.1)
        r = s.post("/generate", {"text": "hi", "sampling_params": {"max_new_tokens": 2}})
        assert r.status_code == 503, r.text

"""benchmarks/storm.py end to end with small numbers (tiny model): every fault once, honest clients notice nothing.

A few honest clients, about 10% hostile requests, one engine kill -9, one compile-worker kill -9 mid-compile, one
burst past the queue, idle connections closed by the keep-alive timeout; --check fails the run on any honest request
lost, hung or refused without Retry-After, any hostile request answered other than as documented, KV not drained,
a file opened, or a shutdown past its bound. Latency ratios are the benchmark's business, not this test's.
"""

import json
import os
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_storm_small(tiny_model_path, tmp_path):
    out = tmp_path / "storm.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "storm.py"), "--minutes", "0.4", "--control-minutes", "0.1",
           "--clients", "4", "--burst", "120", "--idle-connections", "40", "--max-tokens", "8",
           "--graceful-shutdown-timeout", "3", "--json", str(out), "--check",
           f"--server-arg=--model={tiny_model_path}", "--server-arg=--max-total-tokens=4096",
           "--server-arg=--max-running-requests=16", "--server-arg=--max-queued-requests=32",
           "--server-arg=--timeout-keep-alive=8", "--server-arg=--grammar-compile-timeout=3"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=400, env=os.environ)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-3000:]
    r = json.loads(out.read_text())
    assert r["failed_targets"] == []
    events = {e["event"]: e for e in r["faults"]}
    assert set(events) == {"kill -9 engine", "kill -9 compile worker", "burst of 120"}
    assert events["kill -9 engine"]["first_status"] == 503 and r["engine_restarts"] == 1
    assert events["kill -9 compile worker"]["victim_status"] == 503
    assert "503" in events["burst of 120"]["statuses"]  # 120 at once past 16 running + 32 queued
    assert r["honest_fates"]["control"].get("ok", 0) > 0 and r["honest_fates"]["storm"].get("ok", 0) > 0
    assert r["hostile_requests"] > 0 and not r["hostile_undocumented"]
    assert r["idle_connections"]["closed_by_server"] == r["idle_connections"]["opened"] == 40
    assert r["after_drain"]["inflight"] == 0 and r["audit_opens"] == []
    assert r["shutdown"]["exit_code"] == 0 and r["shutdown"]["left"] == []

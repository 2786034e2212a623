"""benchmarks/serving.py end to end on the fake engine (keeps the benchmark runnable; numbers are not checked)."""

import json
import os
import pathlib
import subprocess
import sys

from sglpy.runtime.testing.server_harness import FAKE

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_serving_benchmark_smoke(tmp_path):
    out = tmp_path / "serving.json"
    env = {**os.environ, "SGLPY_FAKE_TOKEN_DELAY": "0.002"}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "serving.py"), "--rates", "2,8", "--duration", "1.5",
                           "--output-len", "4", "--server-arg=--engine-factory=" + FAKE, "--out", str(out)],
                          capture_output=True, text=True, timeout=180, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())["rows"]
    assert [(r["cache"], r["offered_rps"]) for r in rows] == [("on", 2.0), ("on", 8.0), ("off", 2.0), ("off", 8.0)]
    assert all(r["errors"] == 0 and r["requests"] >= 1 and r["ttft_p50"] > 0 for r in rows)
    assert all(r["health_p50_ms"] > 0 and r["health_max_ms"] >= r["health_p50_ms"] for r in rows)
    assert "cache on:" in proc.stdout and "cache off:" in proc.stdout
    assert pathlib.Path(out.with_suffix(".svg")).read_text().startswith("<svg")

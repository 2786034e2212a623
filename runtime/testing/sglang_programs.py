"""Run sglpy's frontend test programs through SGLang's own frontend package (`import sglang`) against a server URL.

The programs of `sglpy.testing_programs` call the module-global `sgl`; a fresh copy of that module with
`sgl` bound to `sglang` runs them on SGLang's `RuntimeEndpoint` unchanged. All programs run in one child
process (SGLang's import is slow), each in its own daemon thread with a time limit: SGLang's interpreter
can hang after a backend error (its worker thread exits and a later sync waits forever), which must
show up as TIMEOUT, not block the test run. The child prints one `RESULT {...}` line per program.

    python -m sglpy.runtime.testing.sglang_programs --url http://127.0.0.1:30000 [--timeout 120] [NAME ...]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass

# Programs that need constrained decoding (regex / json_schema): the fake engine refuses them.
CONSTRAINED = ("decode_int", "decode_json_regex", "json_schema", "tool_use", "regex", "dtype_gen")
IMPORT_CHECK = "import sglang, sglang.lang.backend.runtime_endpoint; from sglang import RuntimeEndpoint"


@dataclass(frozen=True)
class ProgramResult:
    """One program's outcome: PASS, FAIL (AssertionError), ERROR (another exception) or TIMEOUT."""

    name: str
    outcome: str
    seconds: float
    error: str = ""


def sglang_missing_reason(python: str = sys.executable) -> str | None:
    """Why SGLang's frontend cannot be imported by `python` (None when it can)."""
    if python == sys.executable and importlib.util.find_spec("sglang") is None:
        return "SGLang's frontend is not installed (make venv installs sglang==0.5.23 --no-deps)"
    p = subprocess.run([python, "-c", IMPORT_CHECK], capture_output=True, text=True, timeout=300)
    if p.returncode != 0:
        return f"SGLang's frontend does not import: {p.stderr.strip().splitlines()[-1] if p.stderr.strip() else p.returncode}"
    return None


def run_programs(url: str, names: list[str], timeout: float = 120.0, python: str = sys.executable,
                 api_key: str | None = None) -> dict[str, ProgramResult]:
    """Run `names` (keys of sglpy.testing_programs.PROGRAMS) through SGLang's frontend against `url`."""
    cmd = [python, "-m", "sglpy.runtime.testing.sglang_programs", "--url", url, "--timeout", str(timeout), *names]
    env = {**os.environ, **({"SGLANG_API_KEY_FOR_TEST": api_key} if api_key else {})}
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout * len(names) + 300, env=env)
        out, err = p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        err = "the runner itself timed out"
    results = {}
    for line in out.splitlines():
        if line.startswith("RESULT "):
            r = ProgramResult(**json.loads(line[len("RESULT "):]))
            results[r.name] = r
    for name in names:
        results.setdefault(name, ProgramResult(name, "ERROR", 0.0, f"no result from the runner: {err[-1500:]}"))
    return results


def _programs_on_sglang():
    """A fresh copy of sglpy.testing_programs whose `sgl` is SGLang's frontend."""
    import sglang

    spec = importlib.util.find_spec("sglpy.testing_programs")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.sgl = sglang
    return mod, sglang


def _run_one(fn, timeout: float) -> tuple[str, str]:
    box: dict = {}

    def target():
        try:
            fn()
            box["outcome"] = ("PASS", "")
        except AssertionError as e:
            box["outcome"] = ("FAIL", f"AssertionError: {e}\n{traceback.format_exc()[-1200:]}")
        except BaseException as e:  # noqa: BLE001 - every failure is a result here
            box["outcome"] = ("ERROR", f"{type(e).__name__}: {e}\n{traceback.format_exc()[-1200:]}")

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join(timeout)
    return box.get("outcome", ("TIMEOUT", f"no result after {timeout:.0f} s (the client hangs)"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--url", required=True)
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds per program")
    ap.add_argument("names", nargs="*", help="program names (default: all)")
    a = ap.parse_args()
    mod, sglang = _programs_on_sglang()
    sglang.set_default_backend(sglang.RuntimeEndpoint(a.url, api_key=os.environ.get("SGLANG_API_KEY_FOR_TEST")))
    for name in a.names or sorted(mod.PROGRAMS):
        t0 = time.monotonic()
        outcome, error = _run_one(mod.PROGRAMS[name], a.timeout)
        rec = ProgramResult(name, outcome, round(time.monotonic() - t0, 2), error[-2000:])
        print("RESULT " + json.dumps(rec.__dict__), flush=True)
    sys.stdout.flush()
    os._exit(0)  # SGLang's interpreter may leave non-daemon threads behind after an error


if __name__ == "__main__":
    main()

"""Isolation benchmark: a plain request's latency alone, during a worst-case compile, and during a fault storm.

Starts `sglpy serve` (default model unless --model) and measures, over HTTP, the end-to-end latency of a
plain greedy request (16 tokens) sent one after another. Other jobs share the CPU, so every case is
bracketed by plain runs just before and just after it, and its ratio is against their median:
  alone                 nothing else running
  compile (process)     while another client's worst-case regex compiles in the compile workers
  compile (thread)      the same with --grammar-workers 0: the compile runs on a thread of the engine
                        process and holds its GIL (what a thread-based design would give)
  fault storm           while 4 clients loop over hostile requests (bad / worst-case constraints, EBNF file
                        imports, deep schemas, catastrophic stop_regex, unvalidated values, disconnects)
Then the engine process is SIGKILLed and the time until /health is 200 again (and a request succeeds)
is compared with the server's cold start. Prints a table; --json writes the numbers.

    .venv/bin/python benchmarks/isolation.py [--model PATH] [--requests 8] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import threading
import time

import requests

from sglpy.runtime.testing.server_harness import run_server

WORST = ["(a{0,100}){0,100}(b{0,100}){0,100}", "(.{0,200}x){8}"]
PLAIN = {"text": "Write one sentence about rivers.", "sampling_params": {"max_new_tokens": 16, "temperature": 0,
                                                                          "ignore_eos": True}}


def load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def plain_latencies(s, n: int, stop_when=None) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        r = s.post("/generate", PLAIN)
        assert r.status_code == 200, r.text
        out.append(time.perf_counter() - t)
        if stop_when is not None and stop_when():
            break
    return out


def hostile_compile(s, regex: str, box: dict) -> threading.Thread:
    def run():
        t = time.perf_counter()
        try:
            r = s.post("/generate", {"text": "x", "sampling_params": {"max_new_tokens": 8, "regex": regex}},
                       timeout=600)
            box["status"], box["message"] = r.status_code, r.text[:160]
        except requests.RequestException as e:
            box["status"], box["message"] = None, repr(e)[:160]
        box["seconds"] = time.perf_counter() - t

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


STORM = [
    {"text": "x", "sampling_params": {"max_new_tokens": 4, "regex": "(unclosed"}},
    {"text": "x", "sampling_params": {"max_new_tokens": 4, "ebnf": "%import etc.passwd (X)\nstart: X"}},
    {"text": "x", "sampling_params": {"max_new_tokens": 4,
                                      "json_schema": '{"type":"array","items":' * 1000 + "{}" + "}" * 1000}},
    {"text": "x", "sampling_params": {"max_new_tokens": 24, "regex": "x{20,40}", "stop_regex": ["(x|x)+z"]}},
    {"text": "x", "sampling_params": {"max_new_tokens": 4, "skip_special_tokens": "no"}},
    {"text": "x", "sampling_params": {"max_new_tokens": 4}, "return_logprob": True, "top_logprobs_num": 1_000_000},
    {"text": "x", "sampling_params": {"max_new_tokens": 8, "regex": "(a{0,50}){0,50}c"}, "timeout": 0.3},
]


def storm(s, stop: threading.Event, counts: dict, first: int) -> None:
    i = first  # clients start at different kinds, so every kind is in the storm
    while not stop.is_set():
        body = dict(STORM[i % len(STORM)])
        timeout = body.pop("timeout", 120)
        try:
            r = requests.post(s.url + "/generate", json=body, timeout=timeout)
            counts[r.status_code] = counts.get(r.status_code, 0) + 1
        except requests.RequestException:
            counts["disconnect"] = counts.get("disconnect", 0) + 1
        i += 1


def summary(xs: list[float]) -> dict:
    return {"n": len(xs), "median_s": statistics.median(xs), "max_s": max(xs)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=8)
    ap.add_argument("--timeout", type=float, default=5.0, help="--grammar-compile-timeout of the server")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    model = ["--model", args.model] if args.model else []
    common = [*model, "--log-level", "warning", "--grammar-compile-timeout", str(args.timeout)]
    rows, results = [], {"load_before": load()}

    t0 = time.monotonic()
    with run_server(*common, startup_timeout=600) as s:
        results["cold_start_s"] = time.monotonic() - t0
        plain_latencies(s, 2)  # warm-up
        alone = plain_latencies(s, args.requests)
        rows.append(("alone", summary(alone), alone, load(), ""))
        for regex in WORST:
            box: dict = {}
            th = hostile_compile(s, regex, box)
            time.sleep(0.3)
            lat = plain_latencies(s, args.requests, stop_when=lambda: not th.is_alive())
            still = th.is_alive()
            th.join()
            after = plain_latencies(s, args.requests)
            rows.append((f"compile (process) {regex}", summary(lat), alone + after, load(),
                         f"compile {box['status']} after {box['seconds']:.1f} s; still compiling when the plain "
                         f"requests ended: {still}"))
            alone = after
        stop, counts = threading.Event(), {}
        storms = [threading.Thread(target=storm, args=(s, stop, counts, 2 * k), daemon=True) for k in range(4)]
        for th in storms:
            th.start()
        time.sleep(1.0)
        lat = plain_latencies(s, 2 * args.requests)
        stop.set()
        for th in storms:
            th.join(120)
        after = plain_latencies(s, args.requests)
        rows.append(("fault storm (4 clients)", summary(lat), alone + after, load(), f"hostile answers: {counts}"))
        # restart: kill the engine process, time until it serves again
        pid = s.get("/get_server_info").json()["engine_pid"]
        t1 = time.monotonic()
        os.kill(pid, signal.SIGKILL)
        while s.get("/health").status_code == 200:
            time.sleep(0.01)
        while s.get("/health").status_code != 200:
            time.sleep(0.05)
        results["restart_to_health_s"] = time.monotonic() - t1
        assert s.post("/generate", PLAIN).status_code == 200
        results["restart_to_first_answer_s"] = time.monotonic() - t1
        results["engine_info"] = {k: v for k, v in s.get("/get_server_info").json().items()
                                  if k in ("engine_restarts", "grammar", "isolated_failures")}

    with run_server(*common, "--grammar-workers", "0", startup_timeout=600) as s:
        plain_latencies(s, 2)
        alone_t = plain_latencies(s, args.requests)
        rows.append(("alone (thread mode server)", summary(alone_t), alone_t, load(), ""))
        for regex in WORST[:1]:
            box = {}
            th = hostile_compile(s, regex, box)
            time.sleep(0.3)
            lat = plain_latencies(s, max(2, args.requests // 4), stop_when=lambda: not th.is_alive())
            rows.append((f"compile (thread) {regex}", summary(lat), alone_t, load(),
                         f"compile still running: {th.is_alive()} (unbounded in thread mode; server stopped)"))
        s.proc.kill()  # the compile cannot be stopped in thread mode

    print(f"\n{'case':<62} {'n':>3} {'median s':>9} {'max s':>8} {'x alone':>8}  load / notes")
    for name, st, ref, ld, note in rows:
        ratio = st["median_s"] / statistics.median(ref)
        print(f"{name:<62} {st['n']:>3} {st['median_s']:>9.3f} {st['max_s']:>8.3f} {ratio:>8.2f}  {ld}  {note}")
    print(f"\ncold start (spawn -> /health 200): {results['cold_start_s']:.1f} s; engine SIGKILL -> /health 200: "
          f"{results['restart_to_health_s']:.1f} s, -> first answer {results['restart_to_first_answer_s']:.1f} s")
    results["rows"] = [{"case": n, **st, "x_alone": st["median_s"] / statistics.median(ref), "load": ld, "note": note}
                       for n, st, ref, ld, note in rows]
    results["load_after"] = load()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2, default=str)


if __name__ == "__main__":
    main()

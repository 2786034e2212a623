"""Replicas behind sglang-router: 1 vs 2 real-model workers on a multi-prefix workload, cache_aware vs round_robin.

Workload: P few-shot prefixes (each ~400 tokens, distinct from the first word so the router's text tree tells
them apart) x Q questions, greedy, `ignore_eos`, N output tokens, sent in a seeded shuffled order by C
closed-loop clients (non-streaming POST /generate). Every configuration starts fresh servers (cold caches):

    1 worker x 1 thread   direct                      the single-engine cached-token share (the reference)
    1 worker x 2 threads  direct                      the honest single-engine comparison on 2 cores
    1 worker x 1 thread   behind the router           what the router process costs
    2 workers x 1 thread  `sglpy serve --dp-size 2 --num-threads 2 --router-policy cache_aware|round_robin`

Reported per configuration: wall time, requests/s, output tokens/s, e2e p50/p90, the cached-token share
(sum of meta_info.cached_tokens / sum of prompt_tokens over the client's answers), that share as % of the
single-engine share, and the requests each worker served (its /metrics `sglang:num_requests_total`).
Load average is printed with every row: other jobs share this CPU.

    .venv/bin/python benchmarks/replicas.py                          # 4 prefixes x 16 questions, 2 repeats
    .venv/bin/python benchmarks/replicas.py --prefixes 16 --questions 4 --repeats 1
    .venv/bin/python benchmarks/replicas.py --configs dp2-cache_aware,dp2-round_robin --json out.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass

import requests

from sglpy.runtime.testing.router_cluster import run_router
from sglpy.runtime.testing.server_harness import run_server

TOPICS = ("Arithmetic drill", "Spelling practice", "Unit conversion", "Opposites quiz", "Capital cities",
          "Plural forms", "Past tenses", "Number words", "Colour mixing", "Animal sounds", "Roman numerals",
          "Rhyming words", "Chemical symbols", "Synonyms", "Day arithmetic", "Metric prefixes")
CONFIGS = ("single-1t", "single-2t", "router-1x1t", "dp2-cache_aware", "dp2-round_robin")


@dataclass
class Row:
    """One configuration's run."""

    config: str
    repeat: int
    requests: int
    errors: int
    wall_s: float
    req_s: float
    out_tok_s: float
    e2e_p50: float
    e2e_p90: float
    cached_share: float
    per_worker: list
    load: str


def prefixes(n: int, shots: int, seed: int) -> list[str]:
    """`n` few-shot prefixes of `shots` examples each (numbers vary, so no two are alike)."""
    rng = random.Random(seed)
    out = []
    for k in range(n):
        lines = [f"{TOPICS[k % len(TOPICS)]} {k}. Answer each question in the same style as the examples."]
        for _ in range(shots):
            a, b = rng.randint(10, 999), rng.randint(10, 999)
            lines.append(f"Question: in exercise {a}, what is item {b}?\nAnswer: item {b} of exercise {a} is {a + b}.")
        out.append("\n".join(lines) + "\n")
    return out


def workload(args) -> list[str]:
    """The prompts, in the seeded order the clients send them."""
    rng = random.Random(args.seed)
    pre = prefixes(args.prefixes, args.shots, args.seed)
    prompts = [f"{p}Question: in exercise {rng.randint(1000, 9999)}, what is item {q}?\nAnswer:"
               for p in pre for q in range(args.questions)]
    rng.shuffle(prompts)
    return prompts


def load_avg() -> str:
    return " ".join(f"{x:.1f}" for x in os.getloadavg())


def free_run(n: int) -> int:
    """A port P with P..P+n free on loopback."""
    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            p = s.getsockname()[1]
        ok = True
        for q in range(p, p + n + 1):
            with socket.socket() as s:
                try:
                    s.bind(("127.0.0.1", q))
                except OSError:
                    ok = False
                    break
        if ok and p + n < 65536:
            return p
    raise RuntimeError("no run of free ports")


@contextlib.contextmanager
def launched_dp2(policy: str, server_args: list[str], timeout: float = 900.0):
    """`sglpy serve --dp-size 2 --num-threads 2` (two 1-thread workers + sglang-router); yields (url, worker urls)."""
    port = free_run(3)
    log = tempfile.NamedTemporaryFile("w+", prefix="replicas-bench-", suffix=".log", delete=False)
    cmd = [sys.executable, "-m", "sglpy.runtime.server", "--port", str(port), "--dp-size", "2", "--num-threads", "2",
           "--router-policy", policy, "--log-level", "warning", *server_args]
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"launcher exited {proc.returncode}:\n{open(log.name).read()[-3000:]}")
            with contextlib.suppress(requests.RequestException, ValueError):
                if requests.get(url + "/readiness", timeout=2).json().get("healthy_workers") == 2:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError("launcher not ready")
            time.sleep(0.5)
        yield url, [f"http://127.0.0.1:{port + 1}", f"http://127.0.0.1:{port + 2}"]
    finally:
        proc.terminate()
        try:
            proc.wait(120)
        except subprocess.TimeoutExpired:
            proc.kill()
        os.unlink(log.name)


@contextlib.contextmanager
def servers(config: str, server_args: list[str]):
    """Fresh servers for `config`; yields (url clients use, worker urls)."""
    if config.startswith("dp2-"):
        with launched_dp2(config.removeprefix("dp2-"), server_args) as pair:
            yield pair
        return
    threads = "2" if config == "single-2t" else "1"
    with run_server("--num-threads", threads, "--log-level", "warning", *server_args, startup_timeout=900) as w:
        if config == "router-1x1t":
            with run_router([w.url], "cache_aware") as r:
                yield r.url, [w.url]
        else:
            yield w.url, [w.url]


def num_requests(worker_url: str) -> int:
    text = requests.get(worker_url + "/metrics", timeout=30).text
    m = re.search(r"^sglang:num_requests_total\{[^}]*\} ([0-9.e+]+)$", text, re.M)
    return int(float(m.group(1))) if m else -1


def run_config(config: str, repeat: int, prompts: list[str], args) -> Row:
    """Send the workload through fresh servers of `config`; the row of its numbers."""
    with servers(config, args.server_args) as (url, workers):
        before = [num_requests(w) for w in workers]  # startup health generations are not requests
        body = {"sampling_params": {"max_new_tokens": args.output_len, "temperature": 0, "ignore_eos": True}}

        def one(prompt):
            t0 = time.perf_counter()
            r = requests.post(url + "/generate", json={"text": prompt, **body}, timeout=1800)
            dt = time.perf_counter() - t0
            if r.status_code != 200:
                return None, dt
            return r.json()["meta_info"], dt

        t0 = time.perf_counter()
        with ThreadPoolExecutor(args.clients) as pool:
            results = list(pool.map(one, prompts))
        wall = time.perf_counter() - t0
        per_worker = [num_requests(w) - b for w, b in zip(workers, before)]
    metas = [m for m, _ in results if m is not None]
    lat = sorted(dt for m, dt in results if m is not None)
    prompt_tokens = sum(m["prompt_tokens"] for m in metas)
    out_tokens = sum(m["completion_tokens"] for m in metas)
    return Row(config, repeat, len(prompts), len(prompts) - len(metas), round(wall, 2), round(len(metas) / wall, 3),
               round(out_tokens / wall, 2), round(statistics.median(lat), 2) if lat else float("nan"),
               round(lat[int(0.9 * (len(lat) - 1))], 2) if lat else float("nan"),
               round(sum(m["cached_tokens"] for m in metas) / max(prompt_tokens, 1), 4), per_worker, load_avg())


def print_table(rows: list[Row]) -> None:
    ref = [r.cached_share for r in rows if r.config == "single-1t"]
    ref_share = statistics.mean(ref) if ref else float("nan")
    print(f"{'config':18} {'rep':>3} {'reqs':>4} {'err':>3} {'wall s':>7} {'req/s':>6} {'out tok/s':>9} "
          f"{'e2e p50':>7} {'p90':>6} {'cached':>7} {'% of 1-eng':>10}  {'per worker':12} load (1/5/15 min)")
    for r in rows:
        rel = f"{100 * r.cached_share / ref_share:.1f}%" if ref_share == ref_share and ref_share > 0 else "-"
        print(f"{r.config:18} {r.repeat:>3} {r.requests:>4} {r.errors:>3} {r.wall_s:>7.2f} {r.req_s:>6.2f} "
              f"{r.out_tok_s:>9.1f} {r.e2e_p50:>7.2f} {r.e2e_p90:>6.2f} {100 * r.cached_share:>6.1f}% {rel:>10}  "
              f"{'/'.join(map(str, r.per_worker)):12} {r.load}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prefixes", type=int, default=4)
    p.add_argument("--questions", type=int, default=16, help="questions per prefix")
    p.add_argument("--shots", type=int, default=16, help="examples per prefix (16 -> ~400 tokens)")
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--clients", type=int, default=16, help="concurrent closed-loop clients")
    p.add_argument("--repeats", type=int, default=2, help="rounds over all configs (interleaved: A B C A B C)")
    p.add_argument("--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {CONFIGS}")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-total-tokens", type=int, default=16384, help="each worker's KV pool (holds everything)")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    configs = args.configs.split(",")
    unknown = set(configs) - set(CONFIGS)
    if unknown:
        p.error(f"unknown config(s) {sorted(unknown)}; known: {CONFIGS}")
    args.server_args = ["--max-total-tokens", str(args.max_total_tokens)]
    prompts = workload(args)
    print(f"workload: {args.prefixes} prefixes x {args.questions} questions, {args.shots} shots, "
          f"{args.output_len} output tokens, {args.clients} clients; load {load_avg()}", flush=True)
    rows = []
    for rep in range(args.repeats):
        for config in configs:
            rows.append(run_config(config, rep, prompts, args))
            print(json.dumps(asdict(rows[-1])), flush=True)
    print()
    print_table(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": {k: v for k, v in vars(args).items()}, "rows": [asdict(r) for r in rows]}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""What the HTTP server costs: the same closed-loop batch in-process (Engine, threads) vs over HTTP.

N requests (`--requests`), `--concurrency` at a time, greedy, `ignore_eos`, `--output-len` tokens each;
output-token throughput in-process, over HTTP non-streaming and over HTTP streaming (SSE, one event per
token). Both sides use the same engine settings; the server runs its engine in a separate process.

    .venv/bin/python benchmarks/serving_overhead.py                  # default model
    .venv/bin/python benchmarks/serving_overhead.py --model PATH --requests 64
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp

from serving import make_prompts, start_server


def in_process(model, prompts, sp, concurrency, engine_args) -> float:
    """Seconds for all prompts through Engine.generate from `concurrency` threads."""
    from sglpy.runtime.engine import Engine

    eng = Engine(model, **engine_args)
    try:
        eng.generate(prompts[:2], sp)  # warm-up
        t = time.perf_counter()
        with ThreadPoolExecutor(concurrency) as ex:
            list(ex.map(lambda p: eng.generate(p, sp), prompts))
        return time.perf_counter() - t
    finally:
        eng.shutdown()


async def over_http(url, prompts, sp, concurrency, stream) -> float:
    """Seconds for all prompts through POST /generate, `concurrency` connections."""
    sem = asyncio.Semaphore(concurrency)
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=3600)) as session:
        async def one(p):
            async with sem, session.post(url + "/generate", json={"text": p, "sampling_params": sp,
                                                                  "stream": stream}) as r:
                assert r.status == 200, await r.text()
                await r.read()

        await asyncio.gather(*(one(p) for p in prompts[:2]))
        t = time.perf_counter()
        await asyncio.gather(*(one(p) for p in prompts))
        return time.perf_counter() - t


def main() -> int:
    """Run the three modes and print output tok/s for each."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    a = ap.parse_args()
    prompts = make_prompts(a.requests, seed=7)
    sp = {"max_new_tokens": a.output_len, "temperature": 0, "ignore_eos": True}
    tokens = a.requests * a.output_len
    rows = [("in-process Engine", in_process(a.model, prompts, sp, a.concurrency, {}))]
    proc, url, log = start_server(["--model", a.model] if a.model else [])
    try:
        rows.append(("HTTP /generate", asyncio.run(over_http(url, prompts, sp, a.concurrency, False))))
        rows.append(("HTTP /generate stream", asyncio.run(over_http(url, prompts, sp, a.concurrency, True))))
    finally:
        proc.terminate()
        proc.wait(60)
        os.unlink(log)
    print(f"{a.requests} requests x {a.output_len} tokens, concurrency {a.concurrency}")
    for name, secs in rows:
        print(f"{name:<24}{secs:>8.2f} s{tokens / secs:>10.1f} output tok/s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

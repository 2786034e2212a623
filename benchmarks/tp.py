"""Tensor parallelism on CPU: engine step time at tp=1 vs tp=N in the same run (gloo, one process per rank).

Models: the default SmolLM2-135M (9 heads, 3 KV heads: tp=2 is refused, so it runs tp=3 on 2 cores), and a
random-weight model with its sizes but 8 heads / 2 KV heads of 64 (hidden 576, intermediate 1536, 30 layers,
vocab 49152) so that tp=2 splits it. Per configuration: the median over `--reps` of
  decode  ms per decode step at batch B: (wall(B prompts, N+1 tokens) - wall(B prompts, 1 token)) / N
  prefill ms for one P-token prompt (1 output token)
Thread budgets: tp=1 with --threads threads (the whole box) and with 1 thread, tp=N with --threads // N per
rank (at least 1).
The load average is printed with every row: other jobs share this CPU.

    .venv/bin/python benchmarks/tp.py                       # both models, batch 1 and 8
    .venv/bin/python benchmarks/tp.py --models default --tp 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time


def _load() -> str:
    return "load %.2f %.2f %.2f" % os.getloadavg()


def _time(engine, prompts, n: int) -> float:
    t0 = time.perf_counter()
    engine.generate(prompts, {"max_new_tokens": n, "temperature": 0, "ignore_eos": True})
    return time.perf_counter() - t0


def measure(engine, batch: int, steps: int, prefill_len: int, reps: int) -> dict:
    prompts = [f"Prompt number {i} about the weather in a city" for i in range(batch)]
    long = [" ".join(["word"] * prefill_len)]
    _time(engine, prompts, 4)  # warm-up
    decode, prefill = [], []
    for r in range(reps):
        engine.flush_cache()
        one = _time(engine, prompts, 1)
        engine.flush_cache()
        many = _time(engine, prompts, steps + 1)
        decode.append((many - one) / steps * 1e3)
        engine.flush_cache()
        prefill.append(_time(engine, [f"{r} " + long[0]], 1) * 1e3)
    return {"decode_ms": statistics.median(decode), "prefill_ms": statistics.median(prefill)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="default,split8", help="default and/or split8 (comma-separated)")
    ap.add_argument("--tp", type=int, default=0, help="tp size to compare with tp=1 (0: 3 for default, 2 for split8)")
    ap.add_argument("--batch", default="1,8")
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--prefill", type=int, default=256)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    args = ap.parse_args(argv)
    from sglpy.runtime.engine import Engine
    from sglpy.runtime.model.loader import resolve_model_path
    from sglpy.runtime.testing import make_tiny_model

    tmp = tempfile.mkdtemp(prefix="sglpy-tp-bench-")
    for name in args.models.split(","):
        if name == "default":
            path, tp = resolve_model_path(None), args.tp or 3
        elif name == "split8":
            path = make_tiny_model(os.path.join(tmp, "split8"), num_layers=30, hidden=576, heads=8, kv_heads=2,
                                   head_dim=64, intermediate=1536, max_pos=8192)
            tp = args.tp or 2
        else:
            raise SystemExit(f"unknown model {name!r}")
        runs = [(1, args.threads)] + ([(1, 1)] if args.threads > 1 else []) + [(tp, max(1, args.threads // tp))]
        for size, threads in runs:
            t0 = time.perf_counter()
            with Engine(path, tp_size=size, num_threads=threads, grammar_workers=0, max_total_tokens=16384) as e:
                start = time.perf_counter() - t0
                for b in (int(x) for x in args.batch.split(",")):
                    r = measure(e, b, args.steps, args.prefill, args.reps)
                    print(f"{name:8s} tp={size} threads/rank={threads} batch={b:2d}  decode {r['decode_ms']:7.1f} "
                          f"ms/step  prefill({args.prefill}) {r['prefill_ms']:7.1f} ms  start {start:5.1f} s  "
                          f"[{_load()}]", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

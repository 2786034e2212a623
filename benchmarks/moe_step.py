"""MoE decode cost tracks the active parameters: tiny random Qwen3-MoE models of one width with 4 or 64 experts
(top-2), and 64 experts all active (top-64, what computing every expert would cost). Batch-1 greedy decode
through the engine, float32 experts, or int8/int4 ones packed per expert (--quantization).

python benchmarks/moe_step.py [--tokens 64] [--hidden 256] [--threads 2] [--quantization none|int8|int4]
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import tempfile
import time

import torch

from sglpy.runtime.engine import Engine
from sglpy.runtime.testing.tiny_model import make_family_model


def _params(hidden: int, inter: int, experts: int, k: int, layers: int) -> tuple[float, float]:
    per_expert = 3 * hidden * inter
    return layers * experts * per_expert / 1e6, layers * k * per_expert / 1e6


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantization", default="none", choices=("none", "int8", "int4"))
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    h = args.hidden
    cases = [(4, 2), (64, 2), (64, 64)]
    engines = {}
    for e, k in cases:
        folder = pathlib.Path(tempfile.gettempdir()) / f"sglpy-moe-bench-{h}-{args.layers}-{e}-{k}"
        path = make_family_model(folder, "qwen3-moe", extra=dict(
            hidden_size=h, moe_intermediate_size=h, intermediate_size=2 * h, num_hidden_layers=args.layers,
            num_experts=e, num_experts_per_tok=k, num_attention_heads=4, num_key_value_heads=2, head_dim=h // 4))
        engines[(e, k)] = Engine(path, quantization=args.quantization, max_total_tokens=4096)
    times = {c: [] for c in cases}
    sp = {"max_new_tokens": args.tokens, "temperature": 0, "ignore_eos": True}
    for _ in range(args.repeats):  # interleaved: the box's drift hits every case alike
        for c in cases:
            engines[c].generate(input_ids=[1, 2, 3, 4], sampling_params={**sp, "max_new_tokens": 1})
            t = time.perf_counter()
            engines[c].generate(input_ids=[1, 2, 3, 4], sampling_params=sp)
            times[c].append((time.perf_counter() - t) / args.tokens * 1e3)
    for eng in engines.values():
        eng.shutdown()
    base, base_min = statistics.median(times[cases[0]]), min(times[cases[0]])
    print(f"hidden {h}, {args.layers} layers, expert width {h}, quantization {args.quantization}; batch-1 decode, "
          f"ms per token: median and min of "
          f"{args.repeats} interleaved runs (max), ratio to the 4-expert model by median / by min")
    for (e, k), ts in times.items():
        total, active = _params(h, h, e, k, args.layers)
        med = statistics.median(ts)
        print(f"  {e:3d} experts, top-{k:<2d}: expert params {total:6.1f} M total, {active:5.2f} M active: "
              f"{med:6.2f} / {min(ts):6.2f} ms ({max(ts):.2f}), {med / base:.2f}x / {min(ts) / base_min:.2f}x")


if __name__ == "__main__":
    main()

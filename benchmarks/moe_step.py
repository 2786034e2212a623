"""MoE decode cost tracks the active parameters: tiny random Qwen3-MoE models of one width with 4 or 64 experts
(top-2), and 64 experts all active (top-64, what computing every expert would cost). Batch-1 greedy decode
through the engine, float32 experts, or int8/int4 ones packed per expert (--quantization).

python benchmarks/moe_step.py [--tokens 64] [--hidden 256] [--threads 2] [--quantization none|int8|int4]

--block: one MoE block alone, in one process, 64 experts top-2 at batch 1 and 8: the native CPU call (csrc/moe.cpp)
against the grouped Python loop it replaced for decode rows (moe_experts / moe_reference), interleaved.
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


def _block_ab(args) -> None:
    """us per MoE block forward: native call vs the Python loop, interleaved rounds (median, min)."""
    import types

    from sglpy.runtime.model.moe import MoEBlock, moe_experts, moe_reference, route

    h = args.hidden
    cfg = types.SimpleNamespace(hidden_size=h, moe_intermediate_size=h, intermediate_size=2 * h, num_experts=64,
                                num_experts_per_tok=2, norm_topk_prob=True)
    torch.manual_seed(0)
    block = MoEBlock(cfg, "qwen3-moe")
    with torch.no_grad():
        for p in block.parameters():
            p.normal_(0.0, h ** -0.5)
    block.fuse()
    if args.quantization != "none":
        block.quantize_experts(args.quantization)

    def loop(x):  # the forward before the native call: route, then the grouped Python loop
        r = route(block.gate(x), block.top_k, block.renormalize)
        if hasattr(block, "q_gate_up"):
            return moe_experts(x, r, block.q_gate_up, block.q_down)
        return moe_reference(x, block.w_gate_up, block.w_down, r)

    print(f"MoE block, hidden {h}, 64 experts top-2, quantization {args.quantization}, {args.threads} threads: "
          f"us per forward, median / min of {args.repeats * 3} interleaved rounds of 200")
    with torch.no_grad():
        for rows in (1, 8):
            x = torch.randn(rows, h)
            if not torch.equal(block(x), loop(x)) and args.quantization != "none":
                raise SystemExit("native and Python loop disagree")
            ts = {"native": [], "loop": []}
            for _ in range(args.repeats * 3):
                for name, f in (("native", block), ("loop", loop)):
                    t = time.perf_counter()
                    for _ in range(200):
                        f(x)
                    ts[name].append((time.perf_counter() - t) / 200 * 1e6)
            med = {k: statistics.median(v) for k, v in ts.items()}
            print(f"  batch {rows}: native {med['native']:7.1f} / {min(ts['native']):7.1f}, Python loop "
                  f"{med['loop']:7.1f} / {min(ts['loop']):7.1f}: {med['loop'] / med['native']:.2f}x by median")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--quantization", default="none", choices=("none", "int8", "int4"))
    ap.add_argument("--block", action="store_true", help="the MoE block alone: native call vs the Python loop")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    if args.block:
        return _block_ab(args)
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

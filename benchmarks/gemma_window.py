"""Gemma-2-shaped decode on CPU: sliding-window and soft-capped attention layers end to end, and the decode attention
kernel alone at a long context with and without its window.

Engine mode (default): a random Gemma-2-2B-shaped model (8 heads, 4 KV heads, head_dim 256, windows of --window
tokens on alternating layers, attention soft-cap 50, final soft-cap 30; width and depth scaled down), batch-1 greedy
decode through the engine, streamed: ms per decode token = time from the first streamed token to the last / (N - 1)
(the prefill is left out). Run it once per source tree, alternating, to compare trees on a shared box (the
tree hook: SGLPY_TREE=/path PYTHONPATH=/tmp/treehook python benchmarks/gemma_window.py).

Kernel mode (--kernel): decode_attention at --long keys per request, native CPU, window --window vs none, the same
K/V; microseconds per layer call (what the window skips: the keys before it are never read).

python benchmarks/gemma_window.py [--prompts 32,2000] [--tokens 32] [--window 512] [--threads 1] [--kernel]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import tempfile
import time

import torch


def gemma_shaped(window: int) -> str:
    """A random Gemma-2-2B-shaped folder (attention as the real model's; 4 layers, hidden 576)."""
    from sglpy.runtime.testing.tiny_model import make_family_model

    folder = pathlib.Path(tempfile.gettempdir()) / f"sglpy-gemma2-window-bench-{window}"
    return make_family_model(folder, "gemma2", extra=dict(
        hidden_size=576, intermediate_size=1536, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
        head_dim=256, query_pre_attn_scalar=256, sliding_window=window, max_position_embeddings=8192))


def engine_mode(args) -> dict:
    from sglpy.runtime.engine import Engine

    path = gemma_shaped(args.window)
    out = {}
    with Engine(path, max_total_tokens=8192, num_threads=args.threads, disable_radix_cache=True,
                grammar_workers=0) as eng:
        for n in map(int, args.prompts.split(",")):
            ids = [(7 * i) % 40000 + 100 for i in range(n)]
            sp = {"temperature": 0, "ignore_eos": True}
            eng.generate(input_ids=ids, sampling_params={**sp, "max_new_tokens": 2})  # warm-up
            per = []
            for _ in range(args.repeats):
                first = last = None
                for chunk in eng.generate(input_ids=ids, sampling_params={**sp, "max_new_tokens": args.tokens},
                                          stream=True):
                    last = time.perf_counter()
                    first = first or (last, len(chunk["output_ids"]))
                    n_out = len(chunk["output_ids"])
                per.append((last - first[0]) / (n_out - first[1]) * 1e3)
            out[n] = {"ms_per_token_median": statistics.median(per), "ms_per_token_min": min(per)}
    return out


def kernel_mode(args) -> dict:
    from sglpy.kernels.decode_attention import decode_attention
    from sglpy.runtime.testing.kernel_cases import make_paged_batch

    torch.set_num_threads(args.threads)
    lens = [args.long] * args.batch
    pb = make_paged_batch(lens, 4, 256, torch.float32, seed=1)
    q = torch.randn(args.batch, 8, 256)
    call = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(lens), 256 ** -0.5)
    res = {}
    for name, kw in (("none", {}), (f"window {args.window}", {"window": args.window}),
                     ("soft-cap 50", {"softcap": 50.0}), (f"window {args.window} + soft-cap 50",
                                                          {"window": args.window, "softcap": 50.0})):
        try:
            decode_attention(*call, **kw)
        except TypeError:  # a tree whose kernels take no window or soft-cap
            continue
        ts = []
        for _ in range(args.repeats):
            t = time.perf_counter()
            for _ in range(20):
                decode_attention(*call, **kw)
            ts.append((time.perf_counter() - t) / 20 * 1e6)
        res[name] = {"us_median": statistics.median(ts), "us_min": min(ts)}
    try:  # a tree from before the kernels took windows: its torch path for windowed / soft-capped layers
        from sglpy.runtime.model.window_attention import WindowPlan, window_attention
    except ImportError:
        return res
    plan = WindowPlan([(i, 1, pb.req_to_token[int(r), :n].long(), torch.tensor([n - 1]))
                       for i, (r, n) in enumerate(zip(pb.req_pool_indices.tolist(), lens))], max(lens))
    ts = []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for _ in range(20):
            window_attention(q, pb.k_cache, pb.v_cache, plan, 256 ** -0.5, args.window, 50.0)
        ts.append((time.perf_counter() - t) / 20 * 1e6)
    res[f"torch window_attention, window {args.window} + soft-cap 50"] = {"us_median": statistics.median(ts),
                                                                            "us_min": min(ts)}
    return res


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="32,2000")
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--window", type=int, default=512)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kernel", action="store_true")
    ap.add_argument("--long", type=int, default=2048)
    ap.add_argument("--batch", type=int, default=1)
    args = ap.parse_args()
    print(json.dumps(kernel_mode(args) if args.kernel else engine_mode(args)))


if __name__ == "__main__":
    main()

"""Kernel benchmarks: decode attention bandwidth vs torch SDPA over gathered K/V, plus an engine decode hook.

  python benchmarks/kernels.py                      # decode attention grid on CUDA (small CPU grid without one)
  python benchmarks/kernels.py --batch 1,64 --context 1024,32768 --json out.json
  python benchmarks/kernels.py --engine             # + engine decode throughput, random-weight ~1B Llama
Bandwidth counts the bytes a decode step must read (K and V of every cached token, the slot table, q) and
write (o); "% HBM" divides by the card's spec bandwidth (--hbm-gbps overrides) and "% copy" by a measured
device-to-device copy (read + write bytes per second), the practical ceiling (target >= 70% at context >= 8k).
Issue 18's grid: batch 1-128 x context 512-32k, bf16, 32/8 heads, head_dim 128 (the CUDA defaults).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from sglpy.kernels import decode_attention

# Spec HBM bandwidth (GB/s) by device-name substring, most specific first.
HBM_SPEC_GBPS = [("H200", 4800.0), ("H100 PCIe", 2000.0), ("H100", 3350.0), ("A100-SXM4-80GB", 2039.0),
                 ("A100 80GB PCIe", 1935.0), ("A100", 1555.0), ("L40S", 864.0), ("A10G", 600.0), ("L4", 300.0)]


@dataclass(frozen=True)
class DecodeRow:
    """One decode-attention measurement: (batch, context) and the three timings it compares."""

    batch: int
    context: int
    bytes_moved: int
    kernel_ms: float
    kernel_gbps: float
    kernel_pct_hbm: float | None
    kernel_pct_copy: float | None
    torch_gather_sdpa_ms: float
    torch_sdpa_only_ms: float
    torch_gather_sdpa_gbps: float


def _timer(fn, device: torch.device, reps: int) -> float:
    """Median milliseconds of fn(); on CUDA each rep starts with a cold L2 (a 256 MiB scrub)."""
    fn()
    times = []
    if device.type == "cuda":
        scrub = torch.empty(64 * 2**20, dtype=torch.int32, device=device)
        for _ in range(reps):
            scrub.zero_()
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
    else:
        for _ in range(reps):
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def hbm_spec_gbps(device: torch.device) -> float | None:
    """Spec memory bandwidth of a known CUDA card, else None."""
    if device.type != "cuda":
        return None
    name = torch.cuda.get_device_name(device)
    return next((gbps for key, gbps in HBM_SPEC_GBPS if key in name), None)


def copy_gbps(device: torch.device, mib: int = 1024) -> float:
    """Measured device copy bandwidth (read + write bytes per second), the practical ceiling."""
    src = torch.empty(mib * 2**20, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    ms = _timer(lambda: dst.copy_(src), device, reps=10)
    return 2 * src.numel() / ms / 1e6


def bench_decode(batch: int, context: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype,
                 device: torch.device, reps: int, hbm: float | None, copy: float | None = None) -> DecodeRow:
    """Time decode_attention (Triton on CUDA) against gather + SDPA and SDPA alone on one shape."""
    slots = batch * context
    k_cache = torch.randn(slots, kv_heads, head_dim, device=device).to(dtype)
    v_cache = torch.randn(slots, kv_heads, head_dim, device=device).to(dtype)
    # Slots scattered at random, as in a long-running pool; each request holds `context` tokens.
    req_to_token = torch.randperm(slots, device=device).to(torch.int32).view(batch, context)
    req_pool_indices = torch.arange(batch, device=device)
    seq_lens = torch.full((batch,), context, device=device, dtype=torch.int64)
    q = torch.randn(batch, heads, head_dim, device=device).to(dtype)
    scale = 1 / math.sqrt(head_dim)
    group = heads // kv_heads

    def kernel():
        decode_attention(q, k_cache, v_cache, req_to_token, req_pool_indices, seq_lens, scale)

    def gathered():
        flat = req_to_token.reshape(-1).long()
        k = k_cache.index_select(0, flat).view(batch, context, kv_heads, head_dim).transpose(1, 2)
        v = v_cache.index_select(0, flat).view(batch, context, kv_heads, head_dim).transpose(1, 2)
        return k, v

    def gather_sdpa():
        k, v = gathered()
        F.scaled_dot_product_attention(q.view(batch, kv_heads, group, head_dim), k, v, scale=scale)

    k_pre, v_pre = (t.contiguous() for t in gathered())

    def sdpa_only():
        F.scaled_dot_product_attention(q.view(batch, kv_heads, group, head_dim), k_pre, v_pre, scale=scale)

    elem = k_cache.element_size()
    bytes_moved = 2 * slots * kv_heads * head_dim * elem + slots * 4 + 2 * q.numel() * elem
    t_kernel = _timer(kernel, device, reps)
    t_gather = _timer(gather_sdpa, device, reps)
    t_sdpa = _timer(sdpa_only, device, reps)
    gbps = bytes_moved / t_kernel / 1e6
    return DecodeRow(batch, context, bytes_moved, t_kernel, gbps, (100 * gbps / hbm) if hbm else None,
                     (100 * gbps / copy) if copy else None, t_gather, t_sdpa, bytes_moved / t_gather / 1e6)


def engine_decode_throughput(device: str, dtype: str, batch: int, new_tokens: int, num_layers: int, hidden: int,
                             heads: int, kv_heads: int) -> dict:
    """Output tokens/s of the engine decoding `batch` requests on a random-weight Llama built to the given size."""
    from sglpy.runtime.engine import Engine
    from sglpy.runtime.testing import make_tiny_model

    folder = os.path.join(tempfile.gettempdir(), f"sglpy-bench-llama-{num_layers}x{hidden}-{heads}-{kv_heads}")
    make_tiny_model(folder, num_layers=num_layers, hidden=hidden, heads=heads, kv_heads=kv_heads, max_pos=4096)
    eng = Engine(model=folder, device=device, dtype=dtype, max_running_requests=max(batch, 1))
    try:
        params = {"max_new_tokens": new_tokens, "temperature": 0, "ignore_eos": True}
        prompts = [f"Request {i}: tell me a story about the number {i}." for i in range(batch)]
        eng.generate(prompt=prompts[:2], sampling_params={**params, "max_new_tokens": 4})  # warm-up, compiles
        t0 = time.perf_counter()
        outs = eng.generate(prompt=prompts, sampling_params=params)
        wall = time.perf_counter() - t0
    finally:
        eng.shutdown()
    tokens = sum(o["meta_info"]["completion_tokens"] for o in outs)
    return {"batch": batch, "new_tokens": new_tokens, "output_tokens": tokens, "wall_s": wall,
            "output_tok_per_s": tokens / wall, "kernels": "triton" if device.startswith("cuda") and
            os.environ.get("SGLPY_DISABLE_TRITON", "0") in ("", "0") else "torch"}


def _ints(s: str) -> list[int]:
    return [int(x) for x in s.split(",") if x]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--dtype", default=None, help="default bfloat16 on CUDA, float32 on CPU")
    ap.add_argument("--batch", type=_ints, default=None, help="comma list (default 1,8,32,64,128; CPU 1,8)")
    ap.add_argument("--context", type=_ints, default=None, help="comma list (default 512..32768; CPU 256,1024)")
    ap.add_argument("--heads", type=int, default=32)
    ap.add_argument("--kv-heads", type=int, default=8)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--hbm-gbps", type=float, default=None, help="override the spec bandwidth for %% HBM")
    ap.add_argument("--max-gib", type=float, default=16.0, help="skip shapes whose K/V exceed this")
    ap.add_argument("--engine", action="store_true", help="also measure engine decode throughput (~1B Llama)")
    ap.add_argument("--engine-batch", type=_ints, default=[1, 16, 64])
    ap.add_argument("--engine-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--json", default=None, help="write all results to this file")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)

    device = torch.device(args.device)
    on_cuda = device.type == "cuda"
    dtype = getattr(torch, args.dtype or ("bfloat16" if on_cuda else "float32"))
    batches = args.batch or ([1, 8, 32, 64, 128] if on_cuda else [1, 8])
    contexts = args.context or ([512, 2048, 8192, 32768] if on_cuda else [256, 1024])
    hbm = args.hbm_gbps or hbm_spec_gbps(device)
    result: dict = {"device": torch.cuda.get_device_name(device) if on_cuda else "cpu", "dtype": str(dtype),
                    "heads": args.heads, "kv_heads": args.kv_heads, "head_dim": args.head_dim,
                    "hbm_spec_gbps": hbm, "copy_gbps": copy_gbps(device, 1024 if on_cuda else 256), "decode": []}
    print(f"# {result['device']} {dtype} heads={args.heads} kv_heads={args.kv_heads} head_dim={args.head_dim} "
          f"spec={hbm} GB/s copy={result['copy_gbps']:.0f} GB/s")
    print(f"{'batch':>6} {'context':>8} {'kernel ms':>10} {'GB/s':>8} {'%HBM':>6} {'%copy':>6} {'gather+sdpa ms':>15} "
          f"{'GB/s':>8} {'sdpa-only ms':>13}")
    for b in batches:
        for ctx in contexts:
            kv_bytes = 2 * b * ctx * args.kv_heads * args.head_dim * torch.empty(0, dtype=dtype).element_size()
            if kv_bytes * 2 > args.max_gib * 2**30:  # x2: the torch path materialises a gathered copy
                continue
            row = bench_decode(b, ctx, args.heads, args.kv_heads, args.head_dim, dtype, device, args.reps, hbm,
                               result["copy_gbps"])
            result["decode"].append(asdict(row))
            pct = f"{row.kernel_pct_hbm:6.1f}" if row.kernel_pct_hbm is not None else f"{'-':>6}"
            print(f"{b:>6} {ctx:>8} {row.kernel_ms:>10.3f} {row.kernel_gbps:>8.1f} {pct} {row.kernel_pct_copy:6.1f} "
                  f"{row.torch_gather_sdpa_ms:>15.3f} {row.torch_gather_sdpa_gbps:>8.1f} "
                  f"{row.torch_sdpa_only_ms:>13.3f}")
            del row
            if on_cuda:
                torch.cuda.empty_cache()
    if args.engine:
        # ~1B: 24 layers x hidden 2048 (MLP 4096), 32 heads / 8 kv heads (head_dim 64), vocab 49152.
        result["engine"] = []
        for b in args.engine_batch:
            r = engine_decode_throughput(args.device, str(dtype).replace("torch.", ""), b, args.engine_new_tokens,
                                         num_layers=24, hidden=2048, heads=32, kv_heads=8)
            result["engine"].append(r)
            print(f"engine batch={b}: {r['output_tok_per_s']:.1f} output tok/s ({r['output_tokens']} tokens in "
                  f"{r['wall_s']:.2f}s, kernels={r['kernels']})")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

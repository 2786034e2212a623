"""Engine decode on a ~1B random-weight Llama (bf16): Triton vs torch kernels, CUDA graphs and overlap on/off.

  python benchmarks/gpu_engine.py [--json out.json]          # on the GPU machine (benchmarks/run_gpu_all.sh)
  python benchmarks/gpu_engine.py --smoke                    # CPU: tiny model, few tokens; checks it starts

The model is runtime/testing's preset llama-1b (Llama-3.2-1B's shapes, vocabulary cut to 49152, tied
embedding). Workloads: decode at batch 1 and batch 64 (prompt ~64 tokens, 256 new tokens, greedy,
ignore_eos), and a mixed batch (64 requests, prompts 50-500, outputs 32-256 tokens). Configurations:
kernels (triton | torch via SGLPY_DISABLE_TRITON=1) x CUDA graphs (on | off) x overlap (on | off); graphs
need Triton, so torch runs without them. The bandwidth floor of a decode step is the bytes it must read
(every weight once, plus the K/V of every cached token) over a measured device-to-device copy rate;
"x floor" is measured decode ms per step over that floor (target <= 1.3 at batch 1). With --profile, a
torch.profiler trace of a few decode steps reports the device's idle time between kernels per step (the
CPU gap overlap scheduling should remove).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import sys
import time

import torch



def _copy_gbps(device: torch.device, mib: int) -> float:
    """benchmarks/kernels.py's measured copy ceiling (loaded by path: `kernels` is also sglpy's kernel package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_kernels", os.path.join(os.path.dirname(__file__), "kernels.py"))
    mod = importlib.util.module_from_spec(spec)
    sys.modules["bench_kernels"] = mod  # its dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod.copy_gbps(device, mib)


PROMPT_TOKENS = 64


def model_bytes(eng) -> int:
    """Bytes a decode step reads from the weights: every parameter once (the tied embedding as the lm_head)."""
    return sum(p.numel() * p.element_size() for p in eng.runner.model.parameters())


def kv_bytes_per_token(eng) -> int:
    r = eng.runner
    return 2 * r.num_layers * r.num_kv_heads * r.head_dim * eng.kv.buffers.k_buffer.element_size()


def decode_prompts(tok, batch: int) -> list[list[int]]:
    """batch prompts of PROMPT_TOKENS ids each (distinct, so the prefix cache does not share them)."""
    base = tok.encode("The quick brown fox jumps over the lazy dog. " * 40)
    return [[(t + i) % 1000 + 100 for t in base[:PROMPT_TOKENS]] for i in range(batch)]


def mixed_workload(n: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    rng = random.Random(seed)
    prompts = [[rng.randint(100, 40000) for _ in range(rng.randint(50, 500))] for _ in range(n)]
    return prompts, [rng.randint(32, 256) for _ in range(n)]


def gap_profile(eng, prompts, new_tokens: int) -> dict:
    """Device idle time between consecutive kernels, per decode step, from a torch.profiler trace."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        eng.generate(input_ids=prompts, sampling_params={"max_new_tokens": new_tokens, "temperature": 0,
                                                         "ignore_eos": True})
    kernels = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                     if e.device_type == torch.autograd.DeviceType.CUDA)
    if len(kernels) < 2:
        return {"kernels": len(kernels)}
    busy_end, idle = kernels[0][1], 0.0
    for start, end in kernels[1:]:
        if start > busy_end:
            idle += start - busy_end
        busy_end = max(busy_end, end)
    span = busy_end - kernels[0][0]
    return {"kernels": len(kernels), "span_us": span, "idle_us": idle, "idle_share": idle / span,
            "idle_us_per_step": idle / new_tokens}


def host_profile(eng, prompts, sps) -> str:
    """cProfile of the step loop (the loop thread) over one more run: the top functions by own time."""
    from host_overhead import profile_text, profiled_steps

    with profiled_steps(eng) as prof:
        eng.generate(input_ids=prompts, sampling_params=sps)
    return profile_text(prof, top=28)


def run_config(path: str, kernels: str, graphs: bool, overlap: bool, workloads: list[str], args, dev: str,
               floor_gbps: float) -> list[dict]:
    from sglpy.runtime.engine import Engine

    if kernels == "torch":
        os.environ["SGLPY_DISABLE_TRITON"] = "1"
    else:
        os.environ.pop("SGLPY_DISABLE_TRITON", None)
    eng = Engine(path, device=dev, dtype=args.dtype, max_total_tokens=args.max_total_tokens,
                 max_running_requests=max(64, args.batch_large), disable_cuda_graph=not graphs,
                 disable_overlap_schedule=not overlap, cuda_graph_max_bs=max(64, args.batch_large))
    rows = []
    try:
        label = f"{kernels:<6} graphs={'on ' if graphs else 'off'} overlap={'on ' if overlap else 'off'}"
        active = {"graphs": eng.runner.graphs is not None and bool(eng.runner.graphs.graphs or not
                                                                    eng.runner.device.type == "cuda"),
                  "overlap": eng.overlap is not None}
        # the engine builds jump-forward's tokenizer tables on a background thread; holding the GIL for 1-2 s,
        # it slowed whichever configuration ran first (seen in the CPU smoke run): build them before timing
        info = eng.constrained.info
        _ = info.trie, info.sorted_tokens, info.longest_token, info.first_byte_masks
        weights = model_bytes(eng)
        per_tok = kv_bytes_per_token(eng)
        sp = {"temperature": 0, "ignore_eos": True}
        eng.generate(input_ids=decode_prompts(eng.tokenizer, 2), sampling_params={**sp, "max_new_tokens": 8})
        for wl in workloads:
            if wl == "mixed":
                prompts, outs = mixed_workload(args.batch_large)
                sps = [{**sp, "max_new_tokens": n} for n in outs]
                new = max(outs)
            else:
                b = 1 if wl == "decode-b1" else args.batch_large
                prompts, new = decode_prompts(eng.tokenizer, b), args.new_tokens
                sps = {**sp, "max_new_tokens": new}
            timed = []
            for _ in range(args.repeat):  # the median run by wall time
                if dev == "cuda":
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                res = eng.generate(input_ids=prompts, sampling_params=sps)
                timed.append((time.perf_counter() - t0, res))
            wall, res = sorted(timed, key=lambda x: x[0])[len(timed) // 2]
            toks = sum(o["meta_info"]["completion_tokens"] for o in res)
            row = {"config": label, "workload": wl, "kernels": kernels, "graphs": active["graphs"],
                   "overlap": active["overlap"], "requests": len(prompts), "output_tokens": toks, "wall_s": wall,
                   "output_tok_s": toks / wall}
            if wl != "mixed":
                # one step per new token; the first includes the prefill of every prompt
                ttft = sorted(o["meta_info"].get("ttft") or 0.0 for o in res)[len(res) // 2]
                step_ms = (wall - ttft) / max(new - 1, 1) * 1e3
                avg_ctx = PROMPT_TOKENS + new / 2
                floor_bytes = weights + len(prompts) * avg_ctx * per_tok
                floor_ms = floor_bytes / (floor_gbps * 1e9) * 1e3
                row.update(step_ms=step_ms, floor_ms=floor_ms, x_floor=step_ms / floor_ms)
            if args.profile and dev == "cuda" and wl != "mixed":
                row["profile"] = gap_profile(eng, prompts, min(new, 32))
            if args.host_profile and wl != "mixed":
                row["host_profile"] = host_profile(eng, prompts, sps)
            rows.append(row)
            extra = (f" step {row['step_ms']:.2f} ms, floor {row['floor_ms']:.2f} ms, x{row['x_floor']:.2f}"
                     if "step_ms" in row else "")
            prof = row.get("profile", {})
            extra += f", device idle {prof['idle_us_per_step']:.0f} us/step" if "idle_us_per_step" in prof else ""
            print(f"{label} {wl:<10} {row['output_tok_s']:>9.1f} tok/s{extra}", flush=True)
            if "host_profile" in row:
                print(row["host_profile"], flush=True)
    finally:
        eng.shutdown()
        del eng
        gc.collect()
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="CPU, tiny model, few tokens: checks the script runs")
    ap.add_argument("--model", default=None, help="default preset:llama-1b (smoke: a tiny 2-layer model)")
    ap.add_argument("--dtype", default=None, help="default bfloat16 (smoke: float32)")
    ap.add_argument("--new-tokens", type=int, default=256)
    ap.add_argument("--batch-large", type=int, default=64)
    ap.add_argument("--max-total-tokens", type=int, default=131072)
    ap.add_argument("--workloads", default="decode-b1,decode-b64,mixed")
    ap.add_argument("--configs", default="all", help="all, or a comma list like triton:graphs:overlap,torch::")
    ap.add_argument("--profile", action="store_true", help="device idle time between kernels (torch.profiler)")
    ap.add_argument("--host-profile", action="store_true",
                    help="cProfile of the step loop over one more run of each decode workload (top by own time)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per workload; the median is kept")
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    from sglpy.runtime.testing.tiny_model import make_tiny_model, model_from_spec

    if args.smoke:
        import tempfile

        dev = "cpu"
        args.dtype = args.dtype or "float32"
        args.new_tokens, args.batch_large, args.max_total_tokens = 6, 4, 4096
        path = args.model or make_tiny_model(os.path.join(tempfile.gettempdir(), "sglpy-bench-smoke-tiny"))
        print("# CPU SMOKE RUN: checks the benchmark starts; these are not GPU numbers and are not recorded")
    else:
        if not torch.cuda.is_available():
            print("no CUDA device: run on the GPU machine, or pass --smoke", file=sys.stderr)
            return 2
        dev = "cuda"
        args.dtype = args.dtype or "bfloat16"
        path = model_from_spec(args.model or "preset:llama-1b")
    copy = _copy_gbps(torch.device(dev), 1024 if dev == "cuda" else 64)
    name = torch.cuda.get_device_name() if dev == "cuda" else "cpu"
    print(f"# {name}, {args.dtype}, model {path}, measured copy {copy:.0f} GB/s (read+write)")
    if args.configs == "all":
        configs = [("triton", True, True), ("triton", False, True), ("triton", True, False),
                   ("triton", False, False), ("torch", False, True), ("torch", False, False)]
    else:
        configs = [(k, g == "graphs", o == "overlap") for k, g, o in (c.split(":") for c in args.configs.split(","))]
    workloads = [w for w in args.workloads.split(",") if w]
    workloads = [w.replace("b64", f"b{args.batch_large}") if w.startswith("decode-b6") else w for w in workloads]
    rows = []
    for kernels, graphs, overlap in configs:
        rows += run_config(path, kernels, graphs, overlap, workloads, args, dev, copy)
    result = {"device": name, "dtype": args.dtype, "model": path, "copy_gbps": copy, "smoke": args.smoke,
              "rows": rows}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

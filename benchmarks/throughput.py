"""Offline throughput: 64 requests at once on the default model, sglpy Engine vs HF transformers.

python benchmarks/throughput.py [--requests 64] [--hf-seq-requests 8] [--hf-batches 1] [--threads 2]

Prompts are 50-500 tokens, outputs 32-256 tokens (ignore_eos), seeded. HF sequential and HF static
batching (batch 16, left-padded) run on a subset (their rates are per-token, so a subset measures
them; the full set would take ~15 minutes of HF time) -- the printed table says how many.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

import torch

TEXT = ("The history of computing is a story of abstraction layered on abstraction. Early machines were "
        "programmed by rewiring panels; later, stored programs let the same hardware run different tasks. "
        "Compilers turned readable code into instructions, and operating systems shared one machine among "
        "many users. Networks connected machines into systems, and the web turned those systems into a "
        "platform for everyone. Each step hid complexity behind an interface and made new things possible. ")


def make_workload(tok, n: int, seed: int = 0):
    """n (prompt_ids, output_len) pairs: prompts 50-500 tokens, outputs 32-256 tokens."""
    rng = random.Random(seed)
    base = tok.encode(TEXT * 20)
    work = []
    for i in range(n):
        plen = rng.randint(50, 500)
        start = rng.randint(0, len(base) - plen - 1)
        work.append((base[start:start + plen], rng.randint(32, 256)))
    return work


def bench_engine(path, work, label, **engine_kw):
    from sglpy.runtime.engine import Engine

    eng = Engine(path, **engine_kw)
    eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})  # warm-up
    t0 = time.perf_counter()
    outs = eng.generate(input_ids=[w[0] for w in work],
                        sampling_params=[{"max_new_tokens": w[1], "ignore_eos": True, "temperature": 0} for w in work])
    dt = time.perf_counter() - t0
    steps = eng.get_server_info()["num_steps"]
    eng.shutdown()
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    ttft = [o["meta_info"]["ttft"] for o in outs]
    tpot = [(o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"]) / max(o["meta_info"]["completion_tokens"] - 1, 1)
            for o in outs]
    return dict(name=label, requests=len(work), out_tokens=n_out, seconds=dt, tok_s=n_out / dt,
                ttft_p50=statistics.median(ttft), tpot_p50=statistics.median(tpot), steps=steps)


def bench_hf_sequential(path, work):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    n_out, ttfts, tpots = 0, [], []
    t0 = time.perf_counter()
    for ids, out_len in work:
        x = torch.tensor([ids])
        with torch.no_grad():
            t = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - t
            t = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False)
            total = time.perf_counter() - t
        ttfts.append(ttft)
        tpots.append((total - ttft) / max(out_len - 1, 1))
        n_out += out_len
    # the ttft probe ran each prompt's prefill twice; charge only the real generate call
    dt = time.perf_counter() - t0 - sum(ttfts)
    return dict(name="HF sequential", requests=len(work), out_tokens=n_out, seconds=dt, tok_s=n_out / dt,
                ttft_p50=statistics.median(ttfts), tpot_p50=statistics.median(tpots), steps=None)


def bench_hf_static(path, work, batch=16):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    n_out, t0, lat = 0, time.perf_counter(), []
    for b in range(0, len(work), batch):
        chunk = work[b:b + batch]
        width = max(len(w[0]) for w in chunk)
        out_len = max(w[1] for w in chunk)  # static batching: the batch runs until its longest output
        ids = torch.tensor([[pad] * (width - len(w[0])) + w[0] for w in chunk])
        mask = torch.tensor([[0] * (width - len(w[0])) + [1] * len(w[0]) for w in chunk])
        t = time.perf_counter()
        with torch.no_grad():
            model.generate(ids, attention_mask=mask, max_new_tokens=out_len, min_new_tokens=out_len, do_sample=False)
        lat.append(time.perf_counter() - t)
        n_out += sum(w[1] for w in chunk)  # only the tokens each request asked for count
    dt = time.perf_counter() - t0
    return dict(name=f"HF static batch {batch}", requests=len(work), out_tokens=n_out, seconds=dt,
                tok_s=n_out / dt, ttft_p50=statistics.median(lat), tpot_p50=None, steps=None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-seq-requests", type=int, default=8)
    ap.add_argument("--hf-batches", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--profile", action="store_true", help="print a torch profile of the sglpy run")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoTokenizer

    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(path)
    work = make_workload(tok, args.requests)
    print(f"workload: {len(work)} requests, prompt tokens {sum(len(w[0]) for w in work)}, "
          f"output tokens {sum(w[1] for w in work)}, torch threads {args.threads}")
    rows = []
    if args.profile:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as prof:
            rows.append(bench_engine(path, work, "sglpy Engine", num_threads=args.threads))
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
    else:
        rows.append(bench_engine(path, work, "sglpy Engine", num_threads=args.threads))
    if not args.skip_hf:
        rows.append(bench_hf_sequential(path, work[: args.hf_seq_requests]))
        rows.append(bench_hf_static(path, work[: 16 * args.hf_batches]))
    print(f"\n{'system':<20}{'reqs':>6}{'out tok':>9}{'sec':>9}{'tok/s':>9}{'TTFT p50':>10}{'TPOT p50':>10}")
    for r in rows:
        tpot = f"{r['tpot_p50'] * 1000:.0f}ms" if r["tpot_p50"] is not None else "-"
        print(f"{r['name']:<20}{r['requests']:>6}{r['out_tokens']:>9}{r['seconds']:>9.1f}{r['tok_s']:>9.1f}"
              f"{r['ttft_p50']:>9.2f}s{tpot:>10}")
    if len(rows) == 3:
        print(f"\nsglpy / HF sequential: {rows[0]['tok_s'] / rows[1]['tok_s']:.1f}x   "
              f"sglpy / HF static batch: {rows[0]['tok_s'] / rows[2]['tok_s']:.1f}x   (targets: 10x, 3x)")
        print("(HF static-batch TTFT column is the whole batch latency: static batching returns nothing earlier)")


if __name__ == "__main__":
    main()

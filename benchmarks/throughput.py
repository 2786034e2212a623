"""Offline throughput on the default model, sglpy Engine per quantization / KV-cache mode vs HF fp32 in the same run.

python benchmarks/throughput.py [--modes none,int8,int4] [--requests 64] [--hf-seq-requests 8]
                                [--hf-batches 1] [--threads 2] [--skip-batch] [--skip-hf] [--profile]

Per mode (`quantization[:kv_cache_dtype]`, e.g. `int4:bf16`): one request alone (128 new tokens, greedy,
ignore_eos, a chat prompt), one JSON-schema request alone (4 fields, greedy, jump-forward on), and the
batch: 64 requests at once, prompts 50-500 tokens, outputs 32-256 tokens (ignore_eos), seeded. HF fp32
runs the single request (before and after the sglpy modes, to show drift on a shared box), sequential and
static batching (batch 16, left-padded) on a subset (their rates are per token, so a subset measures
them; the full set would take ~15 minutes of HF time) -- the printed table says how many.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
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


SINGLE_PROMPT = "Write a short story about a robot who learns to paint."
SINGLE_TOKENS = 128
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                "city": {"type": "string", "maxLength": 20},
                                                "is_student": {"type": "boolean"}},
               "required": ["name", "age", "city", "is_student"], "additionalProperties": False}
JSON_PROMPT = "Describe a fictional person as JSON with the keys name, age, city and is_student."


def parse_mode(mode: str) -> dict:
    """'int4:bf16' -> engine kwargs {'quantization': 'int4', 'kv_cache_dtype': 'bf16'}."""
    quant, _, kv = mode.partition(":")
    return {"quantization": quant or "none", "kv_cache_dtype": kv or "auto"}


def chat_ids(tok, text: str) -> list[int]:
    """Token ids of a one-turn chat prompt with the generation prompt appended."""
    return tok.encode(tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                              add_generation_prompt=True))


def best_of(fn, reps: int) -> tuple[float, float]:
    """(wall, process CPU) seconds of the fastest of reps calls (on a shared box the minimum is the least
    disturbed run; CPU time, all threads of this process, is what the work cost whatever the load)."""
    runs = []
    for _ in range(reps):
        t, c = time.perf_counter(), time.process_time()
        fn()
        runs.append((time.perf_counter() - t, time.process_time() - c))
    return min(runs)


def bench_engine_single(eng, tok, reps: int) -> dict:
    """One request alone: 128 greedy tokens (tok/s, end to end), and one JSON-schema request (seconds)."""
    ids = chat_ids(tok, SINGLE_PROMPT)
    sp = {"max_new_tokens": SINGLE_TOKENS, "temperature": 0, "ignore_eos": True}
    dt, cpu = best_of(lambda: eng.generate(input_ids=ids, sampling_params=sp), reps)
    jids = chat_ids(tok, JSON_PROMPT)
    jsp = {"max_new_tokens": 96, "temperature": 0, "json_schema": json.dumps(JSON_SCHEMA)}
    eng.generate(input_ids=jids, sampling_params=jsp)  # compiles the schema (cached after)
    outs = []

    def one_json():
        eng.flush_cache()  # no prompt reuse between repetitions: each run prefills like a first request
        outs.append(eng.generate(input_ids=jids, sampling_params=jsp))

    jdt, _ = best_of(one_json, reps)
    o = outs[-1]
    json.loads(o["text"])  # must parse: constrained output stays valid in every mode
    return dict(single_tok_s=SINGLE_TOKENS / dt, single_tok_cpu_s=SINGLE_TOKENS / cpu, json_s=jdt, json_tokens=o["meta_info"]["completion_tokens"],
                json_jumped=o["meta_info"].get("jump_forward_tokens", 0))


def bench_hf_single(model, tok, reps: int) -> tuple[float, float]:
    """HF fp32 generate() of the same single request: (tok/s end to end, tok per CPU-second)."""
    x = torch.tensor([chat_ids(tok, SINGLE_PROMPT)])
    kw = dict(attention_mask=torch.ones_like(x), max_new_tokens=SINGLE_TOKENS, min_new_tokens=SINGLE_TOKENS,
              do_sample=False)
    with torch.no_grad():
        model.generate(x, **dict(kw, max_new_tokens=4, min_new_tokens=4))  # warm-up
        dt, cpu = best_of(lambda: model.generate(x, **kw), reps)
    return SINGLE_TOKENS / dt, SINGLE_TOKENS / cpu


def bench_engine(path, work, label, eng=None, **engine_kw):
    from sglpy.runtime.engine import Engine

    own = eng is None
    if own:
        eng = Engine(path, **engine_kw)
    eng.generate(input_ids=[1, 2, 3], sampling_params={"max_new_tokens": 2})  # warm-up
    steps0 = eng.get_server_info()["num_steps"]
    t0, c0 = time.perf_counter(), time.process_time()
    outs = eng.generate(input_ids=[w[0] for w in work],
                        sampling_params=[{"max_new_tokens": w[1], "ignore_eos": True, "temperature": 0} for w in work])
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    steps = eng.get_server_info()["num_steps"] - steps0
    if own:
        eng.shutdown()
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    ttft = [o["meta_info"]["ttft"] for o in outs]
    tpot = [(o["meta_info"]["e2e_latency"] - o["meta_info"]["ttft"]) / max(o["meta_info"]["completion_tokens"] - 1, 1)
            for o in outs]
    return dict(name=label, requests=len(work), out_tokens=n_out, seconds=dt, tok_s=n_out / dt, cpu_s=cpu,
                ttft_p50=statistics.median(ttft), tpot_p50=statistics.median(tpot), steps=steps)


def bench_hf_sequential(model, work):
    n_out, ttfts, tpots, probe_cpu = 0, [], [], 0.0
    t0, c0 = time.perf_counter(), time.process_time()
    for ids, out_len in work:
        x = torch.tensor([ids])
        with torch.no_grad():
            t, c = time.perf_counter(), time.process_time()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=1, do_sample=False)
            ttft = time.perf_counter() - t
            probe_cpu += time.process_time() - c
            t = time.perf_counter()
            model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=out_len, min_new_tokens=out_len,
                           do_sample=False)
            total = time.perf_counter() - t
        ttfts.append(ttft)
        tpots.append((total - ttft) / max(out_len - 1, 1))
        n_out += out_len
    # the ttft probe ran each prompt's prefill twice; charge only the real generate call
    dt = time.perf_counter() - t0 - sum(ttfts)
    cpu = time.process_time() - c0 - probe_cpu
    return dict(name="HF sequential", requests=len(work), out_tokens=n_out, seconds=dt, tok_s=n_out / dt, cpu_s=cpu,
                ttft_p50=statistics.median(ttfts), tpot_p50=statistics.median(tpots), steps=None)


def bench_hf_static(model, tok, work, batch=16):
    pad = tok.pad_token_id if tok.pad_token_id is not None else 0
    n_out, t0, c0, lat = 0, time.perf_counter(), time.process_time(), []
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
                tok_s=n_out / dt, cpu_s=time.process_time() - c0, ttft_p50=statistics.median(lat), tpot_p50=None, steps=None)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="none,int8,int4", help="quantization[:kv_cache_dtype], comma-separated")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--hf-seq-requests", type=int, default=8)
    ap.add_argument("--hf-batches", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3, help="repetitions of the single-request runs (best kept)")
    ap.add_argument("--skip-hf", action="store_true")
    ap.add_argument("--skip-batch", action="store_true", help="single-request rows only")
    ap.add_argument("--profile", action="store_true", help="print a torch profile of each sglpy batch run")
    ap.add_argument("--json", default=None, help="write the results here")
    ap.add_argument("--max-total-tokens", type=int, default=40000,
                    help="KV pool of each engine (the batch needs ~28k slots; smaller than the 65536 default so "
                         "the benchmark fits beside other jobs on a shared box)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from sglpy.runtime.engine import Engine
    from sglpy.runtime.engine.cpu_threads import on_own_thread
    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(path)
    work = make_workload(tok, args.requests)
    print(f"workload: {len(work)} requests, prompt tokens {sum(len(w[0]) for w in work)}, "
          f"output tokens {sum(w[1] for w in work)}, torch threads {args.threads}, load {os.getloadavg()}")
    # HF runs on short-lived threads: torch work on this (long-lived) thread would give it a second OpenMP pool
    # and slow every engine step (docs/runtime.md, "CPU threads")
    hf = None if args.skip_hf else on_own_thread(
        lambda: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())
    hf_single = [on_own_thread(bench_hf_single, hf, tok, args.reps)] if hf is not None else []
    modes, rows = [], []
    for mode in args.modes.split(","):
        eng = Engine(path, num_threads=args.threads, max_total_tokens=args.max_total_tokens, **parse_mode(mode))
        m = dict(mode=mode, **bench_engine_single(eng, tok, args.reps))
        if not args.skip_batch:
            label = f"sglpy {mode}"
            if args.profile:
                from torch.profiler import ProfilerActivity, profile

                with profile(activities=[ProfilerActivity.CPU]) as prof:
                    rows.append(bench_engine(path, work, label, eng=eng))
                print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
            else:
                rows.append(bench_engine(path, work, label, eng=eng))
            m["batch_tok_s"] = rows[-1]["tok_s"]
        eng.shutdown()
        del eng
        gc.collect()  # free this mode's KV pool and weights before the next mode loads (shared-memory box)
        modes.append(m)
        print(f"{mode}: {m}, load {os.getloadavg()[0]:.2f}", flush=True)
    if hf is not None:
        hf_single.append(on_own_thread(bench_hf_single, hf, tok, args.reps))
        if not args.skip_batch:
            rows.append(on_own_thread(bench_hf_sequential, hf, work[: args.hf_seq_requests]))
            rows.append(on_own_thread(bench_hf_static, hf, tok, work[: 16 * args.hf_batches]))
    report(modes, rows, hf_single, args)


def report(modes, rows, hf_single, args):
    """Print the batch table and the per-mode table with ratios to HF fp32 from the same run."""
    if rows:
        print(f"\n{'system':<20}{'reqs':>6}{'out tok':>9}{'sec':>9}{'tok/s':>9}{'tok/CPU-s':>10}{'TTFT p50':>10}"
              f"{'TPOT p50':>10}")
        for r in rows:
            tpot = f"{r['tpot_p50'] * 1000:.0f}ms" if r["tpot_p50"] is not None else "-"
            print(f"{r['name']:<20}{r['requests']:>6}{r['out_tokens']:>9}{r['seconds']:>9.1f}{r['tok_s']:>9.1f}"
                  f"{r['out_tokens'] / r['cpu_s']:>10.1f}{r['ttft_p50']:>9.2f}s{tpot:>10}")
        print("(HF static-batch TTFT column is the whole batch latency: static batching returns nothing earlier)")
    hf_seq = next((r["tok_s"] for r in rows if r["name"] == "HF sequential"), None)
    hf_static = next((r["tok_s"] for r in rows if r["name"].startswith("HF static")), None)
    hf_one = max(x[0] for x in hf_single) if hf_single else None
    hf_one_cpu = max(x[1] for x in hf_single) if hf_single else None
    if hf_single:
        print(f"\nHF fp32 single request: {', '.join(f'{x[0]:.1f}' for x in hf_single)} tok/s (before, after), "
              f"{', '.join(f'{x[1]:.1f}' for x in hf_single)} tok per CPU-s; ratios use the faster")
    print(f"\n{'mode':<12}{'1 req tok/s':>12}{'vs HF':>7}{'tok/CPU-s':>10}{'vs HF':>7}{'JSON req s':>11}{'jumped':>8}"
          f"{'batch tok/s':>12}{'vs HF seq':>10}{'vs HF static':>13}")
    for m in modes:
        ratio = lambda a, b: f"{a / b:.1f}x" if a is not None and b else "-"  # noqa: E731
        batch = m.get("batch_tok_s")
        print(f"{m['mode']:<12}{m['single_tok_s']:>12.1f}{ratio(m['single_tok_s'], hf_one):>7}"
              f"{m['single_tok_cpu_s']:>10.1f}{ratio(m['single_tok_cpu_s'], hf_one_cpu):>7}{m['json_s']:>10.2f}s"
              f"{m['json_jumped']:>4}/{m['json_tokens']:<3}{(f'{batch:.1f}' if batch else '-'):>12}"
              f"{ratio(batch, hf_seq):>10}{ratio(batch, hf_static):>13}")
    print("targets: 1 req >= 3x HF fp32; JSON req <= 0.35-0.40 s (llama.cpp); batch >= 10x HF seq, >= 3x HF static")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(modes=modes, rows=rows, hf_single=hf_single, threads=args.threads), f, indent=1)


if __name__ == "__main__":
    main()

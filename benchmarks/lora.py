"""LoRA adapters per request on the default model (CPU by default): a batch of 16 requests over 8 adapters against
the same 16 on the base model and against the 8 adapters served one after another; one adapter's single request
against the base's; and how long a run-time adapter load pauses a running batch (the largest gap between a streamed
request's tokens while another thread loads an adapter, in decode steps).

    python benchmarks/lora.py                          # int4 base, rank 16 adapters on all 7 projections, 3 rounds
    python benchmarks/lora.py --quantization none --rank 8 --rounds 5 --json lora.json
    python benchmarks/lora.py --lora-dtype float32     # the adapter pool in float32 (auto: bf16 under int8/int4)

Rounds are interleaved (base, mixed, one-by-one, the same batches on the base, single base, single adapter per round); each figure is the
median over rounds with its min-max spread, in tokens per wall second and per process CPU second (steadier on a
shared box; with --threads 1 it is the work itself). Adapters have random weights (benchmarks at real shapes need no
trained adapter: the work is the same).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

PROMPT = "Write a short story about robot number {k}, who learns to paint."


def _adapters(base: str, folder: str, count: int, rank: int) -> list[str]:
    from sglpy.runtime.testing.tiny_lora import module_shapes, write_random_adapter

    layers, mods = module_shapes(base)
    return [f"a{k}=" + write_random_adapter(os.path.join(folder, f"a{k}"), layers, mods, rank, seed=k)
            for k in range(count)]


def _rate(run) -> tuple[float, float]:
    """(tokens per wall second, tokens per process CPU second) of run() -> tokens. The CPU rate counts every
    thread of the process (the engine's loop runs in it): steadier than wall time on a shared box."""
    t, c = time.perf_counter(), time.process_time()
    n = run()
    return n / (time.perf_counter() - t), n / (time.process_time() - c)


def _tok_s(eng, prompts, loras, sp) -> tuple[float, float]:
    eng.flush_cache()  # every run prefills its prompts: the same work in every mode

    def run():
        outs = eng.generate(prompts, sp, lora_path=loras)
        return sum(len(o["output_ids"]) for o in (outs if isinstance(outs, list) else [outs]))
    return _rate(run)


def _one_by_one(eng, prompts, loras, sp, adapters: int, base: bool = False) -> tuple[float, float]:
    """Each adapter's requests as their own batch, adapter after adapter (base: the same batches on the base model,
    the bound of mixed/one_by_one: what the base alone gains from one batch of all the requests)."""
    eng.flush_cache()

    def run():
        n = 0
        for a in range(adapters):
            idx = [i for i, name in enumerate(loras) if name == f"a{a}"]
            outs = eng.generate([prompts[i] for i in idx], sp, lora_path=None if base else [loras[i] for i in idx])
            n += sum(len(o["output_ids"]) for o in outs)
        return n
    return _rate(run)


def _load_pause(eng, folder: str, sp_long: dict) -> dict:
    """Token gaps of a streamed request (in a running batch) while another thread loads an adapter."""
    gaps, loaded = [], {}
    done = threading.Event()

    def load():
        time.sleep(0.5)
        t = time.perf_counter()
        eng.load_lora_adapter("late", folder)
        loaded.update(start=t, end=time.perf_counter())
        done.set()

    others = threading.Thread(target=lambda: eng.generate([PROMPT.format(k=k) for k in range(7)], sp_long))
    others.start()
    th = threading.Thread(target=load)
    last, stamps = None, []
    th.start()
    for _ in eng.generate(PROMPT.format(k=99), sp_long, stream=True):
        now = time.perf_counter()
        if last is not None:
            gaps.append(now - last)
            stamps.append(now)
        last = now
    th.join()
    others.join()
    eng.unload_lora_adapter("late")
    median = statistics.median(gaps)
    during = [g for g, s in zip(gaps, stamps) if loaded and loaded["start"] <= s <= loaded["end"] + median * 2]
    return {"load_s": loaded["end"] - loaded["start"], "median_step_s": median,
            "max_gap_during_load_steps": max(during, default=median) / median}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="HF folder or .gguf (default: the embedded default model)")
    ap.add_argument("--quantization", default="int4")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--lora-dtype", default="auto", help="the adapter pool's dtype: auto, float32, bfloat16")
    ap.add_argument("--adapters", type=int, default=8)
    ap.add_argument("--requests", type=int, default=16)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()

    from sglpy.runtime.engine import Engine
    from sglpy.runtime.model.loader import resolve_model_path

    base = resolve_model_path(args.model)
    folder = tempfile.mkdtemp(prefix="sglpy-lora-bench-")
    paths = _adapters(base, folder, args.adapters + 1, args.rank)
    late = paths.pop().split("=", 1)[1]
    eng = Engine(args.model, quantization=args.quantization, lora_paths=paths, max_total_tokens=8192,
                 lora_dtype=args.lora_dtype,
                 grammar_workers=0, **({"num_threads": args.threads} if args.threads else {}))
    sp = {"max_new_tokens": args.new_tokens, "temperature": 0, "ignore_eos": True}
    prompts = [PROMPT.format(k=k) for k in range(args.requests)]
    loras = [f"a{k % args.adapters}" for k in range(args.requests)]
    eng.generate(prompts[:2], sp, lora_path=loras[:2])  # warm-up (native kernels, first forwards)
    modes = ("base", "mixed", "one_by_one", "base_one_by_one", "single_base", "single_adapter")
    runs: dict[str, list[float]] = {k: [] for k in modes}  # tokens per wall second
    cpu: dict[str, list[float]] = {k: [] for k in modes}  # tokens per process CPU second
    for r in range(args.rounds):
        for mode, (wall, per_cpu) in (("base", _tok_s(eng, prompts, None, sp)),
                                      ("mixed", _tok_s(eng, prompts, loras, sp)),
                                      ("one_by_one", _one_by_one(eng, prompts, loras, sp, args.adapters)),
                                      ("base_one_by_one", _one_by_one(eng, prompts, loras, sp, args.adapters, True)),
                                      ("single_base", _tok_s(eng, prompts[0], None, sp)),
                                      ("single_adapter", _tok_s(eng, prompts[0], "a0", sp))):
            runs[mode].append(wall)
            cpu[mode].append(per_cpu)
        print(f"round {r}: " + ", ".join(f"{k} {runs[k][-1]:.1f} ({cpu[k][-1]:.1f} per CPU s)" for k in modes) +
              " tok/s", flush=True)

    def ratios_of(d):
        return {"mixed/base": [m / b for m, b in zip(d["mixed"], d["base"])],
                "mixed/one_by_one": [m / s for m, s in zip(d["mixed"], d["one_by_one"])],
                "base/base_one_by_one": [m / s for m, s in zip(d["base"], d["base_one_by_one"])],
                "single_adapter/single_base": [a / b for a, b in zip(d["single_adapter"], d["single_base"])]}
    ratios, cpu_ratios = ratios_of(runs), ratios_of(cpu)
    pause = _load_pause(eng, late, {"max_new_tokens": 48, "temperature": 0, "ignore_eos": True})
    eng.shutdown()
    med = lambda xs: (statistics.median(xs), min(xs), max(xs))  # noqa: E731
    print(f"\nquantization={args.quantization} lora_dtype={args.lora_dtype} rank={args.rank} adapters={args.adapters} "
          f"requests={args.requests} "
          f"new_tokens={args.new_tokens} rounds={args.rounds} threads={args.threads or 'default'}")
    for k, v in {**runs, **ratios}.items():
        m, lo, hi = med(v)
        mc, loc, hic = med({**cpu, **cpu_ratios}[k])
        print(f"{k:28s} wall: median {m:8.2f} (min {lo:.2f}, max {hi:.2f})   per CPU s: median {mc:8.2f} "
              f"(min {loc:.2f}, max {hic:.2f})")
    print(f"adapter load at run time: {pause['load_s']:.2f} s; largest token gap while loading = "
          f"{pause['max_gap_during_load_steps']:.2f} steps (median step {pause['median_step_s'] * 1e3:.0f} ms)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "runs": runs, "ratios": ratios, "cpu_runs": cpu, "cpu_ratios": cpu_ratios,
                       "load_pause": pause}, f, indent=1)


if __name__ == "__main__":
    main()

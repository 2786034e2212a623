"""Host overhead of the engine step: a tiny model whose forward costs about nothing, so the step is the host's work.

python benchmarks/host_overhead.py [--batches 1,16,64,256] [--cases greedy,sampled] [--tokens 128]
                                   [--prompt-len 32] [--reps 1] [--threads N] [--overlap] [--profile] [--parts]
                                   [--json]
                                   [--compare /path/to/other/tree] [--rounds 2]

A 2-layer, hidden-64 random model (the default tokenizer's 49,152-token vocabulary), Engine(quantization=
"none"), 32-token prompts, 128 new tokens, ignore_eos. Cases: `greedy` runs every batch in --batches;
`sampled` runs batch 64 (or the largest batch in --batches below it) with temperature 0.8, top_p 0.9, top_k 50,
frequency_penalty 0.5 and one stop string that never matches. Per run it prints the engine steps, the wall time
per step, the model's forward time per step (timed around the model call: embedding, 2 layers and the lm_head,
which at vocabulary 49,152 is not free at batch 256) and the rest, the host time, per step and per request-step.
--overlap runs the overlapped step order (the order CUDA runs by default; on CPU its tensors are synchronous), so
the host work of that order is measured too: its placeholders, readback and per-row validity checks.

--profile: cProfile of the step loop (the loop thread) per run, top 25 functions by own time.
--parts: the loop thread's CPU time per step inside the step's parts (schedule, prepare, sampling with its uniforms,
penalties, top-k candidates and candidate sampling, appends and stop checks, retire/emit), each timed in place;
a timer costs ~1 us per call, so parts called per request (none here) would be inflated.
--compare TREE: run each case alternately in this tree and in another checkout of sglpy (e.g. a `git worktree`
of the base commit), in fresh processes, --rounds times, and print both sides with their spread.
Keep a run short with --batches 1,64 --tokens 64; batch 256 at the base commit takes ~1 minute.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pathlib
import statistics
import subprocess
import sys
import tempfile
import time

PACKAGES = {"sglpy": "sglpy", "sglpy.grammar": "grammar", "sglpy.kernels": "kernels", "sglpy.runtime": "runtime"}
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "top_k": 50, "frequency_penalty": 0.5, "stop": ["<never matches>"]}


def use_tree(root: str) -> None:
    """Import sglpy from another checkout `root` (its source layout), ahead of the installed one."""
    import importlib.machinery
    import importlib.util

    class TreeFinder(importlib.machinery.PathFinder):
        @classmethod
        def find_spec(cls, fullname, path=None, target=None):
            if fullname in PACKAGES:
                init = pathlib.Path(root) / PACKAGES[fullname] / "__init__.py"
                return importlib.util.spec_from_file_location(fullname, init,
                                                              submodule_search_locations=[str(init.parent)])
            return None

    sys.meta_path.insert(0, TreeFinder)


def tiny_model(vocab: int = 49152) -> str:
    """The benchmark's model folder (built once under the temp folder); its vocabulary is the default tokenizer's
    (the engine refuses a model vocabulary smaller than its tokenizer's ids)."""
    from sglpy.runtime.testing.tiny_model import make_tiny_model

    folder = pathlib.Path(tempfile.gettempdir()) / f"sglpy-host-overhead-model-{vocab}"
    if not (folder / "config.json").exists():
        make_tiny_model(folder, num_layers=2, hidden=64, heads=4, kv_heads=2, seed=0, extra={"vocab_size": vocab})
    return str(folder)


class Clock:
    """Wall and loop-thread CPU seconds spent inside one method (wrapped in place)."""

    def __init__(self, obj, name: str):
        self.seconds = self.cpu = 0.0
        orig = getattr(obj, name)

        def timed(*a, **k):
            t, c = time.perf_counter(), time.thread_time()
            try:
                return orig(*a, **k)
            finally:
                self.seconds += time.perf_counter() - t
                self.cpu += time.thread_time() - c

        setattr(obj, name, timed)


def step_target(eng):
    """(object, attribute) of the step the loop thread calls, for profiling (its place differs across versions)."""
    stepper = getattr(getattr(eng, "loop", None), "stepper", None)  # the Engine holds its loop (engine/step.py)
    if stepper is not None:
        return stepper, "step"
    return eng, "step"  # before: the Engine was the loop (a mixin)


def part_clocks(eng) -> dict[str, Clock]:
    """Clocks around the parts of a step that exist in this checkout (they nest: top-k candidates and penalties run
    inside sampling, the stop strings inside appending)."""
    import importlib

    stepper, _ = step_target(eng)
    proc = getattr(stepper, "processor", None)
    sampler = getattr(proc, "sampler", None)
    targets = {"schedule": (getattr(stepper, "scheduler", None), "schedule"),
               "prepare": (proc, "prepare"), "sampling (launch)": (proc, "launch"),
               "uniforms": (sampler, "draw_uniforms"),
               "penalties": (getattr(sampler, "penalties", None), "apply"),
               "appends and stops (complete)": (proc, "complete"),
               "retire/emit": (stepper, "retire_emit")}
    for label, module, name in (("top-k candidates", "truncation", "top_candidates"),
                                ("candidate sampling", "sampler", "candidate_sample")):
        try:
            targets[label] = (importlib.import_module(f"sglpy.runtime.engine.{module}"), name)
        except ImportError:
            pass
    return {label: Clock(obj, name) for label, (obj, name) in targets.items()
            if obj is not None and callable(getattr(obj, name, None))}


@contextlib.contextmanager
def profiled_steps(eng):
    """cProfile of the step loop (the loop thread) inside the block; yields the cProfile.Profile."""
    import cProfile

    obj, name = step_target(eng)
    orig, prof = getattr(obj, name), cProfile.Profile()

    def profiled(*a, **k):
        prof.enable()
        try:
            return orig(*a, **k)
        finally:
            prof.disable()

    setattr(obj, name, profiled)
    try:
        yield prof
    finally:
        setattr(obj, name, orig)


def profile_text(prof, keys: tuple[str, ...] = ("tottime",), top: int = 25) -> str:
    """The top functions of a profile, per sort key (tottime: own time; cumulative)."""
    import io
    import pstats

    out = io.StringIO()
    for key in keys:
        pstats.Stats(prof, stream=out).sort_stats(key).print_stats(top)
    return out.getvalue()


def run_case(eng, batch: int, sampled: bool, tokens: int, prompt_len: int, profile: bool,
             parts: bool = False) -> dict:
    """One generate() of `batch` requests; steps and times from the engine's counters."""
    sp = {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0.0}
    if sampled:
        sp.update(SAMPLED)
    # distinct prompts (no prefix sharing across requests: every request prefills its own 32 tokens)
    vocab = eng.runner.vocab_size
    ids = [[(7 + 131 * i + 17 * j) % (vocab - 100) + 100 for j in range(prompt_len)] for i in range(batch)]
    clocks = getattr(eng, "_bench_clocks", None)
    if clocks is None:  # the model's forward, and the whole step (both on the loop thread)
        clocks = eng._bench_clocks = (Clock(eng.runner.model, "forward"), Clock(*step_target(eng)))
    model_clock, step_clock = clocks
    part = getattr(eng, "_bench_parts", None)
    if parts and part is None:
        part = eng._bench_parts = part_clocks(eng)
    part0 = {k: c.cpu for k, c in (part or {}).items()}
    fwd0, fwd_cpu0, step_cpu0 = model_clock.seconds, model_clock.cpu, step_clock.cpu
    before = eng.get_server_info()
    with profiled_steps(eng) if profile else contextlib.nullcontext() as prof:
        t0 = time.perf_counter()
        outs = eng.generate(input_ids=ids, sampling_params=sp)
        wall = time.perf_counter() - t0
    after = eng.get_server_info()
    got = sum(len(o["output_ids"]) for o in outs)
    if got != batch * tokens:
        raise RuntimeError(f"expected {batch * tokens} tokens, got {got}")
    steps = after["num_steps"] - before["num_steps"]
    step_s = after["step_s"] - before["step_s"]
    fwd = model_clock.seconds - fwd0
    host = wall - fwd
    # CPU seconds of the loop thread outside the model: what the host work costs whatever the box's load (with
    # --threads 1 every op runs on the loop thread; with more, the model's and the sampler's ops also use others)
    host_cpu = (step_clock.cpu - step_cpu0) - (model_clock.cpu - fwd_cpu0)
    res = {"case": "sampled" if sampled else "greedy", "batch": batch, "steps": steps, "wall_s": wall,
           "step_ms": 1e3 * wall / steps, "forward_ms": 1e3 * fwd / steps, "host_ms": 1e3 * host / steps,
           "req_step_us": 1e6 * host / steps / batch, "engine_step_ms": 1e3 * step_s / steps, "tok_s": got / wall,
           "host_cpu_ms": 1e3 * host_cpu / steps, "req_step_cpu_us": 1e6 * host_cpu / steps / batch}
    if parts:
        res["parts_ms"] = {k: 1e3 * (c.cpu - part0[k]) / steps for k, c in part.items()}
    if prof is not None:
        res["profile"] = profile_text(prof)
    return res


def cases(args) -> list[tuple[int, bool]]:
    batches = [int(b) for b in args.batches.split(",")]
    out = []
    names = args.cases.split(",")
    if "greedy" in names:
        out += [(b, False) for b in batches]
    if "sampled" in names:
        out.append((64 if 64 in batches or max(batches) >= 64 else max(batches), True))
    return out


def measure(args) -> list[dict]:
    """This process: one engine, every case (after a short warm-up)."""
    if args.tree:
        use_tree(args.tree)
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    from sglpy.runtime.engine import Engine

    todo = cases(args)
    # grammar_workers=0: no compile worker processes starting up beside the first measured case (nothing here is
    # constrained)
    eng = Engine(tiny_model(), quantization="none", grammar_workers=0,
                 disable_overlap_schedule=False if args.overlap else None,
                 max_running_requests=max(256, max(b for b, _ in todo)))
    try:
        run_case(eng, 4, True, 8, args.prompt_len, False)  # warm-up: first-call costs out of the numbers
        results = []
        for batch, sampled in todo:
            for _ in range(args.reps):
                results.append(run_case(eng, batch, sampled, args.tokens, args.prompt_len, args.profile,
                                        args.parts))
        return results
    finally:
        eng.shutdown()


def fmt(r: dict) -> str:
    return (f"{r['case']:>7} batch {r['batch']:>3}: {r['steps']:>4} steps, {r['step_ms']:8.2f} ms/step "
            f"(model forward {r['forward_ms']:6.2f} ms, host {r['host_ms']:8.2f} ms), "
            f"host {r['req_step_us']:8.1f} us/request-step; loop-thread CPU outside the model {r['host_cpu_ms']:7.2f} "
            f"ms/step, {r['req_step_cpu_us']:7.1f} us/request-step; {r['tok_s']:6.0f} tok/s")


def compare(args) -> None:
    """Alternate this tree and args.compare in fresh processes, case by case, args.rounds times."""
    here = str(pathlib.Path(__file__).resolve().parents[1])
    trees = {"other": args.compare, "this": here}
    got: dict[tuple, dict[str, list[dict]]] = {}
    for rnd in range(args.rounds):
        for batch, sampled in cases(args):
            for side, root in trees.items():
                cmd = [sys.executable, __file__, "--tree", root, "--json", "--batches", str(batch),
                       "--cases", "sampled" if sampled else "greedy", "--tokens", str(args.tokens),
                       "--prompt-len", str(args.prompt_len), "--reps", str(args.reps)]
                if args.threads:
                    cmd += ["--threads", str(args.threads)]
                if args.parts:
                    cmd += ["--parts"]
                if args.overlap:
                    cmd += ["--overlap"]
                out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
                for r in json.loads(out.strip().splitlines()[-1]):
                    got.setdefault((r["case"], r["batch"]), {}).setdefault(side, []).append(r)
                    print(f"round {rnd} {side:>5}: {fmt(r)}", flush=True)
    print(f"\nhost time per request-step (us; wall minus the model's forward, and loop-thread CPU), median [min-max] over {args.rounds} round(s) x {args.reps} rep(s):")
    for (case, batch), sides in got.items():
        for key, what in (("req_step_us", "wall"), ("req_step_cpu_us", "CPU")):
            cells = []
            for side in trees:
                v = [r[key] for r in sides.get(side, [])]
                cells.append(f"{side} {statistics.median(v):.1f} [{min(v):.1f}-{max(v):.1f}] us")
            print(f"  {case:>7} batch {batch:>3} host {what}: " + "; ".join(cells))
        labels = dict.fromkeys(k for side in sides.values() for r in side for k in r.get("parts_ms", {}))
        for label in labels:  # a part's loop-thread CPU ms per step, median of the rounds, per side
            cells = [f"{side} {statistics.median(v):.3f}" if (v := [r["parts_ms"][label] for r in sides.get(side, [])
                                                                  if label in r.get("parts_ms", {})]) else f"{side} -"
                     for side in trees]
            print(f"      {label}: " + "; ".join(cells) + " ms/step")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batches", default="1,16,64,256")
    ap.add_argument("--cases", default="greedy,sampled")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--prompt-len", type=int, default=32)
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--overlap", action="store_true", help="the overlapped step order (CUDA's default)")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--parts", action="store_true", help="loop-thread CPU of the step's parts (each timed in place)")
    ap.add_argument("--json", action="store_true", help="print the results as one JSON line")
    ap.add_argument("--tree", default=None, help="import sglpy from this checkout (used by --compare)")
    ap.add_argument("--compare", default=None, help="another checkout to alternate with, in fresh processes")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.compare:
        compare(args)
        return
    results = measure(args)
    if args.json:
        print(json.dumps([{k: v for k, v in r.items() if k != "profile"} for r in results]))
        return
    print(f"cpu: {_cpu()}, torch threads: {args.threads or 'default'}")
    for r in results:
        print(fmt(r))
        if "parts_ms" in r:
            print("  parts, loop-thread CPU ms per step (nested, so they do not add up): "
                  + ", ".join(f"{k} {v:.3f}" for k, v in r["parts_ms"].items()))
        if "profile" in r:
            print(r["profile"])


def _cpu() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return f"{line.split(':', 1)[1].strip()} x{os.cpu_count()}"
    except OSError:
        pass
    return "unknown"


if __name__ == "__main__":
    main()

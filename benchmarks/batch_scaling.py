"""How a decode step scales with its rows, per native-kernel ISA level: the default model's step at 1, 2, 4 and 8
rows (model only, split into the fused decoder layers, the lm_head and the rest) and 8 chat requests together vs
one alone (the engine end to end), optionally against another checkout, interleaved.

python benchmarks/batch_scaling.py [--levels avx512,avx2] [--modes int4,int8] [--compare /path/to/other/tree]
                                   [--rounds 2] [--threads 1] [--steps 24] [--reps 2] [--skip-engine]

Each round runs one child process per (tree, level, mode), trees alternating: SGLPY_CPU_ISA=<level> (a level
below avx512 also caps torch's own kernels, as benchmarks/isa_matrix.py does). Per child:
  step: `rows` requests with 200-token contexts decode together through the ModelRunner; per step wall ms and
        process CPU ms (all threads: on a loaded box the steadier number; with --threads 1 it is the work), and in
        a second timed run the CPU ms of the stepping thread inside the fused decoder layers (sglpy_decode_layer)
        and inside the lm_head's GEMV (exact at --threads 1); the rest is embedding, final norm, sampling, Python;
  engine: 8 chat requests of 64 greedy tokens submitted together vs one of them alone, best of --reps: tok/s
        wall and tok per CPU-second, and their ratio (the issue's target: 8 together >= 3x one alone); and, from one
        more 8-together run, its CPU ms per step (64 steps) in the decode forwards, in the extend forwards (the
        prompts are in the radix cache after the first run: each extend is a prompt's last token) and the rest
        (host: scheduling, sampling, outputs; other threads).
Another tree (--compare) is imported in its child ahead of the installed package (host_overhead.use_tree), so its
kernels are built from its own csrc.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
TORCH_CAPS = {  # torch's own kernels held to what a CPU of the level runs (as isa_matrix.py)
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
ROWS = (1, 2, 4, 8)
CONTEXT = 200
TOPICS = ["a robot who learns to paint", "a lighthouse keeper", "a city under the sea", "a lost dog",
          "a baker in Paris", "the first day of school", "a dragon who is afraid of fire", "a train at night"]


class Timed:
    """CPU seconds of the calling thread spent inside one function of a module (wrapped in place until close; with
    one thread the kernels run on it)."""

    def __init__(self, module, name: str, keep=lambda *a, **k: True):
        self.module, self.name, self.real, self.seconds = module, name, getattr(module, name), 0.0

        def timed(*a, **k):
            if not keep(*a, **k):
                return self.real(*a, **k)
            t = time.thread_time()
            try:
                return self.real(*a, **k)
            finally:
                self.seconds += time.thread_time() - t

        setattr(module, name, timed)

    def close(self) -> None:
        setattr(self.module, self.name, self.real)


def step_profile(path: str, mode: str, rows: int, steps: int) -> dict:
    """Per decode step of `rows` requests: wall and CPU ms, ms in the fused layers and in the lm_head."""
    import torch

    import sglpy.kernels.quant_linear as ql
    import sglpy.runtime.model.native_decode as nd
    from sglpy.runtime.config import EngineConfig
    from sglpy.runtime.core import BatchEntry, Req
    from sglpy.runtime.model.runner import ModelRunner
    from sglpy.runtime.sampling_params import SamplingParams
    from sglpy.runtime.testing.runner_kv import runner_kv

    quant, _, kv_dtype = mode.partition(":")
    span = CONTEXT + 3 * steps + 8
    cfg = EngineConfig(model=path, device="cpu", max_context_len=span, quantization=quant,
                       kv_cache_dtype=kv_dtype or "auto")
    runner = ModelRunner(cfg, path)
    kv = runner_kv(runner, span * rows, rows, cfg.kv_cache_dtype)
    reqs = [Req(rid=f"r{i}", input_ids=list(range(1000 + i, 1000 + i + CONTEXT)),
                sampling=SamplingParams(max_new_tokens=1)) for i in range(rows)]
    with torch.inference_mode():
        for r in reqs:
            assert kv.assign_row(r) and kv.grow(r, CONTEXT)
            runner.forward([BatchEntry(r, 0, CONTEXT, sample=True)], 0, kv.buffers)

        def step():
            entries = []
            for r in reqs:
                t = r.kv_len
                r.output_ids.append(1234)
                assert kv.grow(r, 1)
                entries.append(BatchEntry(r, t, 1, sample=True))
            runner.forward(entries, rows, kv.buffers)

        for _ in range(3):
            step()
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(steps):
            step()
        wall, cpu = (time.perf_counter() - t0) / steps, (time.process_time() - c0) / steps
        layers = Timed(nd, "decode_layer_cpu")
        head = Timed(ql, "quant_linear_cpu", keep=lambda lib, x, *a, **k: a[-1] > 16 * x.shape[1])  # the lm_head
        for _ in range(steps):
            step()
        layers.close()
        head.close()
    for r in reqs:
        kv.release(r)
    return dict(rows=rows, step_ms=wall * 1e3, cpu_ms=cpu * 1e3, layers_ms=layers.seconds / steps * 1e3,
                head_ms=head.seconds / steps * 1e3)


def engine_batch(path: str, mode: str, threads: int, reps: int) -> dict:
    """8 chat requests of 64 tokens together vs one alone: (wall tok/s, tok per CPU-second) each."""
    sys.path.insert(0, str(HERE))
    from throughput import best_of, chat_ids
    from transformers import AutoTokenizer

    from sglpy.runtime.engine import Engine

    quant, _, kv_dtype = mode.partition(":")
    tok = AutoTokenizer.from_pretrained(path)
    ids = [chat_ids(tok, f"Write a short story about {t}.") for t in TOPICS]
    sp = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
    with Engine(path, device="cpu", num_threads=threads, max_total_tokens=8192, quantization=quant,
                kv_cache_dtype=kv_dtype or "auto") as eng:
        split = ForwardSplit(eng.runner)
        eng.generate(input_ids=ids[0], sampling_params=sp)
        one = best_of(lambda: eng.generate(input_ids=ids[0], sampling_params=sp), reps)
        eight = best_of(lambda: eng.generate(input_ids=ids, sampling_params=[sp] * 8), reps)
        split.reset()
        eng.generate(input_ids=ids, sampling_params=[sp] * 8)
        parts = split.ms_per_step(512 / 8)
        kernels = eng.get_server_info()["cpu_kernels"]
    return dict(one_tok_s=64 / one[0], one_tok_cpu_s=64 / one[1], eight_tok_s=512 / eight[0],
                eight_tok_cpu_s=512 / eight[1], eight_parts=parts, cpu_kernels=kernels)


class ForwardSplit:
    """Loop-thread CPU seconds in the runner's decode forwards and in its extend (prefill) forwards; the rest of a
    run's process CPU time is the host (scheduling, sampling, outputs) and other threads."""

    def __init__(self, runner):
        self.sec = {"decode": 0.0, "extend": 0.0}
        self.cpu0 = time.process_time()
        real = runner.forward

        def timed(entries, num_decode, *a, **k):
            t = time.thread_time()
            try:
                return real(entries, num_decode, *a, **k)
            finally:
                self.sec["decode" if num_decode == len(entries) else "extend"] += time.thread_time() - t

        runner.forward = timed

    def reset(self) -> None:
        self.sec = {"decode": 0.0, "extend": 0.0}
        self.cpu0 = time.process_time()

    def ms_per_step(self, steps: float) -> dict:
        """CPU ms per generated token's step since reset: decode forwards, extend forwards, everything else."""
        total = time.process_time() - self.cpu0
        return {k: v / steps * 1e3 for k, v in
                [*self.sec.items(), ("other", total - sum(self.sec.values()))]}


def child(args) -> None:
    if args.tree and pathlib.Path(args.tree).resolve() != ROOT:
        sys.path.insert(0, str(HERE))
        from host_overhead import use_tree

        use_tree(args.tree)
    import torch

    torch.set_num_threads(args.threads)
    from sglpy.runtime.engine.cpu_threads import on_own_thread
    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(None)
    out = {"steps": [] if args.skip_step else [on_own_thread(step_profile, path, args.modes, r, args.steps)
                                               for r in ROWS]}
    if not args.skip_engine:
        out.update(engine_batch(path, args.modes, args.threads, args.reps))
    print("RESULT " + json.dumps(out), flush=True)


def run_child(tree: pathlib.Path, level: str, mode: str, args) -> dict:
    env = dict(os.environ, SGLPY_CPU_ISA=level, **TORCH_CAPS.get(level, {}))
    cmd = [sys.executable, __file__, "--child", "--tree", str(tree), "--modes", mode, "--threads",
           str(args.threads), "--steps", str(args.steps), "--reps", str(args.reps)]
    cmd += (["--skip-engine"] if args.skip_engine else []) + (["--skip-step"] if args.skip_step else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"{tree} at {level}, {mode} failed: {r.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def rng(vals: list[float], fmt: str = "{:.2f}") -> str:
    return fmt.format(min(vals)) + ("" if len(vals) == 1 else "-" + fmt.format(max(vals)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default="avx512,avx2")
    ap.add_argument("--modes", default="int4,int8")
    ap.add_argument("--compare", default=None, help="another checkout, run alternately with this one")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--skip-engine", action="store_true")
    ap.add_argument("--skip-step", action="store_true")
    ap.add_argument("--json", default=None)
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--tree", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    trees = [ROOT] + ([pathlib.Path(args.compare).resolve()] if args.compare else [])
    print(f"CPU: {cpu_name()}; {args.threads} thread(s); load before {os.getloadavg()}", flush=True)
    results: dict[tuple, list[dict]] = {}
    for rnd in range(args.rounds):
        for level in args.levels.split(","):
            for mode in args.modes.split(","):
                for tree in trees:
                    r = run_child(tree, level, mode, args)
                    results.setdefault((tree.name, level, mode), []).append(r)
                    print(f"round {rnd} {tree.name} {level} {mode}: {json.dumps(r)} load {os.getloadavg()}",
                          flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({" ".join(k): v for k, v in results.items()}))
    print(f"load after {os.getloadavg()}")
    print_tables(results)


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            return next(ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name"))
    except (OSError, StopIteration):
        return "unknown"


def print_tables(results: dict[tuple, list[dict]]) -> None:
    """Step ms per rows (CPU ms; layers / lm_head), and the engine's 8-vs-1 rates; min-max over rounds."""
    print("\n| tree | level | mode | " + " | ".join(f"{r} row{'s' if r > 1 else ''}: CPU ms (layers, head)"
                                                    for r in ROWS) + " | 8 rows / 1 row CPU |")
    print("|---" * (5 + len(ROWS)) + "|")
    for (tree, level, mode), runs in results.items():
        if not runs[0]["steps"]:
            continue
        cells = []
        for i, _ in enumerate(ROWS):
            s = [run["steps"][i] for run in runs]
            cells.append(f"{rng([x['cpu_ms'] for x in s])} ({rng([x['layers_ms'] for x in s])}, "
                         f"{rng([x['head_ms'] for x in s])})")
        ratio = [run["steps"][-1]["cpu_ms"] / run["steps"][0]["cpu_ms"] for run in runs]
        print(f"| {tree} | {level} | {mode} | " + " | ".join(cells) + f" | {rng(ratio)}x |")
    if any("one_tok_s" in runs[0] for runs in results.values()):
        print("\n| tree | level | mode | one request tok/s (per CPU-s) | 8 together tok/s (per CPU-s) | "
              "8 together CPU ms per step: decode, extend, other | ratio wall | ratio CPU |")
        print("|---|---|---|---|---|---|---|---|")
        for (tree, level, mode), runs in results.items():
            if "one_tok_s" not in runs[0]:
                continue
            g = lambda k: [run[k] for run in runs]  # noqa: E731
            rw = [run["eight_tok_s"] / run["one_tok_s"] for run in runs]
            rc = [run["eight_tok_cpu_s"] / run["one_tok_cpu_s"] for run in runs]
            split = ", ".join(rng([run.get("eight_parts", {}).get(k, float("nan")) for run in runs])
                              for k in ("decode", "extend", "other"))
            print(f"| {tree} | {level} | {mode} | {rng(g('one_tok_s'), '{:.1f}')} ({rng(g('one_tok_cpu_s'), '{:.1f}')})"
                  f" | {rng(g('eight_tok_s'), '{:.1f}')} ({rng(g('eight_tok_cpu_s'), '{:.1f}')}) | {split} | "
                  f"{rng(rw)}x | {rng(rc)}x |")


if __name__ == "__main__":
    main()

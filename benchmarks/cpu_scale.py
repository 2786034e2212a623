"""CPU at the sizes people run: random-weight GGUFs with real configs, per ISA level, against the machine's bandwidth
and against llama.cpp on the same file.

python benchmarks/cpu_scale.py [--models qwen2.5-0.5b,llama-3.2-1b,qwen3-1.7b] [--quants Q4_1,Q8_0]
                               [--levels avx512,avx2,baseline] [--rounds 3] [--threads 2] [--gen 64] [--mixed]
                               [--peer-node DIR] [--quick] [--dir DIR] [--json out.json]
python benchmarks/cpu_scale.py --summarize out.json     # the tables again from a (possibly cut short) run
python benchmarks/cpu_scale.py --memory llama-3.2-3b:Q4_1 [--memory llama-3.1-8b:Q4_0]

Models: runtime/testing/random_gguf.py writes each config (Qwen2.5-0.5B, Llama-3.2-1B, Qwen3-1.7B; Llama-3.2-3B and
Llama-3.1-8B for --memory) as a GGUF of random Q4_0/Q4_1/Q8_0 blocks (the default tokenizer stands in, padded to the
real vocabulary); the engine loads that file as it is (weights read from the GGUF, packed layer by layer). Q4_x runs
--quantization int4, Q8_0 int8.

Each round, interleaved: a STREAM-like probe of this machine's memory bandwidth (read = sum of 1 GiB, copy, triad,
--threads threads), then per model, quant and level one child process (SGLPY_CPU_ISA forced, torch capped as
benchmarks/isa_matrix.py does) measuring: one request's decode at 128 and 2,048 tokens of context (tokens after the
first over their time; the prompt is put in the prefix cache first, so the CPU-time rate counts decode alone), pp512
(one 512-token prompt, prompt tok/s), a batch of 8 requests (128-token prompts, in the prefix cache first: decode
throughput) against one of them alone, with
--mixed 32 mixed requests (prompts 64-512, outputs 16-64 tokens: output tok/s), and the child's peak RSS. Every rate
is given by wall time and by the process's CPU time (all threads): on a shared machine the wall time measures the
neighbours too. The roofline: decode tok/s <= read bandwidth / (packed weight bytes + K/V bytes read per token).
The table gives the median and min-max over rounds. --quick: one round, Llama-3.2-1B Q4_1, avx512/avx2 (or the levels
this CPU runs), 16 tokens.

--peer-node DIR (a folder where `npm install node-llama-cpp` ran): llama.cpp on the same file, after or before the
engine (alternating by round), through node-llama-cpp's prebuilt libllama (benchmarks/llamacpp_node_peer.mjs, the
same measurements). Its ggml CPU variant matches the level: avx512 -> sapphirerapids (AMX) / icelake / skylakex,
avx2 -> alderlake (AVX-VNNI) / haswell, baseline -> x64; a hard-linked copy of DIR's node_modules per variant keeps
only that variant's library, so ggml loads it.

--memory NAME:QUANT (one at a time): write the file, load it at the best level, decode 16 tokens; print the file size,
the KV pool, the peak RSS, and the target (peak <= 1.15 x (file + KV pool)).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
DEFAULT_MODELS = "qwen2.5-0.5b,llama-3.2-1b,qwen3-1.7b"
MODES = {"Q4_0": "int4", "Q4_1": "int4", "Q8_0": "int8"}


def peak_rss() -> int:
    """This process's peak resident memory in bytes (VmHWM)."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def bandwidth(gib: float) -> dict:
    """GB/s of a read (sum), a copy and a triad (a = b + s * c) over `gib` GiB arrays, best of 3 each."""
    import torch

    n = int(gib * (1 << 30)) // 4
    a, b, c = torch.ones(n), torch.ones(n), torch.ones(n)

    def best(fn) -> float:
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            fn()
            runs.append(time.perf_counter() - t)
        return min(runs)

    size = n * 4 / 1e9
    return {"read_gbs": size / best(a.sum), "copy_gbs": 2 * size / best(lambda: b.copy_(a)),
            "triad_gbs": 3 * size / best(lambda: torch.add(b, c, alpha=3.0, out=a))}


def weight_bytes(model) -> int:
    """Bytes a decode step reads of the weights: every packed projection and the head (not the embedding table)."""
    from sglpy.runtime.model.quantization import QuantizedLinear

    total = sum(m.packed.nbytes for m in model.modules() if isinstance(m, QuantizedLinear))
    return total + sum(p.numel() * p.element_size() for n, p in model.named_parameters() if "embed" not in n)


def child(path: str, mode: str, threads: int, gen: int, mixed: bool, memory_only: bool) -> dict:
    """The sglpy measurements of one process (its ISA level comes from the environment)."""
    import torch

    torch.set_num_threads(threads)
    from sglpy.runtime.engine import Engine

    rng = random.Random(0)
    t0 = time.perf_counter()
    eng = Engine(path, device="cpu", num_threads=threads, quantization=mode)
    out = {"load_s": time.perf_counter() - t0, "rss_after_load": peak_rss()}
    r = eng.runner
    k = eng.kv.buffers.k_buffer  # [layers, slots + 1, kv_heads, head_dim]
    kv_token = 2 * r.num_layers * r.num_kv_heads * r.head_dim * k.element_size()
    out.update(weight_bytes=weight_bytes(r.model), kv_bytes_per_token=kv_token, quantization=r.quantization,
               kv_pool_bytes=kv_token * (k.shape[1] - 1), cpu_kernels=eng.get_server_info()["cpu_kernels"])

    def ids(n: int) -> list[int]:
        return [rng.randrange(1000, 40000) for _ in range(n)]

    def decode_rate(ctx: int) -> tuple[float, float]:
        """(wall, CPU-time) tok/s of one request's decode after `ctx` prompt tokens."""
        eng.flush_cache()
        prompt = ids(ctx)
        eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": 1})  # the prompt into the prefix cache
        c = time.process_time()
        o = eng.generate(input_ids=prompt, sampling_params={"max_new_tokens": gen, "temperature": 0,
                                                            "ignore_eos": True})["meta_info"]
        return ((o["completion_tokens"] - 1) / (o["e2e_latency"] - o["ttft"]),
                o["completion_tokens"] / (time.process_time() - c))

    decode_rate(32)  # warm-up
    out["decode128_tok_s"], out["decode128_tok_cpu_s"] = decode_rate(128)
    if not memory_only:
        out["decode2048_tok_s"], out["decode2048_tok_cpu_s"] = decode_rate(2048)
        eng.flush_cache()
        t, c = time.perf_counter(), time.process_time()
        eng.generate(input_ids=ids(512), sampling_params={"max_new_tokens": 1})
        out["pp512_tok_s"] = 512 / (time.perf_counter() - t)
        out["pp512_tok_cpu_s"] = 512 / (time.process_time() - c)
        prompts = [ids(128) for _ in range(8)]
        sp = {"max_new_tokens": gen, "temperature": 0, "ignore_eos": True}
        eng.flush_cache()  # the prompts into the prefix cache first: both sides time decode, not 8 vs 1 prefills
        eng.generate(input_ids=prompts, sampling_params=[{"max_new_tokens": 1}] * 8)
        t, c = time.perf_counter(), time.process_time()
        eng.generate(input_ids=prompts[0], sampling_params=sp)
        single, single_cpu = gen / (time.perf_counter() - t), gen / (time.process_time() - c)
        t, c = time.perf_counter(), time.process_time()
        eng.generate(input_ids=prompts, sampling_params=[sp] * 8)
        out["batch8_tok_s"], out["single_tok_s"] = 8 * gen / (time.perf_counter() - t), single
        out["batch8_tok_cpu_s"], out["single_tok_cpu_s"] = 8 * gen / (time.process_time() - c), single_cpu
        out["batch8_ratio"] = out["batch8_tok_s"] / single
        out["batch8_ratio_cpu"] = out["batch8_tok_cpu_s"] / single_cpu
    if mixed and not memory_only:
        n_mixed = 32
        work = [(ids(rng.randrange(64, 513)), rng.randrange(16, 65)) for _ in range(n_mixed)]
        eng.flush_cache()
        t = time.perf_counter()
        outs = eng.generate(input_ids=[w[0] for w in work],
                            sampling_params=[{"max_new_tokens": w[1], "temperature": 0, "ignore_eos": True}
                                             for w in work])
        out["mixed_tok_s"] = sum(o["meta_info"]["completion_tokens"] for o in outs) / (time.perf_counter() - t)
        out["mixed_requests"] = n_mixed
    out["peak_rss"] = peak_rss()
    eng.shutdown()
    return out


def run_child(path: str, mode: str, level: str | None, args, memory_only: bool = False) -> dict:
    sys.path.insert(0, str(HERE))
    from isa_matrix import TORCH_CAPS

    env = dict(os.environ, **({"SGLPY_CPU_ISA": level, **TORCH_CAPS.get(level, {})} if level else {}))
    cmd = [sys.executable, __file__, "--child", path, "--mode", mode, "--threads", str(args.threads)]
    cmd += ["--gen", str(16 if memory_only else args.gen)] + (["--mixed"] if args.mixed else [])
    cmd += ["--memory-only"] if memory_only else []
    r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=3600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"sglpy child ({path}, {mode}, {level}) failed: {r.stderr[-3000:]}")
    return json.loads(line[-1][7:])


def peer_variant(level: str, flags: frozenset[str]) -> str:
    """The ggml CPU variant (node-llama-cpp's prebuilt libggml-cpu-<variant>.so) that runs the same ISA as `level`."""
    if level == "avx512":
        return "sapphirerapids" if "amx_int8" in flags else "icelake" if "avx512_vnni" in flags else "skylakex"
    if level == "avx2":
        return "alderlake" if "avx_vnni" in flags else "haswell"
    return "x64"


def peer_tree(peer_node: str, variant: str) -> pathlib.Path:
    """A hard-linked copy of `peer_node`'s node_modules whose prebuilt llama.cpp keeps one ggml CPU variant, so that
    ggml loads that one (it otherwise picks the best the CPU runs)."""
    tree = pathlib.Path(peer_node).resolve() / "variants" / variant
    bins = tree / "node_modules" / "@node-llama-cpp" / "linux-x64" / "bins" / "linux-x64"
    if not bins.exists():
        shutil.copytree(pathlib.Path(peer_node).resolve() / "node_modules", tree / "node_modules", symlinks=True,
                        copy_function=os.link)
        for lib in bins.glob("libggml-cpu-*.so"):
            if lib.name != f"libggml-cpu-{variant}.so":
                lib.unlink()
    return tree


def run_peer(path: str, level: str, args) -> dict:
    """llama.cpp on the same file through node-llama-cpp's prebuilt libllama, the ggml CPU variant of the level."""
    from sglpy.kernels.cpu_isa import read_cpu_flags

    variant = peer_variant(level, read_cpu_flags())
    cmd = ["node", str(HERE / "llamacpp_node_peer.mjs"), path, str(args.threads), str(args.gen),
           str(peer_tree(args.peer_node, variant))]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=3600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")]
    if r.returncode != 0 or not line:
        raise RuntimeError(f"llama.cpp ({path}, {variant}) failed: {r.stderr[-3000:]}")
    return dict(json.loads(line[-1][7:]), variant=variant)


def model_file(name: str, quant: str, folder: pathlib.Path) -> str:
    from sglpy.runtime.testing.random_gguf import write_random_gguf

    path = folder / f"{name}.{quant}.gguf"
    return str(path) if path.exists() else write_random_gguf(name, quant, path)


def levels_here(quick: bool) -> list[str]:
    from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels

    runs = runnable_levels(read_cpu_flags())
    return runs[:2] if quick else runs


def _cell(vals: list[float], fmt: str = "{:.1f}") -> str:
    vals = [v for v in vals if v is not None]
    if not vals:
        return "-"
    return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}-{fmt.format(max(vals))})"


def summarize(rows: list[dict], bw: list[dict]) -> str:
    """Median (min-max) per model/quant/level/engine over rounds, by wall time and by CPU time, the roofline from the
    same run's read bandwidth, and llama.cpp's figures on the same file beside the engine's."""
    read = statistics.median(b["read_gbs"] for b in bw)
    per_round = ", ".join(f"{b['read_gbs']:.1f}" for b in bw)
    lines = [f"read bandwidth {read:.1f} GB/s median (rounds: {per_round}); "
             f"triad {statistics.median(b['triad_gbs'] for b in bw):.1f} GB/s",
             "| model | file | level | engine | decode@128 tok/s wall; per CPU-s (roofline %) | decode@2048 wall; "
             "per CPU-s | pp512 wall; per CPU-s | batch8 / one (wall; CPU) | mixed tok/s | peak RSS |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    keys = sorted({(r["model"], r["quant"], r["level"], r["engine"]) for r in rows},
                  key=lambda k: (k[0], k[1], k[2], k[3] != "sglpy"))
    weights = {(r["model"], r["quant"]): (r["weight_bytes"], r["kv_bytes_per_token"]) for r in rows
               if r["engine"] == "sglpy"}
    for key in keys:
        rs = [r for r in rows if (r["model"], r["quant"], r["level"], r["engine"]) == key]
        g = lambda name: [r.get(name) for r in rs]  # noqa: E731
        roof = ""
        if (key[0], key[1]) in weights:
            w, kv = weights[key[0], key[1]]
            pct = statistics.median(r["decode128_tok_s"] for r in rs) / (read * 1e9 / (w + kv * 128)) * 100
            roof = f" ({pct:.0f}%)"
        engine = key[3] if key[3] == "sglpy" else f"llama.cpp ({rs[0]['variant']})"
        lines.append(f"| {key[0]} | {key[1]} ({rs[0]['file_bytes'] / 1e9:.2f} GB) | {key[2]} | {engine} | "
                     f"{_cell(g('decode128_tok_s'))}; {_cell(g('decode128_tok_cpu_s'))}{roof} | "
                     f"{_cell(g('decode2048_tok_s'))}; {_cell(g('decode2048_tok_cpu_s'))} | "
                     f"{_cell(g('pp512_tok_s'))}; {_cell(g('pp512_tok_cpu_s'))} | "
                     f"{_cell(g('batch8_ratio'), '{:.2f}')}; {_cell(g('batch8_ratio_cpu'), '{:.2f}')} | "
                     f"{_cell(g('mixed_tok_s'))} | {statistics.median(g('peak_rss')) / 1e9:.2f} GB |")
    ratios = []
    for m, q, lv, e in keys:
        if e != "sglpy":
            continue
        ours = [r for r in rows if (r["model"], r["quant"], r["level"], r["engine"]) == (m, q, lv, "sglpy")]
        peer = [r for r in rows if (r["model"], r["quant"], r["level"], r["engine"]) == (m, q, lv, "llama.cpp")]
        if not peer:
            continue
        ratio = lambda f: statistics.median(r[f] for r in ours) / statistics.median(r[f] for r in peer)  # noqa: E731
        ratios.append(f"| {m} | {q} | {lv} | " + " | ".join(
            f"{ratio(f):.2f}x" for f in ("decode128_tok_cpu_s", "decode2048_tok_cpu_s", "pp512_tok_cpu_s",
                                         "decode128_tok_s", "pp512_tok_s")) + " |")
    if ratios:
        lines += ["", "sglpy / llama.cpp (medians): | model | quant | level | decode@128 per CPU-s | decode@2048 per "
                  "CPU-s | pp512 per CPU-s | decode@128 wall | pp512 wall |", "|---|---|---|---|---|---|---|---|"]
        lines += ratios
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default=DEFAULT_MODELS)
    ap.add_argument("--quants", default="Q4_1,Q8_0")
    ap.add_argument("--levels", default=None, help="default: every level this CPU runs")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--gen", type=int, default=64, help="tokens generated per decode measurement")
    ap.add_argument("--mixed", action="store_true", help="also 32 mixed requests (slow on a shared box)")
    ap.add_argument("--peer-node", default=None, help="a folder with node_modules/node-llama-cpp: run llama.cpp too")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--dir", default=str(pathlib.Path(tempfile.gettempdir()) / "sglpy-cpu-scale"))
    ap.add_argument("--json", default=None)
    ap.add_argument("--summarize", default=None, help="print the tables of a --json file and exit")
    ap.add_argument("--memory", action="append", default=[], help="NAME:QUANT, e.g. llama-3.1-8b:Q4_0")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--mode", default="int4", help=argparse.SUPPRESS)
    ap.add_argument("--memory-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--bandwidth", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.mode, args.threads, args.gen, args.mixed,
                                           args.memory_only)))
        return 0
    if args.summarize:
        data = json.loads(pathlib.Path(args.summarize).read_text())
        print(data["info"]["cpu"])
        print(summarize(data["rows"], data["bandwidth"]))
        return 0
    if args.bandwidth:
        import torch

        torch.set_num_threads(args.threads)
        print("RESULT " + json.dumps(bandwidth(0.25 if args.quick else 1.0)))
        return 0
    folder = pathlib.Path(args.dir)
    folder.mkdir(parents=True, exist_ok=True)
    info = {"cpu": _lscpu(), "load_at_start": os.getloadavg()}
    print(f"{info['cpu']}; load average {info['load_at_start']}", flush=True)
    if args.memory:
        for spec in args.memory:
            name, quant = spec.split(":")
            path = model_file(name, quant, folder)
            r = run_child(path, MODES[quant], None, args, memory_only=True)
            size = os.path.getsize(path)
            target = 1.15 * (size + r["kv_pool_bytes"])
            print(f"{name} {quant}: file {size / 1e9:.2f} GB, KV pool {r['kv_pool_bytes'] / 1e9:.2f} GB, peak RSS "
                  f"{r['peak_rss'] / 1e9:.2f} GB (after load {r['rss_after_load'] / 1e9:.2f}), target <= "
                  f"{target / 1e9:.2f} GB: {'met' if r['peak_rss'] <= target else 'MISSED'}; decode@128 "
                  f"{r['decode128_tok_s']:.2f} tok/s ({r['decode128_tok_cpu_s']:.2f} per CPU-s); load "
                  f"{r['load_s']:.0f} s; {r['cpu_kernels']}", flush=True)
        return 0
    if args.quick:
        args.gen = min(args.gen, 16)
    models = ["llama-3.2-1b"] if args.quick and args.models == DEFAULT_MODELS else args.models.split(",")
    quants = ["Q4_1"] if args.quick and args.quants == "Q4_1,Q8_0" else args.quants.split(",")
    levels = args.levels.split(",") if args.levels else levels_here(args.quick)
    rounds = 1 if args.quick else args.rounds
    files = {(m, q): model_file(m, q, folder) for m in models for q in quants}
    engines = ["sglpy", "llama.cpp"] if args.peer_node else ["sglpy"]
    rows, bws = [], []
    for rnd in range(rounds):
        r = subprocess.run([sys.executable, __file__, "--bandwidth", "--threads", str(args.threads)]
                           + (["--quick"] if args.quick else []), capture_output=True, text=True, timeout=600)
        bws.append(json.loads([ln for ln in r.stdout.splitlines() if ln.startswith("RESULT ")][-1][7:]))
        print(f"round {rnd + 1}: bandwidth {bws[-1]}; load {os.getloadavg()}", flush=True)
        for (m, q), path in files.items():
            for level in levels:
                for engine in engines if rnd % 2 == 0 else engines[::-1]:  # alternate who runs first
                    row = run_child(path, MODES[q], level, args) if engine == "sglpy" else run_peer(path, level, args)
                    row.update(model=m, quant=q, level=level, engine=engine, round=rnd,
                               file_bytes=os.path.getsize(path))
                    rows.append(row)
                    print(f"  {m} {q} {level} {engine}: " + ", ".join(
                        f"{k} {v:.2f}" for k, v in row.items() if isinstance(v, float)), flush=True)
                    if args.json:  # partial results survive an interrupted run
                        pathlib.Path(args.json).write_text(json.dumps({"info": info, "bandwidth": bws, "rows": rows},
                                                                      indent=1))
    info["load_at_end"] = os.getloadavg()
    print(summarize(rows, bws))
    print(f"load average at the end {info['load_at_end']}")
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps({"info": info, "bandwidth": bws, "rows": rows}, indent=1))
    return 0


def _lscpu() -> str:
    """The CPU model and the flags the kernels care about."""
    from sglpy.kernels.cpu_isa import read_cpu_flags

    model = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    flags = read_cpu_flags()
    wanted = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8",
              "asimddp")
    return f"{model}, {os.cpu_count()} CPUs, flags: {' '.join(f for f in wanted if f in flags)}"


if __name__ == "__main__":
    sys.exit(main())

"""The native CPU kernels per ISA level, per call: decode attention (one layer), the int4/int8 GEMV shapes and the
segmented LoRA of one layer's four projections.

python benchmarks/cpu_kernel_levels.py [--levels avx512,avx2,baseline] [--compare /path/to/other/tree]
                                       [--contexts 200,1000] [--batch 1] [--rounds 3] [--threads 1]

Builds the kernels library of every level this CPU runs (or --levels; SGLPY_CPU_ISA's forced builds, cached) from
this tree's kernels/csrc and, with --compare, from another tree's (a `git worktree` of the base commit), then times
the same calls on each build alternately, round after round. SmolLM2-135M shapes: decode attention of `--batch`
requests at each context (9 query heads, 3 KV heads, head_dim 64, float32 KV, slots in sorted random order, as
the pool hands them out after some churn), and the GEMVs qkv 960x576, gate_up 3072x576, down 576x1536 (int4,
group 32) and the lm_head 49152x576 (int8), at 1 and 8 rows; LoRA (rank 16 on all seven modules, pool of 8
slots): one layer's qkv, o, gate_up and down deltas for 16 rows over 8 adapters and for 1 row of 1 adapter, with
float32 and bf16 adapter weights. Prints process CPU microseconds per call, min-max over
rounds (steadier than wall time on a shared box; with --threads 1 it is the work itself), and the largest output
difference of each build against the first one (0.0: bit-identical).
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import time

import torch

from sglpy.kernels import cpu_native
from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels
from sglpy.kernels.quant_linear import pack_linear
from sglpy.kernels.quant_linear_cpu import quant_linear_cpu

ROOT = pathlib.Path(__file__).resolve().parents[1]
HEADS, KV_HEADS, HEAD_DIM = 9, 3, 64
GEMVS = [("qkv", 960, 576, "int4"), ("gate_up", 3072, 576, "int4"), ("down", 576, 1536, "int4"),
         ("lm_head", 49152, 576, "int8")]
USED = ("sglpy_decode_attention", "sglpy_gemv_int4", "sglpy_gemv_int8", "sglpy_gemv_int8_activations")
LORA_PROJS = [(576, (0, 576, 768, 960)), (576, (0, 576)), (576, (0, 1536, 3072)), (1536, (0, 576))]  # qkv o gu d


def build(tree: pathlib.Path, level: str) -> ctypes.CDLL:
    """The library of `tree`'s kernels/csrc at `level` (only the entry points timed here are bound: another tree's
    library may lack this one's newer functions)."""
    saved = cpu_native.CSRC, cpu_native.SIGNATURES
    cpu_native.CSRC = tree / "kernels" / "csrc"
    cpu_native.SIGNATURES = {k: v for k, v in saved[1].items() if k in USED}
    try:
        b = cpu_native.build_native(cpu_native.find_compiler(), cpu_native.cache_dir(), isa=level)
    finally:
        cpu_native.CSRC, cpu_native.SIGNATURES = saved
    if b.lib is None:
        raise SystemExit(f"{tree} at {level}: {b.detail}")
    return b.lib


def cpu_us(fn, budget_s: float = 0.05) -> float:
    """CPU microseconds per call of fn: warm-up, then repetitions for about budget_s."""
    for _ in range(2):
        fn()
    c = time.process_time()
    fn()
    one = max(time.process_time() - c, 1e-6)
    reps = max(3, int(budget_s / one))
    c = time.process_time()
    for _ in range(reps):
        fn()
    return (time.process_time() - c) / reps * 1e6


def attention_case(batch: int, ctx: int, threads: int):
    """A call of decode attention on random data (closure over its tensors) and its output tensor."""
    g = torch.Generator().manual_seed(ctx)
    slots = max(4 * batch * ctx, 4096)
    k = torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g)
    v = torch.randn(slots, KV_HEADS, HEAD_DIM, generator=g)
    r2t = torch.sort(torch.randperm(slots, generator=g)[:batch * ctx].to(torch.int32).view(batch, ctx)).values
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=g)
    rows, lens = torch.arange(batch), torch.full((batch,), ctx)
    out = torch.empty(batch, HEADS, HEAD_DIM)
    held = (q, k, v, r2t, rows, lens, out)  # the call reads them by address: the closure keeps them alive
    ptr = [ctypes.c_void_p(t.data_ptr()) for t in held]

    def call(lib, held=held):
        rc = lib.sglpy_decode_attention(ptr[0], HEADS * HEAD_DIM, ptr[1], ptr[2], 0, slots, KV_HEADS * HEAD_DIM,
                                        ptr[3], batch, ctx, ptr[4], ptr[5], ptr[6], batch, HEADS, KV_HEADS, HEAD_DIM,
                                        HEAD_DIM ** -0.5, threads)
        assert rc == 0, rc
        return out.clone()
    return call


def gemv_case(n: int, k: int, kind: str, rows: int):
    g = torch.Generator().manual_seed(n + rows)
    p = pack_linear(torch.randn(n, k, generator=g) * 0.05, None, kind, 32, native=True)
    x = torch.randn(rows, k, generator=g)
    return lambda lib: quant_linear_cpu(lib, x, p.kind, p.qweight, p.scales, p.bias, n)


def lora_case(rows: int, adapters: int, dtype: torch.dtype, rank: int = 16, slots: int = 8):
    """One layer's four LoRA deltas: `rows` rows spread over `adapters` adapters (csrc/lora.cpp)."""
    from sglpy.kernels.lora import group_rows
    from sglpy.kernels.lora_cpu import _typed, lora_delta_cpu

    g = torch.Generator().manual_seed(rows * 100 + adapters)
    seg = group_rows([k % adapters for k in range(rows)], {k: rank for k in range(adapters)}, torch.device("cpu"))
    projs = []
    for n_in, offsets in LORA_PROJS:
        n_out, n_slices = offsets[-1], len(offsets) - 1
        a = (torch.randn(slots, n_slices * rank, n_in, generator=g) * 0.05).to(dtype)
        bt = (torch.randn(slots, rank, n_out, generator=g) * 0.05).to(dtype)
        projs.append((torch.randn(rows, n_in, generator=g), torch.zeros(rows, n_out), a, bt, torch.tensor(offsets)))

    def call(lib):
        lib = _typed(lib)
        return torch.cat([lora_delta_cpu(lib, x, y.zero_(), a, bt, off, seg) for x, y, a, bt, off in projs], 1)
    return call


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--levels", default=None, help="default: every level this CPU runs")
    ap.add_argument("--compare", default=None, help="another tree (its kernels/csrc), timed alternately")
    ap.add_argument("--contexts", default="200,1000")
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--skip-gemv", action="store_true")
    ap.add_argument("--skip-attention", action="store_true")
    ap.add_argument("--skip-lora", action="store_true")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    levels = (args.levels or ",".join(runnable_levels(read_cpu_flags()))).split(",")
    trees = [ROOT] + ([pathlib.Path(args.compare).resolve()] if args.compare else [])
    libs = {(t.name if len(trees) > 1 else "", lv): build(t, lv) for t in trees for lv in levels}
    cases = {} if args.skip_attention else {
        f"attention b{args.batch} ctx {c}": attention_case(args.batch, int(c), args.threads)
        for c in args.contexts.split(",")}
    if not args.skip_gemv:
        cases.update({f"{name} {kind} {n}x{k} {m} row{'s' if m > 1 else ''}": gemv_case(n, k, kind, m)
                      for name, n, k, kind in GEMVS for m in (1, 8)})
    if not args.skip_lora:
        cases.update({f"lora layer {m}r/{n}a {str(d)[6:]}": lora_case(m, n, d)
                      for m, n in ((16, 8), (1, 1)) for d in (torch.float32, torch.bfloat16)})
    times: dict[tuple, list[float]] = {}
    diffs: dict[tuple, float] = {}
    for _ in range(args.rounds):
        for case, call in cases.items():
            first = None
            for key, lib in libs.items():
                out = call(lib)
                first = out if first is None else first
                diffs[(case, key)] = max(diffs.get((case, key), 0.0), (out - first).abs().max().item())
                times.setdefault((case, key), []).append(cpu_us(lambda: call(lib)))
    print(f"CPU us per call, {args.threads} thread(s), min-max over {args.rounds} rounds; diff: max |out - first build|")
    for case in cases:
        for key in libs:
            v = times[(case, key)]
            print(f"{case:32s} {' '.join(key).strip():24s} {min(v):10.1f} - {max(v):10.1f}   diff {diffs[(case, key)]:.2e}")


if __name__ == "__main__":
    main()

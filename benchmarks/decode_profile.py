"""Batch-1 decode step on the default model: where the time goes (torch ops vs Python/framework), per mode.

python benchmarks/decode_profile.py [--modes none,int8,int4] [--context 200] [--steps 64] [--threads 2]

Per mode (`quantization[:kv_cache_dtype]`): one request's prompt is prefilled, then `steps` decode forwards
run through the ModelRunner (model only: no scheduler, sampler or detokenizer) and `steps` more under the
torch profiler. The native kernels' ISA level is the best this CPU runs, or SGLPY_CPU_ISA's (printed first).
Reported per step: wall time, the process's CPU time (all threads: on a loaded box the steadier number; with
--threads 1 it is the work itself), the time inside torch operators (the profiler's self CPU time
of every aten op, i.e. the kernels plus their dispatch), the time inside the native CPU kernels (each call's
Python wrapper included: kernels/cpu_native.py; the fused decode layer is one call per layer), and the
remainder (Python and the framework around both), the counts, and the engine's whole step for comparison (one
128-token greedy request, end to end, divided by its tokens: adds scheduling, sampling and detokenization).
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def parse_mode(mode: str) -> dict:
    """'int8:bf16' -> {'quantization': 'int8', 'kv_cache_dtype': 'bf16'}."""
    quant, _, kv = mode.partition(":")
    return {"quantization": quant or "none", "kv_cache_dtype": kv or "auto"}


# (module, wrapper) of every native kernel call the model makes; timed around the call
NATIVE_WRAPPERS = [("sglpy.runtime.model.native_decode", "decode_layer_cpu"),
                   ("sglpy.kernels.quant_linear", "quant_linear_cpu"),
                   ("sglpy.kernels.decode_plan", "decode_attention_cpu"),
                   ("sglpy.kernels.decode_attention", "decode_attention_cpu"),
                   ("sglpy.kernels.rmsnorm", "rmsnorm_cpu"),
                   ("sglpy.kernels.rotary_store", "rotate_and_store_cpu"),
                   ("sglpy.kernels.activation", "silu_and_mul_cpu")]


class NativeTimer:
    """Wraps the native kernels' Python wrappers in their callers' modules and sums the time spent inside."""

    def __init__(self):
        import importlib

        self.seconds, self.calls, self._restore = 0.0, 0, []
        for mod_name, fn_name in NATIVE_WRAPPERS:
            mod = importlib.import_module(mod_name)
            real = getattr(mod, fn_name)

            def timed(*a, _real=real, **k):
                t = time.perf_counter()
                try:
                    return _real(*a, **k)
                finally:
                    self.seconds += time.perf_counter() - t
                    self.calls += 1

            setattr(mod, fn_name, timed)
            self._restore.append((mod, fn_name, real))

    def reset(self) -> None:
        self.seconds, self.calls = 0.0, 0

    def close(self) -> None:
        for mod, fn_name, real in self._restore:
            setattr(mod, fn_name, real)


@torch.inference_mode()
def profile_mode(path: str, mode: str, context: int, steps: int) -> dict:
    """Decode-step wall time and its split for one mode."""
    from torch.profiler import ProfilerActivity, profile

    from sglpy.runtime.config import EngineConfig
    from sglpy.runtime.core import BatchEntry, Req
    from sglpy.runtime.model.runner import ModelRunner
    from sglpy.runtime.sampling_params import SamplingParams
    from sglpy.runtime.testing.runner_kv import runner_kv

    cfg = EngineConfig(model=path, device="cpu", max_context_len=context + 3 * steps + 8, **parse_mode(mode))
    runner = ModelRunner(cfg, path)
    kv = runner_kv(runner, context + 3 * steps + 8, 1, cfg.kv_cache_dtype)
    req = Req(rid="p", input_ids=list(range(1000, 1000 + context)), sampling=SamplingParams(max_new_tokens=1))
    assert kv.assign_row(req) and kv.grow(req, context)
    runner.forward([BatchEntry(req, 0, context, sample=True)], 0, kv.buffers)

    def step():
        t = req.kv_len
        req.output_ids.append(1234)
        assert kv.grow(req, 1)
        runner.forward([BatchEntry(req, t, 1, sample=True)], 1, kv.buffers)

    for _ in range(4):
        step()  # warm-up
    t0, c0 = time.perf_counter(), time.process_time()
    for _ in range(steps):
        step()
    wall = (time.perf_counter() - t0) / steps
    cpu = (time.process_time() - c0) / steps  # all threads' CPU time: the work, whatever else loads the box
    timer = NativeTimer()  # a second timed run: the wrappers' own cost stays out of `wall`
    for _ in range(steps):
        step()
    native_s, native_calls = timer.seconds / steps, timer.calls / steps
    timer.close()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(steps):
            step()
    events = [e for e in prof.key_averages() if e.key.startswith("aten::")]
    op_us = sum(e.self_cpu_time_total for e in events) / steps
    calls = sum(e.count for e in events) / steps
    top = sorted(events, key=lambda e: -e.self_cpu_time_total)[:6]
    kv.release(req)
    return dict(mode=mode, step_ms=wall * 1e3, cpu_ms=cpu * 1e3, op_ms=op_us / 1e3, calls=calls,
                native_ms=native_s * 1e3,
                native_calls=native_calls,
                top=[(e.key, e.self_cpu_time_total / steps / 1e3, e.count / steps) for e in top])


def engine_token_ms(path: str, mode: str) -> float:
    """Whole engine step per token: one greedy 128-token request alone (best of 2)."""
    from sglpy.runtime.engine import Engine

    with Engine(path, max_total_tokens=4096, **parse_mode(mode)) as eng:
        sp = {"max_new_tokens": 128, "temperature": 0, "ignore_eos": True}
        eng.generate(input_ids=list(range(1000, 1100)), sampling_params=dict(sp, max_new_tokens=4))
        best = float("inf")
        for _ in range(2):
            t = time.perf_counter()
            eng.generate(input_ids=list(range(1000, 1100)), sampling_params=sp)
            best = min(best, (time.perf_counter() - t) / 128)
    return best * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="none,int8,int4")
    ap.add_argument("--context", type=int, default=200)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglpy.kernels.cpu_native import native_status
    from sglpy.runtime.model.loader import resolve_model_path

    path = resolve_model_path(None)
    print(f"batch-1 decode step, context {args.context}, {args.steps} steps, {args.threads} threads, "
          f"load {os.getloadavg()}")
    print(f"native CPU kernels: {native_status()}")
    print(f"{'mode':<12}{'step ms':>9}{'CPU ms':>8}{'aten ms':>9}{'native ms':>11}{'Python/fw ms':>14}{'fw share':>10}"
          f"{'aten ops':>10}{'native calls':>14}{'engine ms/tok':>15}")
    from sglpy.runtime.engine.cpu_threads import on_own_thread

    for mode in args.modes.split(","):
        # on a short-lived thread: a ModelRunner driven from this thread would leave it a second OpenMP pool that
        # slows the engine measured next (docs/runtime.md, "CPU threads")
        r = on_own_thread(profile_mode, path, mode, args.context, args.steps)
        eng_ms = engine_token_ms(path, mode)
        rest = r["step_ms"] - r["op_ms"] - r["native_ms"]
        print(f"{mode:<12}{r['step_ms']:>9.2f}{r['cpu_ms']:>8.2f}{r['op_ms']:>9.2f}{r['native_ms']:>11.2f}{rest:>14.2f}"
              f"{rest / r['step_ms']:>9.0%}{r['calls']:>10.0f}{r['native_calls']:>14.0f}{eng_ms:>15.2f}", flush=True)
        print("    top ops (ms/step, calls/step): " + ", ".join(f"{k} {ms:.2f} ({n:.0f})" for k, ms, n in r["top"]))
    print(f"load after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

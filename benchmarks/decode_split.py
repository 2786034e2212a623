"""Where one request's decode step goes at a real size: embedding, plans, the fused decoder layers, final norm, lm_head,
and the layers' GEMVs alone against this process's read bandwidth.

python benchmarks/decode_split.py MODEL [--quantization int4] [--context 128] [--steps 48] [--threads 1]

MODEL: a GGUF or HF folder (benchmarks/cpu_scale.py writes random-weight GGUFs with real configs into its --dir).
The ISA level is the best this CPU runs, or SGLPY_CPU_ISA's. One request's prompt of `context` tokens is prefilled,
then `steps` decode forwards run through the ModelRunner (model only: no scheduler or sampler), first untimed parts,
then with each part wrapped. Reported per step: the whole forward's CPU time (all threads) and wall time, each
part's CPU time (all threads) and wall time; then each projection of layer 0 alone (its weights partly in cache),
every layer's projections in turn (weights from memory, as in a step) and a 1 GiB read probe, both in CPU time.
On a shared machine read the CPU times: the wall times carry the neighbours.
"""

from __future__ import annotations

import argparse
import time

import torch


def timed_parts(runner) -> tuple[dict, callable]:
    """Wrap the decode step's parts with CPU/wall timers: (accumulators, undo)."""
    import sglpy.runtime.model.llama as llama

    model, acc, undo = runner.model, {}, []
    parts = [(model, "embed", "embedding"), (llama, "plan_rotary", "rotary plan"),
             (llama, "plan_decode_attention", "attention plan"), (llama, "native_step", "step struct"),
             (llama, "run_native_layers", "decoder layers (fused)"), (model.model.norm, "forward", "final norm"),
             (model.logits_head, "forward", "lm_head")]
    for obj, name, key in parts:
        if obj is None:
            continue
        real = getattr(obj, name)

        def wrapped(*a, _real=real, _key=key, **k):
            c, w = time.process_time(), time.perf_counter()
            try:
                return _real(*a, **k)
            finally:
                slot = acc.setdefault(_key, [0.0, 0.0])
                slot[0] += time.process_time() - c
                slot[1] += time.perf_counter() - w

        setattr(obj, name, wrapped)
        undo.append((obj, name, real))
    return acc, lambda: [setattr(o, n, r) for o, n, r in undo]


def cpu_ms(fn, n: int) -> float:
    """The process's CPU ms per call of fn (after 2 warm-up calls)."""
    for _ in range(2):
        fn()
    c = time.process_time()
    for _ in range(n):
        fn()
    return (time.process_time() - c) / n * 1e3


@torch.inference_mode()
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--quantization", default="int4")
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--steps", type=int, default=48)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglpy.kernels.cpu_native import native_status
    from sglpy.runtime.config import EngineConfig
    from sglpy.runtime.core import BatchEntry, Req
    from sglpy.runtime.model.loader import resolve_model_path
    from sglpy.runtime.model.runner import ModelRunner
    from sglpy.runtime.sampling_params import SamplingParams
    from sglpy.runtime.testing.runner_kv import runner_kv

    path = resolve_model_path(args.model)
    tokens = args.context + 3 * args.steps + 64
    cfg = EngineConfig(model=path, device="cpu", max_context_len=tokens, quantization=args.quantization,
                       num_threads=args.threads)
    runner = ModelRunner(cfg, path)
    print(f"{native_status()}; quantization {runner.quantization}; {args.threads} thread(s)")
    kv = runner_kv(runner, tokens, 1, cfg.kv_cache_dtype)
    req = Req(rid="p", input_ids=list(range(1000, 1000 + args.context)), sampling=SamplingParams(max_new_tokens=1))
    assert kv.assign_row(req) and kv.grow(req, args.context)
    runner.forward([BatchEntry(req, 0, args.context, sample=True)], 0, kv.buffers)

    def step():
        t = req.kv_len
        req.output_ids.append(1234)
        assert kv.grow(req, 1)
        runner.forward([BatchEntry(req, t, 1, sample=True)], 1, kv.buffers)

    for _ in range(4):
        step()
    c, w = time.process_time(), time.perf_counter()
    for _ in range(args.steps):
        step()
    n = args.steps
    print(f"decode step (context {args.context}): CPU {(time.process_time() - c) / n * 1e3:.2f} ms, "
          f"wall {(time.perf_counter() - w) / n * 1e3:.2f} ms")
    acc, undo = timed_parts(runner)
    for _ in range(n):
        step()
    undo()
    for key, (cpu, wall) in acc.items():
        print(f"  {key:<24} CPU {cpu / n * 1e3:7.3f} ms   wall {wall / n * 1e3:7.3f} ms")
    model = runner.model
    head = model.logits_head
    if head is not None and hasattr(head, "packed"):
        x = torch.randn(1, head.in_features)
        ms = cpu_ms(lambda: head(x), 10)
        print(f"  lm_head alone: {head.packed.kind}, {head.packed.nbytes / 1e6:.1f} MB, {ms:.2f} ms CPU, "
              f"{head.packed.nbytes / ms / 1e6:.1f} GB/s")
    lins = [p for layer in model.model.layers for p in (layer.self_attn.qkv_proj, layer.self_attn.o_proj,
                                                        layer.mlp.gate_up_proj, layer.mlp.down_proj)]
    if all(hasattr(p, "packed") for p in lins):
        for lin in lins[:4]:
            x = torch.randn(1, lin.in_features)
            ms = cpu_ms(lambda: lin(x), 50)
            print(f"  layer 0 {lin.in_features}->{lin.out_features} ({lin.packed.kind}, "
                  f"{lin.packed.nbytes / 1e6:.2f} MB) alone: {ms:.3f} ms CPU")
        xs = [torch.randn(1, p.in_features) for p in lins]
        ms = cpu_ms(lambda: [p(x) for p, x in zip(lins, xs)], 5)
        size = sum(p.packed.nbytes for p in lins)
        print(f"  every layer's projections in turn: {ms:.2f} ms CPU for {size / 1e6:.0f} MB = "
              f"{size / ms / 1e6:.1f} GB/s")
    a = torch.ones(1 << 28)
    ms = cpu_ms(a.sum, 3)
    print(f"  read probe (1 GiB sum, {args.threads} thread(s)): {a.numel() * 4 / ms / 1e6:.1f} GB/s of CPU time")


if __name__ == "__main__":
    main()

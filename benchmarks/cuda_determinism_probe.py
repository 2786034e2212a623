"""Where does deterministic inference break on CUDA? The engine matrix under variants (a diagnostic, GPU only).

python benchmarks/cuda_determinism_probe.py [--dtypes bfloat16,float32] [--variants base,nographs,eager,torch]

The engine refuses --enable-deterministic-inference on CUDA (docs/determinism.md); this script sets that refusal
aside for its own engines and runs the issue's matrix (6 seeded sampled + 6 greedy requests on a 2-layer model
with Llama-3.2-1B's shapes: each alone on a flushed cache, then together, together over a cached prefix, and
under chunked_prefill_size=64, alone and together, with and without the radix cache) with the flag, under
variants that switch one suspect off at a time:

- base:     CUDA graphs, overlap scheduling, Triton kernels (the default);
- nographs: CUDA graphs off (decode runs eagerly);
- eager:    graphs and overlap scheduling off;
- torch:    graphs and overlap off, torch references instead of Triton (SGLPY_DISABLE_TRITON=1; set per variant).

Per variant and scenario it prints how many requests equal their lone run in ids and in ids + logprobs, and for
each one that does not: greedy or sampled, and the first output position whose logprob differs (0 = the
prefill's token; later = decode steps).
"""

from __future__ import annotations

import argparse
import os
import tempfile

VARIANTS = {
    "base": {},
    "nographs": {"disable_cuda_graph": True},
    "eager": {"disable_cuda_graph": True, "disable_overlap_schedule": True},
    "torch": {"disable_cuda_graph": True, "disable_overlap_schedule": True},
}


def _requests():
    prefix = " ".join(f"item{i}" for i in range(45))
    prompts = [f"{prefix} case {i} goes" for i in range(6)] * 2
    params = [{"max_new_tokens": 12, "temperature": 0.9, "top_p": 0.95, "seed": 500 + i, "ignore_eos": True}
              for i in range(6)] + [{"max_new_tokens": 12, "temperature": 0, "ignore_eos": True}] * 6
    return prefix, prompts, params


def _result(o):
    return o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]


def matrix(model_path: str, dtype: str, extra: dict) -> dict:
    """{scenario: [(ids equal, first differing logprob position or None)] per request}, against each lone run."""
    from sglpy.runtime.engine import Engine

    prefix, prompts, params = _requests()
    common = dict(dtype=dtype, enable_deterministic_inference=True, max_total_tokens=8192, **extra)
    with Engine(model_path, **common) as eng:
        alone = []
        for p, sp in zip(prompts, params):
            eng.flush_cache()
            alone.append(_result(eng.generate(p, sp, return_logprob=True)))
        eng.flush_cache()
        together = [_result(o) for o in eng.generate(prompts, params, return_logprob=True)]
        eng.flush_cache()
        eng.generate(prefix, {"max_new_tokens": 1})
        cached = [_result(o) for o in eng.generate(prompts, params, return_logprob=True)]
    plans: dict[int, list] = {}
    with Engine(model_path, chunked_prefill_size=64, **common) as eng:
        entry = eng.scheduler._entry

        def traced(req, n):  # each chunk (prefix, length) of the together run, per request index
            e = entry(req, n)
            plans.setdefault(req.rid, []).append((e.prefix_len, e.extend_len))
            return e

        eng.scheduler._entry = traced
        rids = [f"probe-{i}" for i in range(len(prompts))]
        chunked = [_result(o) for o in eng.generate(prompts, params, return_logprob=True, rid=rids)]
        eng.scheduler._entry = entry
        chunked_alone = []
        for p, sp in zip(prompts, params):
            eng.flush_cache()
            chunked_alone.append(_result(eng.generate(p, sp, return_logprob=True)))
    with Engine(model_path, chunked_prefill_size=64, disable_radix_cache=True, **common) as eng:
        nocache = [_result(o) for o in eng.generate(prompts, params, return_logprob=True)]
    print(f"  {dtype} prompt tokens {len(eng.tokenizer.encode(prompts[0]))}; chunks of the together run: "
          + "; ".join(f"{i}: {plans.get(f'probe-{i}')}" for i in range(len(prompts))), flush=True)

    def diff(a, b):
        first = next((i for i, (x, y) in enumerate(zip(a[1], b[1])) if x != y), None)
        return a[0] == b[0], first

    return {name: [diff(a, b) for a, b in zip(alone, got)]
            for name, got in (("together", together), ("cached", cached), ("chunked", chunked),
                              ("chunked-alone", chunked_alone), ("chunked-nocache", nocache))}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtypes", default="bfloat16,float32")
    ap.add_argument("--variants", default="base,nographs,eager,torch")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("this probe needs a CUDA GPU")
    from sglpy.runtime.model import runner
    from sglpy.runtime.testing.tiny_model import make_preset_model

    runner.refuse_nondeterministic = lambda cfg, device: None  # this probe only: the refusal is what it tests
    path = make_preset_model(os.path.join(tempfile.gettempdir(), "sglpy-det-probe"), "llama-1b", num_layers=2)
    print(f"device {torch.cuda.get_device_name()}, torch {torch.__version__}")
    for variant in args.variants.split(","):
        if variant == "torch":
            os.environ["SGLPY_DISABLE_TRITON"] = "1"
        else:
            os.environ.pop("SGLPY_DISABLE_TRITON", None)
        for dtype in args.dtypes.split(","):
            rep = matrix(path, dtype, VARIANTS[variant])
            line = []
            for name, rows in rep.items():
                ids = sum(r[0] for r in rows)
                both = sum(r[0] and r[1] is None for r in rows)
                bad = [f"{'s' if i < 6 else 'g'}{i}@{r[1]}{'' if r[0] else '!'}" for i, r in enumerate(rows)
                       if r[1] is not None or not r[0]]
                line.append(f"{name} {ids}/{both} {' '.join(bad)}")
            print(f"{variant:<9}{dtype:<9}" + " | ".join(line), flush=True)
    print("(ids equal / ids+logprobs equal; sN = seeded sampled request N, gN = greedy, @k = first differing "
          "logprob position, ! = token ids differ too)")


if __name__ == "__main__":
    main()

"""Do requests give the same tokens and logprobs alone, in a batch, over a cached prefix and with chunked prefill,
with and without --enable-deterministic-inference? And what does the flag cost? (docs/determinism.md)

python benchmarks/batch_invariance.py [--modes none,int8,int4,auto] [--flags off,on] [--requests 20] [--tokens 32]
                                      [--temperature 0.8] [--model PATH|preset:NAME[:LAYERS]]
python benchmarks/batch_invariance.py --cost [--modes none,int8,int4] [--reps 2] [--batch 64] [--batch-tokens 32]
                                      [--threads N]

Matrix (default): per mode and flag, N seeded sampled requests and the same N prompts greedy (all prompts share a
~70-token prefix), each alone (cache flushed before each: the reference), then all together, then all together over
the cached prefix, then all together under chunked_prefill_size=64 (a second engine), then the batch again on a flushed cache and
once more with every prompt cached (a rerun of the same seeded batch). Prints, per scenario, how many of the 2N requests equal their lone run in token
ids and, in brackets, in ids and every output logprob bit for bit.

--cost: per mode, the flag off and on in alternation (same process, engines rebuilt): one request alone (128 greedy
tokens) and a batch of 64 requests (prompts 50-500 tokens, --batch-tokens new tokens each, ignore_eos); each run's
wall and CPU seconds, then the best of --reps wall seconds and the on/off ratios (wall, and best CPU seconds).
"""

from __future__ import annotations

import argparse
import random
import time

TOPICS = ["cats", "the ocean", "Python", "winter", "music", "trains", "the moon", "bread", "chess", "rain",
          "a robot", "gardens", "history", "volcanoes", "friendship", "coffee", "mountains", "books", "bicycles",
          "stars", "the sun", "dogs", "clouds", "maps"]
PREFIX = ("You are a careful writer. Answer in one vivid sentence, with concrete details, no lists, no preamble, "
          "and no questions back to the reader. Keep the tone warm and plain; avoid cliches and avoid repeating "
          "the topic word more than once. Topic: ")
TEXT = ("The history of computing is a story of abstraction layered on abstraction. Early machines were programmed "
        "by rewiring panels; later, stored programs let the same hardware run different tasks. Compilers turned "
        "readable code into instructions, and operating systems shared one machine among many users. ")


def _requests(n: int, tokens: int, temperature: float):
    prompts = [f"{PREFIX}{TOPICS[i % len(TOPICS)]} (#{i})." for i in range(n)] * 2
    params = [{"max_new_tokens": tokens, "temperature": temperature, "seed": 1000 + i, "ignore_eos": True}
              for i in range(n)]
    params += [{"max_new_tokens": tokens, "temperature": 0, "ignore_eos": True} for _ in range(n)]
    return prompts, params


def _res(o: dict):
    return o["output_ids"], [lp for lp, _, _ in o["meta_info"]["output_token_logprobs"]]


def _score(ref, got) -> str:
    ids = sum(a[0] == b[0] for a, b in zip(ref, got))
    both = sum(a == b for a, b in zip(ref, got))
    return f"{ids}/{len(ref)} ({both})"


def matrix(args, model) -> None:
    from sglpy.runtime.engine import Engine

    prompts, params = _requests(args.requests, args.tokens, args.temperature)
    cols = ["together", "cached prefix", "chunked 64", "batch rerun", "rerun cached"]
    print(f"{len(prompts)} requests ({args.requests} seeded sampled, {args.requests} greedy), {args.tokens} tokens; "
          "cells: ids equal to the lone run (ids and logprobs bit-identical); 'batch rerun' compares the batch "
          "with itself run again on a flushed cache, 'rerun cached' with a third run that finds every prompt cached")
    print(f"{'mode':<8}{'flag':<6}" + "".join(f"{c:>16}" for c in cols), flush=True)
    for mode in args.modes.split(","):
        for flag in args.flags.split(","):
            kw = dict(quantization=mode, enable_deterministic_inference=flag == "on", max_total_tokens=16384)
            with Engine(model, **kw) as eng:
                alone = []
                for p, sp in zip(prompts, params):
                    eng.flush_cache()
                    alone.append(_res(eng.generate(p, sp, return_logprob=True)))
                eng.flush_cache()
                together = [_res(o) for o in eng.generate(prompts, params, return_logprob=True)]
                eng.flush_cache()
                eng.generate(PREFIX, {"max_new_tokens": 1})
                cached = [_res(o) for o in eng.generate(prompts, params, return_logprob=True)]
                eng.flush_cache()
                again = [_res(o) for o in eng.generate(prompts, params, return_logprob=True)]
                kept = [_res(o) for o in eng.generate(prompts, params, return_logprob=True)]  # prompts now cached
            with Engine(model, chunked_prefill_size=64, **kw) as eng:
                chunked = [_res(o) for o in eng.generate(prompts, params, return_logprob=True)]
            cells = [_score(alone, together), _score(alone, cached), _score(alone, chunked), _score(together, again),
                     _score(together, kept)]
            print(f"{mode:<8}{flag:<6}" + "".join(f"{c:>16}" for c in cells), flush=True)


def _timed(fn) -> tuple[float, float]:
    """(wall, process CPU) seconds of one call."""
    t, c = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - t, time.process_time() - c


def cost(args, model) -> None:
    from sglpy.runtime.engine import Engine

    rng = random.Random(0)
    single = ("Write a short story about a robot who learns to paint.", {"max_new_tokens": 128, "temperature": 0,
                                                                          "ignore_eos": True})
    words = (TEXT * 40).split()
    batch_p, batch_sp = [], []
    for i in range(args.batch):
        n = rng.randint(35, 350)  # ~50-500 tokens
        start = rng.randint(0, len(words) - n - 1)
        batch_p.append(" ".join(words[start:start + n]))
        batch_sp.append({"max_new_tokens": args.batch_tokens, "temperature": 0.8, "seed": i, "ignore_eos": True})
    print(f"one request: 128 greedy tokens; batch: {args.batch} requests, prompts ~50-500 tokens, "
          f"{args.batch_tokens} new tokens each; threads {args.threads or 'default'}; best of {args.reps}, wall s")
    print(f"{'mode':<8}{'single off':>12}{'single on':>12}{'ratio':>8}{'batch off':>12}{'batch on':>12}{'ratio':>8}"
          f"{'CPU ratio single':>18}{'CPU ratio batch':>17}", flush=True)
    for mode in args.modes.split(","):
        runs: dict[str, list] = {}
        for rep in range(args.reps):
            for flag in ("off", "on"):  # alternated: drift on a shared box hits both alike
                with Engine(model, quantization=mode, enable_deterministic_inference=flag == "on",
                            max_total_tokens=32768, max_running_requests=max(64, args.batch),
                            num_threads=args.threads or None) as eng:
                    eng.generate("warm up", {"max_new_tokens": 4})
                    s = _timed(lambda: eng.generate(*single))
                    eng.flush_cache()
                    b = _timed(lambda: eng.generate(batch_p, batch_sp))
                runs.setdefault(flag, []).append((s, b))
                print(f"  {mode} {flag} rep {rep}: single {s[0]:.2f} s ({s[1]:.2f} CPU-s), batch {b[0]:.2f} s "
                      f"({b[1]:.2f} CPU-s)", flush=True)
        s0, s1 = min(r[0] for r in runs["off"]), min(r[0] for r in runs["on"])
        b0, b1 = min(r[1] for r in runs["off"]), min(r[1] for r in runs["on"])
        # CPU seconds too: on a shared box the wall clock mostly measures the other jobs
        cs0, cs1 = min(r[0][1] for r in runs["off"]), min(r[0][1] for r in runs["on"])
        cb0, cb1 = min(r[1][1] for r in runs["off"]), min(r[1][1] for r in runs["on"])
        print(f"{mode:<8}{s0[0]:>12.2f}{s1[0]:>12.2f}{s1[0] / s0[0]:>7.2f}x{b0[0]:>12.2f}{b1[0]:>12.2f}"
              f"{b1[0] / b0[0]:>7.2f}x{cs1 / cs0:>17.2f}x{cb1 / cb0:>16.2f}x", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default=None, help="quantization modes (default: none,int8,int4,auto; --cost: "
                                                   "none,int8,int4)")
    ap.add_argument("--flags", default="off,on")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--model", default=None, help="a folder, .gguf, or preset:NAME[:LAYERS] (default: the "
                                                  "default model)")
    ap.add_argument("--cost", action="store_true", help="measure the flag's cost instead of the matrix")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--batch-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=0, help="--cost: engine num_threads (0 = the default)")
    args = ap.parse_args()
    from sglpy.runtime.testing.tiny_model import model_from_spec

    model = model_from_spec(args.model)
    if args.cost:
        args.modes = args.modes or "none,int8,int4"
        cost(args, model)
    else:
        args.modes = args.modes or "none,int8,int4,auto"
        matrix(args, model)


if __name__ == "__main__":
    main()

"""Do seeded sampled requests give the same tokens alone and in a batch? (docs/runtime.md, quantization section)

python benchmarks/batch_invariance.py [--modes none,int4] [--requests 20] [--tokens 32] [--temperature 0.8]

Per mode: each request alone (one at a time), then all together, then all together again; prints how many
requests' outputs matched their lone runs, and how many the two batched runs agreed on (the batch is then the
same, so only nondeterminism would differ). Distinct short prompts, per-request seeds, the default model.
"""

from __future__ import annotations

import argparse

TOPICS = ["cats", "the ocean", "Python", "winter", "music", "trains", "the moon", "bread", "chess", "rain",
          "a robot", "gardens", "history", "volcanoes", "friendship", "coffee", "mountains", "books", "bicycles",
          "stars", "the sun", "dogs", "clouds", "maps"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modes", default="none,int4")
    ap.add_argument("--requests", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    args = ap.parse_args()
    from sglpy.runtime.engine import Engine

    prompts = [f"Write one sentence about {TOPICS[i % len(TOPICS)]} (#{i})." for i in range(args.requests)]
    params = [{"max_new_tokens": args.tokens, "temperature": args.temperature, "seed": 1000 + i, "ignore_eos": True}
              for i in range(args.requests)]
    print(f"{'mode':<10}{'alone == batched':>18}{'batched == batched again':>26}")
    for mode in args.modes.split(","):
        quant, _, kv = mode.partition(":")
        with Engine(quantization=quant, kv_cache_dtype=kv or "auto", max_total_tokens=8192) as eng:
            alone = [eng.generate(p, sp)["output_ids"] for p, sp in zip(prompts, params)]
            eng.flush_cache()
            batched = [o["output_ids"] for o in eng.generate(prompts, params)]
            eng.flush_cache()
            again = [o["output_ids"] for o in eng.generate(prompts, params)]
        same = sum(a == b for a, b in zip(alone, batched))
        stable = sum(a == b for a, b in zip(batched, again))
        print(f"{mode:<10}{f'{same}/{args.requests}':>18}{f'{stable}/{args.requests}':>26}", flush=True)


if __name__ == "__main__":
    main()

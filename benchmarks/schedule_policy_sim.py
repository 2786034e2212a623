"""Cache hit rate of the waiting-queue policies under a small KV pool (no model, seconds to run).

Drives the real ``RadixCache``, ``order_waiting`` and ``split_in_batch_sharing`` with the
scheduler's admission rule (in policy order, stop at the first request that does not fit in
free + evictable slots, at most ``--max-batch`` running) on offline batches whose requests arrive
in shuffled order. A request publishes its prompt's KV when admitted (cache_unfinished) and holds
its lock for ``--decode-steps`` steps. Reports the hit rate next to the infinite-cache optimum and
the prompt tokens that had to be computed.

    .venv/bin/python benchmarks/schedule_policy_sim.py
"""

from __future__ import annotations

import argparse
import random
import sys
from dataclasses import dataclass

from sglpy.runtime.memory.radix_cache import RadixCache
from sglpy.runtime.engine.schedule_policy import SchedulePolicy, order_waiting, split_in_batch_sharing


@dataclass
class Item:
    input_ids: list
    arrival: int
    extra_key: object = None


def few_shot_groups(rng, groups, questions, prefix_len, q_len):
    """``groups`` few-shot tasks, each a shared prefix followed by ``questions`` distinct questions."""
    out = []
    for g in range(groups):
        prefix = [rng.randrange(50_000) for _ in range(prefix_len)]
        out += [prefix + [rng.randrange(50_000) for _ in range(q_len)] for _ in range(questions)]
    return out


def two_level(rng, groups, contexts, endings, prefix_len, ctx_len, end_len):
    """HellaSwag-like: few-shot prefix -> per-question context -> several endings."""
    out = []
    for g in range(groups):
        prefix = [rng.randrange(50_000) for _ in range(prefix_len)]
        for c in range(contexts):
            ctx = prefix + [rng.randrange(50_000) for _ in range(ctx_len)]
            out += [ctx + [rng.randrange(50_000) for _ in range(end_len)] for _ in range(endings)]
    return out


def optimum_cached(prompts) -> int:
    """Cached tokens with an infinite cache in DFS (token) order; last prompt token recomputed."""
    seen, best = RadixCache(), 0
    for p in sorted(prompts):
        best += min(seen.peek_prefix_len(p), len(p) - 1)
        seen.insert(p, range(len(p)))
    return best


def simulate(policy, prompts, capacity, max_batch, decode_steps):
    """Run the admission loop; returns (cached tokens, steps)."""
    if max(len(p) for p in prompts) > capacity:
        raise ValueError("capacity must hold the longest prompt")
    waiting = [Item(p, i) for i, p in enumerate(prompts)]
    cache, free = RadixCache(), list(range(capacity))
    running: list[tuple] = []  # (node, finish_step)
    cached = step = 0
    while waiting or running:
        for node, done in [r for r in running if r[1] <= step]:
            cache.unlock(node)
        running = [r for r in running if r[1] > step]
        ordered = order_waiting(policy, waiting, cache)
        for item in split_in_batch_sharing(ordered, cache).first:
            if len(running) >= max_batch:
                break
            ids = item.input_ids
            m = cache.match_prefix(ids[:-1])
            cache.lock(m.node)  # before counting evictable slots: our own prefix is not evictable
            need = len(ids) - len(m.slots)
            if need > len(free) + cache.evictable_size:
                cache.unlock(m.node)
                break
            if need > len(free):
                cache.evict(need - len(free), free.extend)
            new = [free.pop() for _ in range(need)]
            res = cache.cache_unfinished(ids, m.slots + new, m.node)
            free.extend(res.duplicate_slots)
            running.append((res.node, step + decode_steps))
            cached += len(m.slots)
            waiting.remove(item)
        step += 1
    return cached, step


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--capacity", type=int, default=1536, help="KV pool size in tokens")
    ap.add_argument("--max-batch", type=int, default=8, help="max running requests")
    ap.add_argument("--decode-steps", type=int, default=4, help="steps a request runs after admission")
    ap.add_argument("--seeds", type=int, default=5, help="shuffled arrival orders averaged")
    args = ap.parse_args(argv)
    workloads = {
        "8 few-shot tasks (400-token prefix) x 16 questions": lambda rng: few_shot_groups(rng, 8, 16, 400, 24),
        "2-level: 4 prefixes (300) x 8 contexts (100) x 4 endings": lambda rng: two_level(rng, 4, 8, 4, 300, 100, 12),
    }
    print(f"pool={args.capacity} tokens, max batch={args.max_batch}, decode steps={args.decode_steps}, "
          f"{args.seeds} shuffled arrival orders")
    for name, make in workloads.items():
        print(f"\n== {name}")
        print(f"{'policy':<12}{'hit rate':>10}{'optimum':>9}{'% of opt':>10}{'computed tok':>14}{'steps':>7}")
        for policy in SchedulePolicy:
            hit = opt = total = steps = 0
            for seed in range(args.seeds):
                rng = random.Random(seed)
                prompts = make(rng)
                rng.shuffle(prompts)
                c, s = simulate(policy, prompts, args.capacity, args.max_batch, args.decode_steps)
                hit, steps = hit + c, steps + s
                opt += optimum_cached(prompts)
                total += sum(len(p) for p in prompts)
            print(f"{policy.value:<12}{hit / total:>10.1%}{opt / total:>9.1%}{100 * hit / opt:>9.1f}%"
                  f"{(total - hit) // args.seeds:>14}{steps / args.seeds:>7.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

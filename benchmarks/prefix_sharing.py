"""Prefix-sharing benchmark: radix cache on vs off vs HF transformers on three workloads.

(1) few-shot: a ~1,000-token 5-shot prefix shared by 64 questions, short answers;
(2) multi-turn chat: 16 conversations x 4 turns (short answers, history reused);
(3) fork: one prefix committed first (as the frontend does before ``fork``), then 8 branches of
    64 tokens each.

Engines get each round's requests all at once (one thread per request, streaming, so TTFT is the
time from submission to the first token). HF transformers runs requests one at a time with no
reuse across requests; it is slow, so it runs a subset (printed) and its throughput is per that
subset. Greedy decoding, ``ignore_eos`` so every system generates the same number of tokens.

    .venv/bin/python benchmarks/prefix_sharing.py            # full run (CPU: tens of minutes)
    .venv/bin/python benchmarks/prefix_sharing.py --quick    # small smoke run
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from sglpy.runtime.memory.radix_cache import RadixCache

WORDS = ("the a of to and in is it that was for on with as his they be at one have this from by hot "
         "word but what some we can out other were all there when up use your how said an each she "
         "which do their time if will way about many then them write would like so these her long "
         "make thing see him two has look more day could go come did number sound no most people my "
         "over know water than call first who may down side been now find any new work part take "
         "get place made live where after back little only round man year came show every good me "
         "give our under name very through just form sentence great think say help low line differ "
         "turn cause much mean before move right boy old too same tell does set three want air well "
         "also play small end put home read hand port large spell add even land here must big high "
         "such follow act why ask men change went light kind off need house picture try us again "
         "animal point mother world near build self earth father head stand own page should country").split()


@dataclass
class Record:
    """One request's outcome."""

    prompt_tokens: int
    cached_tokens: int
    output_ids: list
    ttft: float
    latency: float
    prompt: list = field(default_factory=list)


@dataclass
class Workload:
    """Rounds of prompts; a round's prompts may depend on the previous round's outputs."""

    name: str
    build_round: object  # (round_index, previous_round_records or None) -> list of prompt id lists
    num_rounds: int
    max_new_tokens: list  # per round


def text(rng: random.Random, tokenizer, n_tokens: int) -> list[int]:
    """Token ids of pseudo-English text of about ``n_tokens`` tokens."""
    words = []
    while True:
        words.extend(rng.choice(WORDS) for _ in range(16))
        ids = tokenizer.encode(" ".join(words) + ".", add_special_tokens=False)
        if len(ids) >= n_tokens:
            return ids[:n_tokens]


def few_shot(tok, n_questions: int, prefix_len: int) -> Workload:
    rng = random.Random(1)
    shot_len = max((prefix_len - 20) // 5 - 8, 8)
    prefix = tok.encode("Classify the sentiment of each review as positive or negative.\n\n",
                        add_special_tokens=False)
    for i in range(5):
        prefix += tok.encode("Review:", add_special_tokens=False) + text(rng, tok, shot_len)
        prefix += tok.encode(f"\nSentiment: {'positive' if i % 2 else 'negative'}\n\n", add_special_tokens=False)
    questions = [prefix + tok.encode("Review:", add_special_tokens=False) + text(rng, tok, 24)
                 + tok.encode("\nSentiment:", add_special_tokens=False) for _ in range(n_questions)]
    return Workload(f"few-shot ({len(prefix)}-token prefix x {n_questions} questions)",
                    lambda r, prev: questions, 1, [3])


def multi_turn(tok, n_convs: int, n_turns: int, turn_len: int) -> Workload:
    rng = random.Random(2)
    system = tok.encode("You are a helpful assistant. Answer briefly.\n", add_special_tokens=False)
    user = [[tok.encode("\nUser:", add_special_tokens=False) + text(rng, tok, turn_len)
             + tok.encode("\nAssistant:", add_special_tokens=False) for _ in range(n_turns)]
            for _ in range(n_convs)]

    def build(r, prev):
        if r == 0:
            return [system + user[c][0] for c in range(n_convs)]
        return [p.prompt + p.output_ids + user[c][r] for c, p in enumerate(prev)]

    return Workload(f"multi-turn ({n_convs} conversations x {n_turns} turns, {turn_len}-token turns)",
                    build, n_turns, [8] * n_turns)


def fork(tok, n_branches: int, prefix_len: int, branch_tokens: int) -> Workload:
    rng = random.Random(3)
    prefix = tok.encode("Here is a long document to summarise.\n", add_special_tokens=False) + text(rng, tok, prefix_len)

    def build(r, prev):
        if r == 0:
            return [prefix]  # the frontend commits the shared prefix (max_new_tokens=0) before fork
        return [prefix + tok.encode(f"\nPoint {i + 1} of the summary:", add_special_tokens=False)
                for i in range(n_branches)]

    return Workload(f"fork ({len(prefix)}-token prefix, {n_branches} branches x {branch_tokens} tokens)",
                    build, 2, [0, branch_tokens])


# ------------------------------------------------------------------------------------ systems
def engine_request(eng, ids: list[int], max_new: int) -> Record:
    params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    t0 = time.perf_counter()
    first = out = None
    for chunk in eng.generate(input_ids=ids, sampling_params=params, stream=True):
        first = first or time.perf_counter()
        out = chunk
    end = time.perf_counter()
    meta = out["meta_info"]
    return Record(meta["prompt_tokens"], meta["cached_tokens"], out["output_ids"], first - t0, end - t0)


def run_engine(eng, work: Workload) -> tuple[list[list[Record]], float]:
    assert eng.flush_cache(), "flush_cache refused: the engine is busy"
    rounds, prev, start = [], None, time.perf_counter()
    for r in range(work.num_rounds):
        prompts = work.build_round(r, prev)
        with ThreadPoolExecutor(max_workers=len(prompts)) as pool:
            recs = list(pool.map(lambda ids: engine_request(eng, ids, work.max_new_tokens[r]), prompts))
        for rec, ids in zip(recs, prompts):
            rec.prompt = ids
        rounds.append(recs)
        prev = recs
    return rounds, time.perf_counter() - start


class FirstTokenTimer:
    """A transformers streamer that stamps the time of the first generated token."""

    def __init__(self):
        self.calls, self.first = 0, None

    def put(self, value):
        self.calls += 1
        if self.calls == 2:  # the first call carries the prompt
            self.first = time.perf_counter()

    def end(self):
        pass


def hf_request(model, ids: list[int], max_new: int) -> Record:
    x = torch.tensor([ids])  # x: [1, prompt_len]
    t0 = time.perf_counter()
    with torch.no_grad():
        if max_new == 0:
            model(x)
            return Record(len(ids), 0, [], time.perf_counter() - t0, time.perf_counter() - t0)
        timer = FirstTokenTimer()
        out = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=max_new,
                             min_new_tokens=max_new, do_sample=False, streamer=timer, pad_token_id=0)
    end = time.perf_counter()
    return Record(len(ids), 0, out[0, len(ids):].tolist(), timer.first - t0, end - t0)


def run_hf(model, work: Workload, keep: int) -> tuple[list[list[Record]], float]:
    """Sequential HF generation of the first ``keep`` requests of every round (conversations
    stay whole in multi-turn: round r+1 builds on the same subset's outputs)."""
    rounds, prev, start = [], None, time.perf_counter()
    for r in range(work.num_rounds):
        prompts = work.build_round(r, prev)[:keep]
        recs = [hf_request(model, ids, work.max_new_tokens[r]) for ids in prompts]
        for rec, ids in zip(recs, prompts):
            rec.prompt = ids
        rounds.append(recs)
        prev = recs
    return rounds, time.perf_counter() - start


# ------------------------------------------------------------------------------------ metrics
def best_cached_tokens(rounds: list[list[Record]]) -> int:
    """Cached tokens of an ideal infinite cache: every token whose KV was computed before is a hit.

    Earlier rounds contribute prompt + output[:-1] (the last sampled token has no KV yet); within
    a round requests go in token order (the DFS order, optimal for a batch), each prompt's last
    token is always recomputed.
    """
    seen, best = RadixCache(), 0
    for recs in rounds:
        for rec in sorted(recs, key=lambda r: r.prompt):
            best += min(seen.peek_prefix_len(rec.prompt), len(rec.prompt) - 1)
            seen.insert(rec.prompt, range(len(rec.prompt)))
        for rec in recs:
            seq = rec.prompt + rec.output_ids[:-1]
            seen.insert(seq, range(len(seq)))
    return best


def summarize(system: str, rounds, wall: float) -> dict:
    recs = [r for rnd in rounds for r in rnd]
    prompt = sum(r.prompt_tokens for r in recs)
    gen = [r for r in recs if r.output_ids]
    return {
        "system": system, "requests": len(recs), "wall_s": wall,
        "req_per_s": len(recs) / wall, "out_tok_per_s": sum(len(r.output_ids) for r in recs) / wall,
        "mean_ttft_s": statistics.mean(r.ttft for r in gen) if gen else float("nan"),
        "hit_rate": sum(r.cached_tokens for r in recs) / prompt,
        "best_hit_rate": best_cached_tokens(rounds) / prompt,
    }


def print_table(title: str, rows: list[dict]) -> None:
    print(f"\n== {title}")
    print(f"{'system':<34}{'reqs':>5}{'wall s':>9}{'req/s':>8}{'out tok/s':>10}{'TTFT s':>9}"
          f"{'hit':>7}{'best':>7}{'% of best':>10}")
    for r in rows:
        pct = 100 * r["hit_rate"] / r["best_hit_rate"] if r["best_hit_rate"] else float("nan")
        print(f"{r['system']:<34}{r['requests']:>5}{r['wall_s']:>9.2f}{r['req_per_s']:>8.2f}"
              f"{r['out_tok_per_s']:>10.1f}{r['mean_ttft_s']:>9.3f}{r['hit_rate']:>7.1%}"
              f"{r['best_hit_rate']:>7.1%}{pct:>9.0f}%")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="small sizes for a smoke run")
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--hf-subset", type=int, default=None, help="HF requests per round (default 4, quick 2)")
    ap.add_argument("--no-hf", action="store_true", help="skip the HF transformers baseline")
    ap.add_argument("--policy", default="lpm", help="schedule policy of the cache-on engine")
    ap.add_argument("--model", default=None, help="default: the embedded model; or a path, or preset:NAME[:LAYERS] "
                    "(random weights, real shapes: the GPU machine has no default model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-total-tokens", type=int, default=32768, help="KV pool size of each engine")
    ap.add_argument("--workloads", default="few-shot,multi-turn,fork",
                    help="comma-separated subset of few-shot, multi-turn, fork")
    ap.add_argument("--json", help="also write the results here")
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    wanted = [w.strip() for w in args.workloads.split(",") if w.strip()]
    unknown = sorted(set(wanted) - {"few-shot", "multi-turn", "fork"})
    if unknown:
        raise SystemExit(f"unknown workload(s) {unknown}; choose from few-shot, multi-turn, fork")
    from sglpy.runtime.engine import Engine

    def make_engine(cache_on: bool):
        from sglpy.runtime.testing.tiny_model import model_from_spec

        return Engine(model_from_spec(args.model), num_threads=args.threads, max_total_tokens=args.max_total_tokens,
                      disable_radix_cache=not cache_on, schedule_policy=args.policy, device=args.device,
                      dtype=args.dtype)

    eng = make_engine(True)
    tok = eng.tokenizer
    if args.quick:
        works = [few_shot(tok, 8, 200), multi_turn(tok, 4, 2, 48), fork(tok, 4, 128, 16)]
    else:
        works = [few_shot(tok, 64, 1000), multi_turn(tok, 16, 4, 128), fork(tok, 8, 512, 64)]
    works = [w for w in works if w.name.split(" ")[0] in wanted]
    keep = args.hf_subset or (2 if args.quick else 4)
    print(f"torch threads={args.threads}, policy={args.policy}, pool={args.max_total_tokens} tokens, "
          f"HF subset={'off' if args.no_hf else f'{keep} requests per round, sequential'}", flush=True)

    results: dict[str, list[dict]] = {w.name: [] for w in works}
    outputs: dict[str, dict[str, list]] = {w.name: {} for w in works}
    for label, cache_on in ((f"sglpy, cache on ({args.policy})", True), ("sglpy, cache off", False)):
        if not cache_on:
            eng.shutdown()
            del eng
            gc.collect()
            eng = make_engine(False)
        for w in works:
            rounds, wall = run_engine(eng, w)
            results[w.name].append(summarize(label, rounds, wall))
            outputs[w.name][label] = [r.output_ids for rnd in rounds for r in rnd]
            print(f"  {w.name}: {label} done in {wall:.1f} s", flush=True)
    model_path = eng.model_path
    eng.shutdown()
    del eng
    gc.collect()

    if not args.no_hf:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
        for w in works:
            rounds, wall = run_hf(model, w, keep)
            n = sum(len(r) for r in rounds)
            results[w.name].append(summarize(f"HF transformers ({n} reqs, seq.)", rounds, wall))
            print(f"  {w.name}: HF done in {wall:.1f} s", flush=True)

    for w in works:
        rows = results[w.name]
        print_table(w.name, rows)
        on, off = rows[0], rows[1]
        same = outputs[w.name][on["system"]] == outputs[w.name][off["system"]]
        print(f"cache on vs off: {on['req_per_s'] / off['req_per_s']:.2f}x throughput, "
              f"{off['mean_ttft_s'] / on['mean_ttft_s']:.2f}x lower TTFT; greedy outputs identical: {same}")
        if len(rows) > 2:
            print(f"cache on vs HF (per-request throughput): {on['req_per_s'] / rows[2]['req_per_s']:.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())

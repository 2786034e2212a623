"""NGRAM's draft-length policy replayed over the default model's plain greedy outputs: tokens per forward and the
speedup a verify-cost table predicts, per maximum draft length.

python benchmarks/spec_ngram_replay.py [--costs 1,1.18,1.35,1.54,1.74,2.02,2.24,2.54,3.03] [--prompts 16]

Each workload prompt of benchmarks/speculative.py (extract, free) is decoded alone without speculation; its output
is then replayed through NgramDrafter: each step proposes a draft, the accepted count is the draft's agreement with
the output, and the step costs costs[k] one-row steps for k draft tokens (benchmarks/spec_verify_cost.py measures
them). The modelled speedup is tokens over the summed cost. Host work and the batch policy are not modelled, and
with int4 weights a run with speculation can follow a near tie elsewhere than the plain output.
"""
import argparse
import sys
from types import SimpleNamespace

sys.path.insert(0, __file__.rsplit("/", 1)[0])
import speculative as S  # noqa: E402  (the workloads)

from sglpy.runtime.engine.spec.ngram import NgramDrafter  # noqa: E402


def replay(prompt: list[int], out: list[int], costs: list[float], max_k: int) -> tuple[int, int, float]:
    """(tokens, forwards, cost in one-row steps) of one output decoded with NGRAM drafts of at most max_k."""
    d = NgramDrafter(max_k, 1, 12, set())
    req = SimpleNamespace(spec=None, all_ids=list(prompt), grammar=None,
                          sampling=SimpleNamespace(max_new_tokens=len(out), stop_token_ids=()))
    pos = forwards = 0
    cost = 0.0
    while pos < len(out):
        req.all_ids = list(prompt) + out[:pos]
        limit = min(len(out) - pos - 1, len(costs) - 1)
        draft = d.propose(req, limit) if limit > 0 and pos > 0 else ()  # the prefill's token has no draft
        acc = 0
        while acc < len(draft) and draft[acc] == out[pos + acc]:
            acc += 1
        forwards += 1
        cost += costs[len(draft)]
        if draft:
            d.record(req, len(draft), acc)
        pos += acc + 1
    return len(out), forwards, cost


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--costs", default="1,1.18,1.35,1.54,1.74,2.02,2.24,2.54,3.03")
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    costs = [float(c) for c in args.costs.split(",")]
    from sglpy.runtime.engine import Engine

    eng = Engine(None, num_threads=args.threads, max_total_tokens=16384)
    chat = lambda t: eng.tokenizer.apply_chat_template([{"role": "user", "content": t}],  # noqa: E731
                                                       tokenize=False, add_generation_prompt=True)
    cases = {}
    for w in ("extract", "free"):
        prompts = [chat(t) for t in S.user_texts(w)[:args.prompts]]
        cases[w] = [(eng.tokenizer(p).input_ids, eng.generate(prompt=p, sampling_params=S.sampling(w))["output_ids"])
                    for p in prompts]
    eng.shutdown()
    print(f"costs per draft length 0..{len(costs) - 1}: {costs}")
    for max_k in range(1, len(costs)):
        line = []
        for w, cs in cases.items():
            runs = [replay(p, o, costs, max_k) for p, o in cs]
            tok, fw, cost = (sum(r[i] for r in runs) for i in range(3))
            line.append(f"{w}: {tok / fw:.2f} tok/forward, {tok / cost:.2f}x modelled")
        print(f"max draft tokens {max_k}: " + "; ".join(line))


if __name__ == "__main__":
    main()

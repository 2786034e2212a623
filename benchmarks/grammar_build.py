"""JSON-schema automaton build time and refusals over a JSONSchemaBench sample (no tokenizer, no token index).

    .venv/bin/python benchmarks/grammar_build.py --data DIR [--per-split 40] [--timeout 30] [--walks 3]
                                                 [--jsonl out.jsonl] [--only FILE ...]

DIR holds one folder per split of `*.json` files (JSONSchemaBench's layout: the schema is the file's
`json_schema` field, or the file itself). Every schema is compiled to its module network in one process
(as a compile worker does: caches shared across compiles stay warm), timed per schema, and refusals are
counted by reason. `--walks` samples random byte walks from each automaton and validates them with
`jsonschema` (exactness check). The token side (masks) is not part of this number.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import statistics
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from benchmarks.json_schema_coverage import reason, validator_for  # noqa: E402


def load_sample(data: str, per_split: int) -> list[tuple[str, str, object]]:
    """(split, file, schema) for the first `per_split` files (sorted) of every split folder."""
    out = []
    for split in sorted(os.listdir(data)):
        files = sorted(glob.glob(os.path.join(data, split, "*.json")))[:per_split]
        for path in files:
            doc = json.load(open(path))
            schema = doc["json_schema"] if isinstance(doc, dict) and "json_schema" in doc else doc
            if isinstance(schema, str):
                schema = json.loads(schema)
            out.append((split, os.path.basename(path), schema))
    return out


def byte_walk(prog, rng: random.Random, max_bytes: int = 3000) -> bytes | None:
    """A random walk over the automaton's bytes, biased to finish (None if it did not)."""
    stack, out = list(prog.initial), bytearray()
    for _ in range(max_bytes):
        if prog.is_final(tuple(stack)) and (len(out) > 200 or rng.random() < 0.3):
            return bytes(out)
        live = prog.live_bytes(stack[-1])
        if len(live) == 0:
            return bytes(out) if prog.is_final(tuple(stack)) else None
        closers = [b for b in live if b in b'"}],']
        b = int(rng.choice(closers) if closers and len(out) > 100 and rng.random() < 0.7 else rng.choice(live))
        if not prog.step(stack, b):
            return None
        out.append(b)
    return None


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", required=True, help="JSONSchemaBench sample: one folder per split")
    ap.add_argument("--per-split", type=int, default=40)
    ap.add_argument("--timeout", type=float, default=None,
                    help="time budget per compile (s of the compiling thread's CPU time, CompileBudget's default "
                         "clock; default: none)")
    ap.add_argument("--walks", type=int, default=0, help="random walks validated per compiled schema")
    ap.add_argument("--only", nargs="*", help="only these file names")
    ap.add_argument("--jsonl", help="write one record per schema here")
    args = ap.parse_args()

    from sglpy.grammar.budget import CompileBudget
    from sglpy.grammar.errors import GrammarError
    from sglpy.grammar.json.schema import compile_schema
    from sglpy.grammar.json.vocab import detect_draft

    sample = load_sample(args.data, args.per_split)
    if args.only:
        sample = [s for s in sample if s[1] in args.only]
    rng = random.Random(0)
    records = []
    sink = open(args.jsonl, "w") if args.jsonl else None
    for split, name, schema in sample:
        rec = {"split": split, "file": name, "ok": False, "reason": None, "walks": 0, "invalid": 0}
        t0, c0 = time.perf_counter(), time.thread_time()
        try:
            res = compile_schema(schema, budget=CompileBudget(args.timeout))
            rec["ok"] = True
        except GrammarError as e:
            rec["reason"], rec["error"] = reason(str(e)), str(e)[:300]
        except RecursionError:
            rec["reason"] = "RecursionError"
        rec["seconds"], rec["cpu_seconds"] = time.perf_counter() - t0, time.thread_time() - c0
        if rec["ok"] and args.walks:
            prog = res.dfa
            try:
                validator = validator_for(detect_draft(schema))(schema)
                for _ in range(args.walks):
                    data = byte_walk(prog, rng)
                    if data is None:
                        continue
                    rec["walks"] += 1
                    if not validator.is_valid(json.loads(data.decode("utf-8"))):
                        rec["invalid"] += 1
                        rec.setdefault("unsound", []).append(data[:300].decode("utf-8", "replace"))
            except Exception as e:  # the validator cannot handle the schema (remote refs...)
                rec["unvalidated"] = repr(e)[:100]
        records.append(rec)
        if sink:
            sink.write(json.dumps(rec) + "\n")
            sink.flush()
        print(f"{split:16s} {name:28s} {rec['seconds'] * 1e3:9.1f} ms {rec['cpu_seconds'] * 1e3:9.1f} ms cpu  "
              f"{'ok' if rec['ok'] else rec['reason']}" + (f"  INVALID {rec['invalid']}" if rec["invalid"] else ""),
              flush=True)
    report(records)


def report(records: list[dict]) -> None:
    times = [r["seconds"] for r in records]
    cpu = [r["cpu_seconds"] for r in records]
    ok = sum(r["ok"] for r in records)
    print(f"\n{ok}/{len(records)} compiled ({100 * ok / max(1, len(records)):.1f}%)")
    by_split = Counter(r["split"] for r in records)
    ok_split = Counter(r["split"] for r in records if r["ok"])
    print("per split: " + ", ".join(f"{s} {ok_split[s]}/{by_split[s]}" for s in sorted(by_split)))
    print("refusals: " + ", ".join(f"{k} {v}" for k, v in Counter(r["reason"] for r in records
                                                                      if not r["ok"]).most_common()))
    for label, xs in (("wall", times), ("CPU", cpu)):
        print(f"build time per schema ({label}): p50 {statistics.median(xs) * 1e3:.1f} ms, p90 {pct(xs, .9) * 1e3:.1f} ms, "
              f"p99 {pct(xs, .99) * 1e3:.1f} ms, max {max(xs) * 1e3:.1f} ms, total {sum(xs):.1f} s")
    walks = sum(r["walks"] for r in records)
    print(f"walks validated: {walks}, invalid: {sum(r['invalid'] for r in records)}")


if __name__ == "__main__":
    main()

"""JSON-schema coverage: compiled / refused by reason / soundness / compile time, per test-suite draft or folder.

    .venv/bin/python benchmarks/json_schema_coverage.py                      # JSON-Schema-Test-Suite, 3 drafts
    .venv/bin/python benchmarks/json_schema_coverage.py --dir /path/schemas  # a folder of *.json schemas
    .venv/bin/python benchmarks/json_schema_coverage.py --dir ... --tokenizer  # + token index, real tokenizer

Suite mode drives each compiled schema's automaton with every test instance serialised in the project's
layout (", " and ": "), and with a whitespace-tolerant compile (`[ ]?`) on the compact `json.dumps`
form: an accepted instance that `jsonschema` (same draft) rejects is a soundness failure. Folder mode
compiles each schema, samples random walks from its automaton and validates them with `jsonschema`.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import random
import re
import statistics
import sys
import time
from collections import Counter

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

SUITE = "/work/shared/data/json-schema-test-suite"
DRAFTS = {"draft2020-12": "2020-12", "draft7": "7", "draft4": "4"}


def validator_for(draft: str):
    import jsonschema

    return {"4": jsonschema.Draft4Validator, "6": jsonschema.Draft6Validator, "7": jsonschema.Draft7Validator,
            "2019-09": jsonschema.Draft201909Validator, "2020-12": jsonschema.Draft202012Validator}[draft]


def reason(msg: str) -> str:
    """A short refusal reason: the keyword or construct the GrammarError names."""
    m = re.search(r"keyword '([^']+)'", msg) or re.search(r"unsupported (\$ref|regex construct: [\w /]+)", msg)
    if m:
        return m.group(1)
    for key in ("remote references", "automaton too large", "time budget", "admits no document", "too large",
                "nested too deeply", "does not resolve", "incompatible vocabulary"):
        if key in msg:
            return key
    return msg[:50]


def compile_one(schema, draft: str, ws, timeout_s: float, max_states: int):
    from sglpy.grammar.budget import CompileBudget
    from sglpy.grammar.errors import GrammarError
    from sglpy.grammar.json_schema import compile_schema

    t0 = time.perf_counter()
    try:
        res = compile_schema(schema, whitespace_pattern=ws, budget=CompileBudget(timeout_s, max_states),
                             default_draft=draft)
        return res, None, time.perf_counter() - t0
    except GrammarError as e:
        return None, str(e), time.perf_counter() - t0


def run_suite(draft_dir: str, draft: str, timeout_s: float, max_states: int, loose: bool = True) -> dict:
    """Compile every case of one draft; count refusals, accepted valid / invalid instances."""
    V = validator_for(draft)
    stats = Counter()
    reasons = Counter()
    times = []
    unsound = []
    for path in sorted(glob.glob(os.path.join(SUITE, draft_dir, "*.json"))):
        for case in json.load(open(path)):
            stats["schemas"] += 1
            res, err, dt = compile_one(case["schema"], draft, None, timeout_s, max_states)
            times.append(dt)
            if res is None:
                reasons[reason(err)] += 1
                continue
            stats["compiled"] += 1
            loose_res = compile_one(case["schema"], draft, "[ ]?", timeout_s, max_states)[0] if loose else None
            for t in case["tests"]:
                truth = V(case["schema"]).is_valid(t["data"])
                texts = [(res.dfa, json.dumps(t["data"], separators=(", ", ": "), ensure_ascii=False))]
                if loose_res is not None:
                    texts.append((loose_res.dfa, json.dumps(t["data"], separators=(",", ":"), ensure_ascii=False)))
                got = [d.fullmatch(x.encode()) for d, x in texts]
                if any(got) and not truth:
                    unsound.append((os.path.basename(path), case["description"], t["description"]))
                stats["valid" if truth else "invalid"] += 1
                stats["valid_accepted"] += bool(got[0] and truth)
                stats["invalid_accepted"] += bool(any(got) and not truth)
    return {"stats": stats, "reasons": reasons, "times": times, "unsound": unsound}


def percentiles(times: list[float]) -> str:
    if not times:
        return "-"
    q = statistics.quantiles(times, n=20) if len(times) > 1 else [times[0]] * 19
    return f"p50 {statistics.median(times) * 1e3:.0f} ms, p95 {q[18] * 1e3:.0f} ms, max {max(times) * 1e3:.0f} ms"


def run_dir(folder: str, timeout_s: float, max_states: int, tokenizer: bool, walks: int) -> dict:
    """Compile every *.json schema of a folder (optionally with the real tokenizer's index) and sample walks."""
    from sglpy.grammar import GrammarCompiler
    from sglpy.grammar.errors import GrammarError
    from sglpy.grammar.json_vocab import detect_draft
    from sglpy.grammar.testing import random_walk, small_vocab_info

    info = _real_tokenizer_info() if tokenizer else small_vocab_info()
    comp = GrammarCompiler(info, max_states=max_states, cache_size=0, compile_timeout_s=timeout_s)
    comp.warmup()
    stats, reasons, times, unsound, per_source = Counter(), Counter(), [], [], Counter()
    rng = random.Random(0)
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        schema = json.load(open(path))
        src = os.path.basename(path).split("_")[0]
        stats["schemas"] += 1
        per_source[src, "schemas"] += 1
        t0 = time.perf_counter()
        try:
            guide = comp.compile_json_schema(schema)
        except GrammarError as e:
            times.append(time.perf_counter() - t0)
            reasons[reason(str(e))] += 1
            continue
        except RecursionError:
            times.append(time.perf_counter() - t0)
            reasons["RecursionError"] += 1
            continue
        times.append(time.perf_counter() - t0)
        stats["compiled"] += 1
        per_source[src, "compiled"] += 1
        V = validator_for(detect_draft(schema))
        try:
            validator = V(schema)
            for _ in range(walks):
                w = random_walk(guide, rng, max_steps=400, eos_bias=0.8)
                if not w.finished:
                    continue
                stats["walks"] += 1
                doc = json.loads(w.data.decode("utf-8"))
                if not validator.is_valid(doc):
                    unsound.append((os.path.basename(path), w.data[:200]))
        except Exception as e:  # the validator itself cannot handle the schema (remote refs...)
            stats["unvalidated"] += 1
            del e
    return {"stats": stats, "reasons": reasons, "times": times, "unsound": unsound, "per_source": per_source}


def _real_tokenizer_info():
    from transformers import AutoTokenizer

    from sglpy.grammar import TokenizerInfo
    from sglpy.runtime.model.loader import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))  # the default model's tokenizer
    return TokenizerInfo.from_hf(tok)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="folder of *.json schemas instead of the test suite")
    ap.add_argument("--timeout", type=float, default=5.0, help="compile time budget per schema (s)")
    ap.add_argument("--max-states", type=int, default=20_000)
    ap.add_argument("--tokenizer", action="store_true", help="--dir: build the token index (real tokenizer)")
    ap.add_argument("--walks", type=int, default=5, help="--dir: random walks validated per compiled schema")
    ap.add_argument("--show-refusals", action="store_true")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    if args.dir:
        r = run_dir(args.dir, args.timeout, args.max_states, args.tokenizer, args.walks)
        s = r["stats"]
        print(f"{args.dir}: {s['compiled']}/{s['schemas']} compiled ({100 * s['compiled'] / max(s['schemas'], 1):.0f}%), "
              f"{s['walks']} walks validated, {len(r['unsound'])} invalid, {s['unvalidated']} not validatable; "
              f"compile {percentiles(r['times'])}; over 5 s: {sum(t > 5 for t in r['times'])}")
        srcs = sorted({k for k, _ in r["per_source"]})
        print("  per source: " + ", ".join(f"{k} {r['per_source'][k, 'compiled']}/{r['per_source'][k, 'schemas']}"
                                         for k in srcs))
        print("  refused: " + ", ".join(f"{k} {v}" for k, v in r["reasons"].most_common()))
        for u in r["unsound"][:10]:
            print("  UNSOUND", u)
        return
    for d, draft in DRAFTS.items():
        r = run_suite(d, draft, args.timeout, args.max_states)
        s = r["stats"]
        print(f"{d}: {s['compiled']}/{s['schemas']} compiled ({100 * s['compiled'] / s['schemas']:.0f}%), "
              f"valid accepted {s['valid_accepted']}/{s['valid']}, invalid accepted {s['invalid_accepted']}/"
              f"{s['invalid']}; compile {percentiles(r['times'])}")
        print("  refused: " + ", ".join(f"{k} {v}" for k, v in r["reasons"].most_common()))
        for u in r["unsound"][:10]:
            print("  UNSOUND", u)


if __name__ == "__main__":
    main()

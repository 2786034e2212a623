"""JSON-schema coverage: compiled / refused by reason / soundness / compile time, per test-suite draft or folder.

    .venv/bin/python benchmarks/json_schema_coverage.py                      # JSON-Schema-Test-Suite, 3 drafts
    .venv/bin/python benchmarks/json_schema_coverage.py --suite /path/suite  # another copy of the suite
    .venv/bin/python benchmarks/json_schema_coverage.py --dir /path/schemas  # a folder of *.json schemas
    .venv/bin/python benchmarks/json_schema_coverage.py --dir ... --tokenizer  # + token index, real tokenizer
    .venv/bin/python benchmarks/json_schema_coverage.py --bench /path/jsonschemabench [--per-split 50]
        [--engines sglpy,llguidance,xgrammar] [--walks 2] [--jsonl out.jsonl]   (sglpy-python: Python automata)

Bench mode (a JSONSchemaBench sample: one folder per split) runs sglpy, llguidance and xgrammar in the same
process on the default model's tokenizer (benchmarks/grammar_peers.py): coverage per split, time until the
first mask is ready (p50/p90/p99/max), per-token mask time over random documents each engine generates from
its own masks (p50/p99), and the validity of those documents under `jsonschema` (the schema's draft).

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

# the copy vendored for the tests (drafts 2020-12, 7, 4; MIT, its LICENSE beside it)
SUITE = os.path.join(os.path.dirname(__file__), "..", "tests", "grammar", "json_schema_test_suite")
DRAFTS = {"draft2020-12": "2020-12", "draft7": "7", "draft4": "4"}


def validator_for(draft: str):
    import jsonschema

    return {"4": jsonschema.Draft4Validator, "6": jsonschema.Draft6Validator, "7": jsonschema.Draft7Validator,
            "2019-09": jsonschema.Draft201909Validator, "2020-12": jsonschema.Draft202012Validator}[draft]


def suite_documents(suite: str, draft_dir: str) -> dict:
    """The documents one draft's remote $refs name, pre-loaded: the suite's remotes/ (its top level and the
    draft's folder) as served at http://localhost:1234/, and the metaschemas (jsonschema's own copies)."""
    from jsonschema_specifications import REGISTRY

    docs = {uri: REGISTRY.contents(uri) for uri in REGISTRY}
    root = os.path.join(suite, "remotes")
    for path in sorted(glob.glob(os.path.join(root, "**", "*.json"), recursive=True)):
        rel = os.path.relpath(path, root).replace(os.sep, "/")
        if not rel.startswith("draft") or rel.startswith(draft_dir + "/"):
            docs["http://localhost:1234/" + rel] = json.load(open(path))
    return docs


def suite_registry(documents: dict, draft: str):
    """A `referencing` registry serving the documents to jsonschema's validators (which then never fetch)."""
    from referencing import Registry, Resource
    from referencing.exceptions import NoSuchResource
    from referencing.jsonschema import specification_with

    spec = specification_with(validator_for(draft).META_SCHEMA["$schema"])

    def retrieve(uri: str):
        if uri not in documents:
            raise NoSuchResource(ref=uri)
        return Resource.from_contents(documents[uri], default_specification=spec)

    return Registry(retrieve=retrieve)


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


def compile_one(schema, draft: str, ws, timeout_s: float, max_states: int, documents: dict | None = None):
    from sglpy.grammar.budget import CompileBudget
    from sglpy.grammar.errors import GrammarError
    from sglpy.grammar.json.schema import compile_schema

    t0 = time.perf_counter()
    try:
        res = compile_schema(schema, whitespace_pattern=ws, budget=CompileBudget(timeout_s, max_states),
                             default_draft=draft, documents=documents)
        return res, None, time.perf_counter() - t0
    except GrammarError as e:
        return None, str(e), time.perf_counter() - t0


def run_suite(suite: str, draft_dir: str, draft: str, timeout_s: float, max_states: int, loose: bool = True) -> dict:
    """Compile every case of one draft; count refusals, accepted valid / invalid instances.

    A schema refused as "admits no document" counts as covered (not compiled, `unsat`) only when jsonschema
    rejects every one of the case's test instances: refusing an unsatisfiable schema by name is the right
    answer. With a valid instance among its tests it is an ordinary refusal ("admits no document, wrongly")."""
    documents = suite_documents(suite, draft_dir)
    registry = suite_registry(documents, draft)
    stats = Counter()
    reasons = Counter()
    times = []
    unsound = []
    for path in sorted(glob.glob(os.path.join(suite, draft_dir, "*.json"))):
        for case in json.load(open(path)):
            stats["schemas"] += 1
            validator = validator_for(draft)(case["schema"], registry=registry)
            try:
                truths = [validator.is_valid(t["data"]) for t in case["tests"]]
            except re.error:  # a pattern Python's re cannot parse (\p{..}): the suite's own answers stand in
                truths = [t["valid"] for t in case["tests"]]
            res, err, dt = compile_one(case["schema"], draft, None, timeout_s, max_states, documents)
            times.append(dt)
            if res is None:
                if "admits no document" in err and not any(truths):
                    stats["unsat"] += 1
                    continue
                reasons[reason(err) + (", wrongly" if "admits no document" in err else "")] += 1
                continue
            stats["compiled"] += 1
            loose_res = (compile_one(case["schema"], draft, "[ ]?", timeout_s, max_states, documents)[0]
                         if loose else None)
            for t, truth in zip(case["tests"], truths):
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
    xs = sorted(times)
    p95 = xs[min(len(xs) - 1, int(0.95 * len(xs)))]
    return f"p50 {statistics.median(xs) * 1e3:.0f} ms, p95 {p95 * 1e3:.0f} ms, max {xs[-1] * 1e3:.0f} ms"


def timed_walk(guide, rng: random.Random, max_steps: int = 400, eos_bias: float = 0.8):
    """A uniform random walk (EOS taken with eos_bias when allowed), timing allowed() and advance() per token.

    Returns (bytes, finished, [(allowed_us, advance_us, first_visit)])."""
    from sglpy.grammar.testing import mask_to_ids

    info = guide.info
    eos = set(info.eos_token_ids)
    state, data, costs, seen = guide.initial_state, bytearray(), [], set()
    for _ in range(max_steps):
        first = state not in seen
        seen.add(state)
        t0 = time.perf_counter()
        mask = guide.allowed(state)
        t1 = time.perf_counter()
        ids = mask_to_ids(mask, info.vocab_size)
        finals = [t for t in ids if t in eos]
        tok = finals[0] if finals and rng.random() < eos_bias else int(ids[rng.randrange(len(ids))])
        t2 = time.perf_counter()
        state = guide.advance(state, tok)
        t3 = time.perf_counter()
        costs.append(((t1 - t0) * 1e6, (t3 - t2) * 1e6, first))
        if tok in eos:
            return bytes(data), True, costs
        data += info.token_bytes[tok]
    return bytes(data), False, costs


def pickle_cost(guide, info) -> tuple[int, float]:
    """Bytes and seconds (dump + load) of the guide pickled without its TokenizerInfo, as compile workers send it."""
    import io
    import pickle

    refs = {id(info): "."} | {id(v): k for k, v in vars(info).items() if not isinstance(v, (int, float, str, bool))}

    class P(pickle.Pickler):
        def persistent_id(self, obj):
            return refs.get(id(obj))

    class U(pickle.Unpickler):
        def persistent_load(self, pid):
            return info if pid == "." else getattr(info, pid)

    t0 = time.perf_counter()
    buf = io.BytesIO()
    P(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(guide)
    U(io.BytesIO(buf.getvalue())).load()
    return len(buf.getvalue()), time.perf_counter() - t0


def run_dir(folder: str, timeout_s: float, max_states: int, tokenizer: bool, walks: int, clock: str = "wall") -> dict:
    """Compile every *.json schema of a folder (optionally with the real tokenizer's index) and sample walks."""
    from sglpy.grammar import GrammarCompiler
    from sglpy.grammar.errors import GrammarError
    from sglpy.grammar.json.vocab import detect_draft
    from sglpy.grammar.testing import small_vocab_info

    info = _real_tokenizer_info() if tokenizer else small_vocab_info()
    comp = GrammarCompiler(info, max_states=max_states, cache_size=0, compile_timeout_s=timeout_s, budget_clock=clock)
    comp.warmup()
    rng = random.Random(0)
    records = []
    for path in sorted(glob.glob(os.path.join(folder, "*.json"))):
        schema = json.load(open(path))
        rec = {"file": os.path.basename(path), "source": os.path.basename(path).split("_")[0], "ok": False,
               "reason": None, "walks": 0, "invalid": 0, "costs": []}
        records.append(rec)
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            guide = comp.compile_json_schema(schema)
        except GrammarError as e:
            rec["reason"], rec["error"] = reason(str(e)), str(e)[:200]
        except RecursionError:
            rec["reason"] = "RecursionError"
        rec["seconds"], rec["cpu_seconds"] = time.perf_counter() - t0, time.process_time() - c0
        if rec["reason"] is not None:
            continue
        rec["ok"], rec["guide"] = True, repr(guide)
        rec["pickle_bytes"], rec["pickle_s"] = pickle_cost(guide, info)
        try:
            validator = validator_for(detect_draft(schema))(schema)
            for _ in range(walks):
                data, finished, costs = timed_walk(guide, rng)
                rec["costs"] += costs
                if not finished:
                    continue
                rec["walks"] += 1
                if not validator.is_valid(json.loads(data.decode("utf-8"))):
                    rec["invalid"] += 1
                    rec.setdefault("unsound", []).append(data[:200].decode("utf-8", "replace"))
        except Exception as e:  # the validator itself cannot handle the schema (remote refs...)
            rec["unvalidated"] = repr(e)[:100]
    return {"records": records}


def report_dir(records: list, folder: str) -> None:
    """Coverage per source and refusal reasons, walks, compile time and per-token cost percentiles."""
    ok = [r for r in records if r["ok"]]
    times = [r["seconds"] for r in records]
    walks, invalid = sum(r["walks"] for r in records), sum(r["invalid"] for r in records)
    unval = sum("unvalidated" in r for r in records)
    print(f"{folder}: {len(ok)}/{len(records)} compiled ({100 * len(ok) / max(len(records), 1):.0f}%), {walks} walks "
          f"validated, {invalid} invalid, {unval} not validatable; compile {percentiles(times)}; "
          f"over 5 s: {sum(t > 5 for t in times)}")
    budget = [r for r in records if r["reason"] == "time budget"]
    if budget:
        cpu = sorted(r["cpu_seconds"] for r in budget)
        print(f"  time-budget refusals: {len(budget)}, their CPU time p50 {cpu[len(cpu) // 2]:.1f} s, min {cpu[0]:.1f} s "
              f"(with --clock wall a loaded machine refuses more)")
    for src in sorted({r["source"] for r in records}):
        mine = [r for r in records if r["source"] == src]
        why = Counter(r["reason"] for r in mine if not r["ok"])
        print(f"  {src}: {sum(r['ok'] for r in mine)}/{len(mine)}" +
              (" -- refused: " + ", ".join(f"{k} {v}" for k, v in why.most_common()) if why else ""))
    costs = [c for r in records for c in r["costs"]]
    if costs:
        def pct(xs, q):
            xs = sorted(xs)
            return xs[min(len(xs) - 1, int(q * len(xs)))]
        al = [c[0] for c in costs]
        first = [c[0] for c in costs if c[2]]
        adv = [c[1] for c in costs]
        print(f"  per token ({len(costs)} steps): allowed p50 {pct(al, .5):.0f} us, p99 {pct(al, .99):.0f} us, "
              f"max {max(al):.0f} us; first visit of a state p50 {pct(first, .5):.0f} us, p99 {pct(first, .99):.0f} us, "
              f"max {max(first):.0f} us; advance p50 {pct(adv, .5):.0f} us, p99 {pct(adv, .99):.0f} us")
    sizes = [(r["pickle_bytes"], r["pickle_s"]) for r in ok if "pickle_bytes" in r]
    if sizes:
        kb, ps = sorted(x[0] / 1024 for x in sizes), sorted(x[1] * 1e3 for x in sizes)
        print(f"  pickled guide (no TokenizerInfo): p50 {kb[len(kb) // 2]:.0f} KiB, max {kb[-1]:.0f} KiB; "
              f"dump+load p50 {ps[len(ps) // 2]:.1f} ms, max {ps[-1]:.1f} ms")
    for r in records:
        for u in r.get("unsound", [])[:2]:
            print("  UNSOUND", r["file"], u[:160])


def run_bench(folder: str, per_split: int, engines: list[str], walks: int, max_steps: int) -> list[dict]:
    """Compile every sampled schema with every engine, then generate `walks` documents from each compiled one."""
    from transformers import AutoTokenizer

    from sglpy.grammar import TokenizerInfo
    from sglpy.grammar.json.vocab import detect_draft
    from sglpy.kernels.trie_walk import native_trie_walker
    from sglpy.runtime.model.loader import resolve_model_path
    from benchmarks.grammar_peers import ENGINES, load_bench, walk

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
    info = TokenizerInfo.from_hf(tok, walker=native_trie_walker())  # masks as the engine computes them (native)
    built = {name: ENGINES[name](tok, info) for name in engines}
    records = []
    for i, (split, name, schema) in enumerate(load_bench(folder, per_split)):
        try:
            validator = validator_for(detect_draft(schema))(schema)
        except Exception:  # noqa: BLE001 - a schema jsonschema cannot load: its documents are not validated
            validator = None
        for ename, engine in built.items():
            c0 = time.process_time()
            got = engine.compile(schema)
            cpu = time.process_time() - c0
            rec = {"split": split, "file": name, "engine": ename, "ok": got.error is None, "compile_s": got.seconds,
                   "compile_cpu_s": cpu, "error": (got.error or "")[:200],
                   "reason": None if got.error is None
                   else reason(got.error) if ename.startswith("sglpy") else got.error[:60],
                   "docs": 0, "invalid": 0, "unfinished": 0, "mask_s": [], "advance_s": []}
            rng = random.Random(i)
            for _ in range(walks if got.new is not None else 0):
                data, masks, advances = walk(engine, got, info, rng, max_steps)
                rec["mask_s"] += masks
                rec["advance_s"] += advances
                if data is None:
                    rec["unfinished"] += 1
                    continue
                rec["docs"] += 1
                try:
                    valid = validator is None or validator.is_valid(json.loads(data.decode("utf-8")))
                except ValueError:
                    valid = False
                if not valid:
                    rec["invalid"] += 1
                    rec.setdefault("invalid_docs", []).append(data[:300].decode("utf-8", "replace"))
            records.append(rec)
        if (i + 1) % 50 == 0:
            print(f"  {i + 1} schemas", flush=True)
    return records


def report_bench(records: list[dict]) -> None:
    """Markdown tables: coverage per split, compile and mask percentiles, documents and validity, per engine."""
    engines = list(dict.fromkeys(r["engine"] for r in records))
    splits = sorted({r["split"] for r in records})

    def pct(xs, q):
        xs = sorted(xs)
        return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")

    print("\n| split | schemas | " + " | ".join(engines) + " |\n|---|---|" + "---|" * len(engines))
    for split in splits + ["all"]:
        mine = [r for r in records if split in ("all", r["split"])]
        n = len({r["file"] for r in mine})
        cells = [sum(r["ok"] for r in mine if r["engine"] == e) for e in engines]
        print(f"| {split} | {n} | " + " | ".join(f"{c} ({100 * c / max(n, 1):.0f}%)" for c in cells) + " |")
    print("\n| engine | compile CPU p50 | p90 | p99 | max | all | wall p50 | wall p99 | mask p50 | mask p99 | steps "
          "| documents | invalid |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for e in engines:
        mine = [r for r in records if r["engine"] == e]
        cpu, wall = [r["compile_cpu_s"] for r in mine], [r["compile_s"] for r in mine]
        masks = [x for r in mine for x in r["mask_s"]]
        docs, bad = sum(r["docs"] for r in mine), sum(r["invalid"] for r in mine)
        ms = lambda x: f"{x * 1e3:.1f} ms" if x < 0.01 else f"{x * 1e3:,.0f} ms"  # noqa: E731
        print(f"| {e} | {ms(pct(cpu, .5))} | {ms(pct(cpu, .9))} | {ms(pct(cpu, .99))} | {ms(max(cpu))} | "
              f"{sum(cpu):.1f} s | {ms(pct(wall, .5))} | {ms(pct(wall, .99))} | {pct(masks, .5) * 1e6:.0f} us | "
              f"{pct(masks, .99) * 1e6:.0f} us | {len(masks)} | {docs} | {bad} |")
    for e in engines:
        why = Counter(r["reason"] for r in records if r["engine"] == e and not r["ok"])
        print(f"\n{e} refusals: " + (", ".join(f"{k} {v}" for k, v in why.most_common()) or "none"))
        for r in [r for r in records if r["engine"] == e and r["invalid"]][:3]:
            print(f"  invalid document ({r['split']}/{r['file']}): {r['invalid_docs'][0][:120]}")


def _real_tokenizer_info():
    from transformers import AutoTokenizer

    from sglpy.grammar import TokenizerInfo
    from sglpy.kernels.trie_walk import native_trie_walker
    from sglpy.runtime.model.loader import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))  # the default model's tokenizer
    return TokenizerInfo.from_hf(tok, walker=native_trie_walker())  # masks as the engine computes them (native)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dir", help="folder of *.json schemas instead of the test suite")
    ap.add_argument("--suite", default=SUITE, help="JSON-Schema-Test-Suite folder holding draft2020-12/, draft7/, "
                    "draft4/ (default: the copy under tests/grammar)")
    ap.add_argument("--timeout", type=float, default=5.0, help="compile time budget per schema (s; the compiler default)")
    ap.add_argument("--max-states", type=int, default=20_000)
    ap.add_argument("--clock", choices=("wall", "cpu"), default="cpu",
                    help="--dir: budget clock; cpu = the compiling thread's CPU time (the default on every path)")
    ap.add_argument("--tokenizer", action="store_true", help="--dir: build the token index (real tokenizer)")
    ap.add_argument("--walks", type=int, default=5, help="--dir: random walks validated per compiled schema")
    ap.add_argument("--jsonl", help="--dir / --bench: write one JSON record per schema (and engine) here")
    ap.add_argument("--bench", help="a JSONSchemaBench sample: one folder of *.json per split")
    ap.add_argument("--per-split", type=int, default=50, help="--bench: schemas per split (the first, sorted)")
    ap.add_argument("--engines", default="sglpy,llguidance,xgrammar", help="--bench: engines to compare")
    ap.add_argument("--max-steps", type=int, default=300, help="--bench: tokens per generated document at most")
    args = ap.parse_args()
    print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
    if args.bench:
        records = run_bench(args.bench, args.per_split, args.engines.split(","), args.walks, args.max_steps)
        report_bench(records)
        if args.jsonl:
            with open(args.jsonl, "w") as f:
                for rec in records:
                    f.write(json.dumps(dict(rec, mask_s=len(rec["mask_s"]), advance_s=len(rec["advance_s"]))) + "\n")
        print(f"load: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f}")
        return
    if args.dir:
        r = run_dir(args.dir, args.timeout, args.max_states, args.tokenizer, args.walks, args.clock)
        report_dir(r["records"], args.dir)
        if args.jsonl:
            with open(args.jsonl, "w") as f:
                for rec in r["records"]:
                    rec = dict(rec, costs=len(rec["costs"]))
                    f.write(json.dumps(rec) + "\n")
        return
    for d, draft in DRAFTS.items():
        r = run_suite(args.suite, d, draft, args.timeout, args.max_states)
        s = r["stats"]
        covered = s["compiled"] + s["unsat"]
        print(f"{d}: {covered}/{s['schemas']} covered ({100 * covered / s['schemas']:.1f}%): {s['compiled']} compiled, "
              f"{s['unsat']} refused as unsatisfiable (admits no document; jsonschema rejects every test instance), "
              f"valid accepted {s['valid_accepted']}/{s['valid']}, invalid accepted {s['invalid_accepted']}/"
              f"{s['invalid']}; compile {percentiles(r['times'])}")
        print("  refused: " + ", ".join(f"{k} {v}" for k, v in r["reasons"].most_common()))
        for u in r["unsound"][:10]:
            print("  UNSOUND", u)


if __name__ == "__main__":
    main()

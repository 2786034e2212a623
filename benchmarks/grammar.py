"""Grammar engine benchmark: compile time (cold / cached), per-token cost, forced-token share.

    .venv/bin/python benchmarks/grammar.py [--steps 150] [--walks 3] [--no-peers] [--out results.json]

Runs on the default model's tokenizer (SmolLM2, 49,152 tokens). Per-token cost = allowed(state)
(mask lookup) + advance(state, token), timed around those calls only, over uniform random walks
(a stress case: walks spend most steps inside JSON strings). outlines-core and xgrammar run in the
same process when installed (optional; never required).
"""

from __future__ import annotations

import argparse
import json
import random
import time

import numpy as np

from sglpy.grammar import GrammarCompiler, TokenizerInfo
from sglpy.grammar.testing import mask_to_ids
from sglpy.kernels.trie_walk import native_trie_walker

EMAIL = r"[a-z0-9._%+-]+@[a-z0-9.-]+\.[a-z]{2,}"
IPV4 = r"((25[0-5]|2[0-4]\d|[01]?\d\d?)\.){3}(25[0-5]|2[0-4]\d|[01]?\d\d?)"
SIMPLE = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
          "required": ["name", "age"]}
MEDIUM = {
    "type": "object",
    "properties": {
        "id": {"type": "integer"}, "title": {"type": "string", "maxLength": 40},
        "status": {"enum": ["draft", "published", "archived"]},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
        "author": {"type": "object", "properties": {"name": {"type": "string"},
                                                     "email": {"type": "string", "format": "email"}},
                   "required": ["name"]},
        "created": {"type": "string", "format": "date-time"}, "score": {"type": "number"},
        "published": {"type": "boolean"},
    },
    "required": ["id", "title", "status", "tags"],
}
GLAIVE = {"type": "object", "properties": {"data": {"type": "array", "items": {"type": "object", "properties": {
    "patient_id": {"type": "string"}, "heart_rate": {"type": "number"}, "timestamp": {"type": "string",
                                                                                      "format": "date-time"}},
    "required": ["patient_id", "heart_rate", "timestamp"]}}}, "required": ["data"]}
JSON_EBNF = r"""
start: object
?value: object | array | STRING | NUMBER | "true" | "false" | "null"
array: "[" [value (", " value)*] "]"
object: "{" [pair (", " pair)*] "}"
pair: STRING ": " value
STRING: /"([^"\\\x00-\x1f]|\\["\\\/bfnrt])*"/
NUMBER: /-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?/
"""
CONSTRAINTS = [
    ("re_email", "regex", EMAIL), ("re_ipv4", "regex", IPV4),
    ("json_simple", "json_schema", SIMPLE), ("json_medium", "json_schema", MEDIUM),
    ("json_glaive", "json_schema", GLAIVE), ("ebnf_json", "ebnf", JSON_EBNF),
]
DOCS = {
    "json_simple": [{"name": "Alice", "age": 31}, {"name": "Bob Stone", "age": 7}],
    "json_medium": [
        {"id": 12, "title": "Hello world", "status": "published", "tags": ["news", "tech"],
         "author": {"name": "Ann Lee", "email": "ann@example.org"}, "created": "2024-02-29T10:00:00Z",
         "score": 4.5, "published": True},
        {"id": 7, "title": "Draft notes", "status": "draft", "tags": [], "published": False},
    ],
    "json_glaive": [{"data": [{"patient_id": "p-001", "heart_rate": 72.5, "timestamp": "2024-01-01T08:00:00Z"},
                              {"patient_id": "p-002", "heart_rate": 64, "timestamp": "2024-01-01T09:30:00Z"}]}],
}


def pct(xs, q):
    return float(np.percentile(xs, q)) if xs else float("nan")


def walk_costs(allowed_fn, advance_fn, pick, init, finished, steps, walks, seed=0):
    """Per-step microseconds of allowed+advance over uniform random walks."""
    rng = random.Random(seed)
    costs = []
    for _ in range(walks):
        s = init()
        for _ in range(steps):
            t0 = time.perf_counter_ns()
            m = allowed_fn(s)
            t1 = time.perf_counter_ns()
            tok = pick(m, rng)
            if tok is None:
                break
            t2 = time.perf_counter_ns()
            s = advance_fn(s, tok)
            t3 = time.perf_counter_ns()
            costs.append((t1 - t0 + t3 - t2) / 1000)
            if finished(s):
                break
    return costs


def ours(tok, info, name, kind, value, steps, walks):
    comp = GrammarCompiler(info)
    t0 = time.perf_counter()
    g = comp.compile(kind, value)
    cold = time.perf_counter() - t0
    t0 = time.perf_counter()
    comp.compile(kind, value)
    cached = time.perf_counter() - t0
    eos = set(info.eos_token_ids)

    def pick(m, rng):
        ids = mask_to_ids(m, info.vocab_size)
        ids = [t for t in ids.tolist() if t not in eos]
        return rng.choice(ids) if ids else None

    costs = walk_costs(g.allowed, g.advance, pick, lambda: g.initial_state, lambda s: not g.can_continue(s),
                       steps, walks)
    row = {"engine": "sglpy", "constraint": name, "compile_s": cold, "cached_ms": cached * 1000,
           "p50_us": pct(costs, 50), "p99_us": pct(costs, 99), "steps": len(costs)}
    if hasattr(g, "num_states"):
        row["states"] = g.num_states
        row["visited_states"] = len(g.table) if hasattr(g, "table") else None
    return g, row


def forced_share(g, tok, docs):
    """Canonical tokens of each document fed one by one, jumping over forced strings."""
    total = forced = 0
    jump_us = []
    for doc in docs:
        text = json.dumps(doc, separators=(", ", ": "))
        prompt = "<|im_start|>assistant\n"
        full = tok.encode(prompt + text, add_special_tokens=False)
        canon = full[len(tok.encode(prompt, add_special_tokens=False)):]
        out, s = [], g.initial_state
        while len(out) < len(canon):
            f = g.forced_string(s)
            if f:
                t0 = time.perf_counter_ns()
                r = g.jump_tokens(s, out, f, tok)
                jump_us.append((time.perf_counter_ns() - t0) / 1000)
                if r.rollback or r.new_token_ids:
                    out = out[: len(out) - r.rollback] + r.new_token_ids
                    assert out == canon[: len(out)], "non-canonical jump"
                    forced += len(r.new_token_ids) - r.rollback
                    s = r.new_state
                    continue
            s = g.advance(s, canon[len(out)])
            out.append(canon[len(out)])
        assert g.is_final(s)
        total += len(canon)
    return forced, total, jump_us


def outlines_core_row(tok, info, name, kind, value, steps, walks):
    import outlines_core as oc
    from outlines_core.json_schema import build_regex_from_schema

    if kind == "ebnf":
        return None
    regex = build_regex_from_schema(json.dumps(value)) if kind == "json_schema" else value
    eos = info.eos_token_ids[0]
    vocab: dict[bytes, list[int]] = {}
    for i, b in enumerate(info.token_bytes):
        if b is not None and i not in info.eos_token_ids:
            vocab.setdefault(b, []).append(i)
    voc = oc.Vocabulary(eos, vocab)
    t0 = time.perf_counter()
    index = oc.Index(regex, voc)
    cold = time.perf_counter() - t0
    mask = np.zeros(info.mask_words, np.int32)

    def allowed(guide):
        guide.write_mask_into(mask.ctypes.data, mask.size, 4)
        return mask

    def pick(m, rng):
        ids = [t for t in mask_to_ids(m, info.vocab_size).tolist() if t != eos]
        return rng.choice(ids) if ids else None

    def advance(guide, t):
        guide.advance(t)
        return guide

    costs = walk_costs(allowed, advance, pick, lambda: oc.Guide(index), lambda gd: gd.is_finished(), steps, walks)
    return {"engine": "outlines-core", "constraint": name, "compile_s": cold, "cached_ms": float("nan"),
            "p50_us": pct(costs, 50), "p99_us": pct(costs, 99), "steps": len(costs)}


_XGR_INFO: dict = {}


def xgrammar_row(tok, info, name, kind, value, steps, walks):
    import xgrammar as xgr

    if kind == "ebnf":
        return None
    if "info" not in _XGR_INFO:
        _XGR_INFO["info"] = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=info.vocab_size)
    comp = xgr.GrammarCompiler(_XGR_INFO["info"], max_threads=1, cache_enabled=False)
    t0 = time.perf_counter()
    compiled = comp.compile_json_schema(json.dumps(value), any_whitespace=False) if kind == "json_schema" \
        else comp.compile_regex(value)
    cold = time.perf_counter() - t0
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    eos = set(info.eos_token_ids)

    def allowed(mt):
        mt.fill_next_token_bitmask(bitmask)
        return bitmask

    def pick(m, rng):
        ids = [t for t in mask_to_ids(m[0].numpy(), info.vocab_size).tolist() if t not in eos]
        return rng.choice(ids) if ids else None

    def advance(mt, t):
        assert mt.accept_token(t)
        return mt

    costs = walk_costs(allowed, advance, pick, lambda: xgr.GrammarMatcher(compiled), lambda mt: mt.is_terminated(),
                       steps, walks)
    return {"engine": "xgrammar", "constraint": name, "compile_s": cold, "cached_ms": float("nan"),
            "p50_us": pct(costs, 50), "p99_us": pct(costs, 99), "steps": len(costs)}


def load_sample(folder: str, per_split: int | None):
    """(split, file, schema) for the JSONSchemaBench sample's files (`json_schema` field, or the schema itself)."""
    import glob
    import os

    out = []
    for split in sorted(d for d in os.listdir(folder) if os.path.isdir(os.path.join(folder, d))):
        files = sorted(glob.glob(os.path.join(folder, split, "*.json")))[:per_split]
        for path in files:
            with open(path) as f:
                doc = json.load(f)
            schema = doc.get("json_schema", doc) if isinstance(doc, dict) else doc
            if isinstance(schema, str):
                schema = json.loads(schema)
            out.append((split, os.path.basename(path), schema))
    return out


def sample_run(info, folder, per_split, walks, max_steps, timeout_s, seed=0):
    """Per schema: compile time until the first mask is ready (compile + initial mask, nothing cached), then
    random walks timing the engine's share of a decode step (allowed + advance + is_final/can_continue)."""
    import jsonschema

    from sglpy.grammar import GrammarError
    from sglpy.grammar.json.vocab import detect_draft

    validators = {"4": jsonschema.Draft4Validator, "6": jsonschema.Draft6Validator, "7": jsonschema.Draft7Validator,
                  "2019-09": jsonschema.Draft201909Validator, "2020-12": jsonschema.Draft202012Validator}
    rng = random.Random(seed)
    recs = []
    for split, name, schema in load_sample(folder, per_split):
        comp = GrammarCompiler(info, cache_size=0, compile_timeout_s=timeout_s)
        rec = {"split": split, "file": name, "ok": False, "steps": [], "first": [], "walks": 0, "invalid": 0}
        recs.append(rec)
        t0 = time.perf_counter()
        try:
            g = comp.compile_json_schema(schema)
            g.allowed(g.initial_state)
        except (GrammarError, RecursionError) as e:
            rec["compile_s"], rec["error"] = time.perf_counter() - t0, str(e)[:120]
            continue
        rec["compile_s"], rec["ok"] = time.perf_counter() - t0, True
        try:
            validator = validators[detect_draft(schema)](schema)
        except Exception:  # noqa: BLE001 - the validator cannot read the schema: walks are timed, not validated
            validator = None
        eos = set(info.eos_token_ids)
        seen = {g.initial_state}
        for _ in range(walks):
            s, data = g.initial_state, bytearray()
            for _ in range(max_steps):
                first = s not in seen
                seen.add(s)
                t1 = time.perf_counter_ns()
                m = g.allowed(s)
                t2 = time.perf_counter_ns()
                ids = mask_to_ids(m, info.vocab_size)
                fin = [t for t in ids.tolist() if t in eos]
                tok = fin[0] if fin and rng.random() < 0.8 else int(ids[rng.randrange(len(ids))])
                t3 = time.perf_counter_ns()
                s = g.advance(s, tok)
                g.is_final(s) and g.can_continue(s)
                t4 = time.perf_counter_ns()
                (rec["first"] if first else rec["steps"]).append((t2 - t1 + t4 - t3) / 1000)
                if tok in eos:
                    rec["walks"] += 1
                    if validator is not None:
                        try:
                            rec["invalid"] += not validator.is_valid(json.loads(data.decode("utf-8")))
                        except Exception:  # noqa: BLE001 - undecodable output counts as invalid
                            rec["invalid"] += 1
                    break
                data += info.token_bytes[tok]
    return recs


def sample_report(recs) -> dict:
    """Coverage, compile-time and per-token percentiles of a sample run (printed and returned)."""
    ok = [r for r in recs if r["ok"]]
    comp = [r["compile_s"] * 1e3 for r in ok]
    steps = [c for r in ok for c in r["steps"] + r["first"]]
    first = [c for r in ok for c in r["first"]]
    out = {"schemas": len(recs), "compiled": len(ok), "walks": sum(r["walks"] for r in ok),
           "invalid": sum(r["invalid"] for r in ok), "compile_ms": {q: pct(comp, q) for q in (50, 90, 99, 100)},
           "compile_all_s": sum(comp) / 1e3, "token_us": {q: pct(steps, q) for q in (50, 90, 99, 100)},
           "first_visit_us": {q: pct(first, q) for q in (50, 99)}, "steps": len(steps), "first_visits": len(first)}
    print(f"{out['compiled']}/{out['schemas']} compiled; compile until first mask (ms): "
          + ", ".join(f"p{q} {v:.1f}" for q, v in out["compile_ms"].items()) + f"; all {out['compile_all_s']:.1f} s")
    print(f"per token ({out['steps']} steps, {out['first_visits']} first visits; us): "
          + ", ".join(f"p{q} {v:.1f}" for q, v in out["token_us"].items())
          + f"; first visits p50 {out['first_visit_us'][50]:.0f}, p99 {out['first_visit_us'][99]:.0f}")
    print(f"walks {out['walks']}, invalid {out['invalid']}")
    for split in sorted({r["split"] for r in recs}):
        mine = [r for r in recs if r["split"] == split]
        cs = [r["compile_s"] * 1e3 for r in mine if r["ok"]]
        print(f"  {split:<16} {sum(r['ok'] for r in mine)}/{len(mine)}  compile p50 {pct(cs, 50):.1f} ms, "
              f"max {max(cs, default=float('nan')):.0f} ms")
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--walks", type=int, default=3)
    ap.add_argument("--no-peers", action="store_true")
    ap.add_argument("--out", default=None, help="write the rows as JSON")
    ap.add_argument("--sample", default=None, help="a JSONSchemaBench sample folder (one subfolder per split): "
                    "compile until the first mask and per-token cost over walks, instead of the fixed constraints")
    ap.add_argument("--per-split", type=int, default=None, help="--sample: schemas per split (default all)")
    ap.add_argument("--timeout", type=float, default=4.5, help="--sample: compile budget per schema (s)")
    ap.add_argument("--no-native", action="store_true", help="masks by the numpy walk (the native walk's reference)")
    args = ap.parse_args()
    from transformers import AutoTokenizer

    from sglpy.runtime.model.loader import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
    t0 = time.perf_counter()
    info = TokenizerInfo.from_hf(tok, walker=None if args.no_native else native_trie_walker())
    t_info = time.perf_counter() - t0
    t0 = time.perf_counter()
    native = info.walker is not None and info.walker.ready()
    _ = (info.flat_trie, info.string_rest, info.packed_bytes) if native else (info.trie, info.string_rest_levels)
    _ = info.sorted_tokens
    t_trie = time.perf_counter() - t0
    print(f"tokenizer: {info.kind}, vocab {info.vocab_size}; TokenizerInfo.from_hf {t_info:.2f} s, "
          f"token trie (once per tokenizer) {t_trie:.2f} s; masks by the {'native' if native else 'numpy'} walk")
    if args.sample:
        recs = sample_run(info, args.sample, args.per_split, args.walks, args.steps, args.timeout)
        res = sample_report(recs)
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"summary": res, "schemas": [dict(r, steps=len(r["steps"]), first=len(r["first"]))
                                                       for r in recs]}, f, indent=1)
        return
    rows, shares = [], []
    for name, kind, value in CONSTRAINTS:
        g, row = ours(tok, info, name, kind, value, args.steps, args.walks)
        rows.append(row)
        if name in DOCS:
            forced, total, jus = forced_share(g, tok, DOCS[name])
            shares.append({"constraint": name, "forced": forced, "total": total, "share": forced / total,
                           "jump_p50_us": pct(jus, 50)})
        if not args.no_peers:
            for fn in (outlines_core_row, xgrammar_row):
                try:
                    r = fn(tok, info, name, kind, value, args.steps, args.walks)
                except ImportError:
                    continue
                if r:
                    rows.append(r)
    print(f"\n{'constraint':<12} {'engine':<14} {'compile s':>10} {'cached ms':>10} {'p50 us':>8} {'p99 us':>8} "
          f"{'steps':>6} {'states':>7}")
    for r in rows:
        print(f"{r['constraint']:<12} {r['engine']:<14} {r['compile_s']:>10.3f} {r['cached_ms']:>10.3f} "
              f"{r['p50_us']:>8.1f} {r['p99_us']:>8.1f} {r['steps']:>6} {r.get('states', ''):>7}")
    print(f"\n{'JSON workload':<12} {'forced':>7} {'total':>6} {'share':>6} {'jump p50 us':>12}")
    for s in shares:
        print(f"{s['constraint']:<12} {s['forced']:>7} {s['total']:>6} {s['share']:>6.0%} {s['jump_p50_us']:>12.0f}")
    tot_f, tot_t = sum(s["forced"] for s in shares), sum(s["total"] for s in shares)
    print(f"{'all':<12} {tot_f:>7} {tot_t:>6} {tot_f / tot_t:>6.0%}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"rows": rows, "forced": shares, "trie_s": t_trie, "info_s": t_info}, f, indent=1)


if __name__ == "__main__":
    main()

"""JSON extraction on the default model: unconstrained vs constrained vs constrained + jump-forward.

python benchmarks/json_decode.py [--requests 64] [--threads 2] [--model PATH|preset:smollm2-135m] [--device cuda]
                                 [--jump-min-tokens auto,1,4,8] [--extend-graphs on,off] [--repeat 3]
                                 [--warmup auto|on|off] [--modes constrained,constrained+jump]
python benchmarks/json_decode.py --schemas distinct [--repeat 3]   # 64 schemas vs one shared schema

In the spirit of the SGLang paper's JSON benchmark: a schema with many fixed keys and short values,
64 requests submitted at once. Reports model forward steps, output tokens/s, latency, validity and
the grammar's share of step time (mask + advance + jump). outlines on HF transformers is run only
when `outlines` is installed (it is not a dependency).

`--schemas distinct` instead compares the same 64 constrained+jump requests sharing one schema with each request
carrying its own schema (variants of the same shape: `population_millions` gets maximum 999 + i, so every
automaton differs while the outputs stay alike), in interleaved rounds; each round uses schemas never compiled
before (cold compiles in both arms: one compile for the shared arm, 64 for the distinct one).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema
import torch

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 16},
        "country": {"type": "string", "maxLength": 16},
        "continent": {"type": "string", "enum": ["Africa", "Asia", "Europe", "North America",
                                                  "South America", "Oceania"]},
        "population_millions": {"type": "integer", "minimum": 0, "maximum": 999},
        "is_capital": {"type": "boolean"},
        "founded_century": {"type": "integer", "minimum": 1, "maximum": 21},
        "famous_landmark": {"type": "string", "maxLength": 20},
        "main_language": {"type": "string", "maxLength": 12},
        "climate": {"type": "string", "enum": ["tropical", "dry", "temperate", "continental", "polar"]},
    },
    "required": ["name", "country", "continent", "population_millions", "is_capital", "founded_century",
                 "famous_landmark", "main_language", "climate"],
    "additionalProperties": False,
}
CITIES = ["Paris", "Tokyo", "Lima", "Cairo", "Oslo", "Delhi", "Sydney", "Toronto", "Nairobi", "Madrid",
          "Seoul", "Quito", "Dublin", "Hanoi", "Lagos", "Prague"]


def prompts(tok, n):
    keys = ", ".join(SCHEMA["properties"])
    out = []
    for i in range(n):
        city = CITIES[i % len(CITIES)]
        msg = (f"Extract facts about the city of {city} as a JSON object with the keys {keys}. "
               f"Reply with JSON only. (request {i})")
        out.append(tok.apply_chat_template([{"role": "user", "content": msg}], tokenize=False,
                                           add_generation_prompt=True))
    return out


def variant(k: int) -> dict:
    """The schema with population_millions' maximum moved to 999 + k: a distinct automaton, the same outputs."""
    out = json.loads(json.dumps(SCHEMA))
    out["properties"]["population_millions"]["maximum"] = 999 + k
    return out


def run_mode(eng, texts, mode, min_jump=None, extend_graphs=True, warmup=False, repeat=1):
    """One mode: `warmup` runs it once untimed first (Triton compiles, first-use buffers), then `repeat` timed runs
    on a flushed cache, the median kept. min_jump sets the shortest jump applied (None: the engine's own choice);
    extend_graphs False runs jumped spans eagerly (the multi-token CUDA-graph steps of extend_graph.py set aside)."""
    runs = [_run_once(eng, texts, mode, min_jump, extend_graphs) for _ in range(int(warmup) + repeat)][int(warmup):]
    best = sorted(runs, key=lambda r: r["seconds"])[len(runs) // 2]
    best["spread"] = (min(r["seconds"] for r in runs), max(r["seconds"] for r in runs))
    return best


def _run_once(eng, texts, mode, min_jump, extend_graphs, schemas=None):
    """One run; `schemas` (one per request) replaces the shared SCHEMA."""
    sp = {"max_new_tokens": 160, "temperature": 0}
    schemas = schemas or [SCHEMA] * len(texts)
    sps = [sp if mode == "unconstrained" else dict(sp, json_schema=json.dumps(x)) for x in schemas]
    eng.constrained.jump_forward_enabled = mode.startswith("constrained+jump")
    auto, graphs = eng.constrained.min_jump_tokens, eng.runner.extend_graphs
    if min_jump is not None:
        eng.constrained.min_jump_tokens = min_jump
    if not extend_graphs:
        eng.runner.extend_graphs = None
    eng.flush_cache()
    before = eng.get_server_info()
    t0, c0 = time.perf_counter(), time.process_time()
    outs = eng.generate(texts, sps)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    after = eng.get_server_info()
    eng.constrained.min_jump_tokens, eng.runner.extend_graphs = auto, graphs
    valid = 0
    for o, schema in zip(outs, schemas):
        try:
            jsonschema.validate(json.loads(o["text"]), schema)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    g0, g1 = before["grammar"], after["grammar"]
    grammar_s = sum(g1[k] - g0[k] for k in ("mask_s", "advance_s", "jump_s"))
    step_s = after["step_s"] - before["step_s"]
    n_out = sum(o["meta_info"]["completion_tokens"] for o in outs)
    jumped = sum(o["meta_info"]["jump_forward_tokens"] for o in outs)
    return dict(mode=mode, steps=after["num_steps"] - before["num_steps"], seconds=dt, cpu_s=cpu, out_tokens=n_out,
                jumped=jumped, tok_s=n_out / dt, lat_p50=statistics.median(o["meta_info"]["e2e_latency"] for o in outs),
                valid=valid, n=len(outs), grammar_share=grammar_s / step_s if step_s else 0.0)


def compare_schemas(eng, texts, repeat: int) -> None:
    """constrained+jump with one shared schema vs one schema per request, interleaved rounds of cold schemas."""
    n = len(texts)
    eng.constrained.compile("json_schema", json.dumps(variant(-1))).result()  # compile workers started
    rows = {"shared": [], "distinct": []}
    for r in range(repeat):
        base = 1000 * (r + 1)  # never compiled before: each round's compiles are cold in both arms
        for arm in ("shared", "distinct") if r % 2 == 0 else ("distinct", "shared"):
            schemas = [variant(base + (i if arm == "distinct" else 0) + (500 if arm == "shared" else 0))
                       for i in range(n)]
            rows[arm].append(_run_once(eng, texts, "constrained+jump", None, True, schemas))
            x = rows[arm][-1]
            print(f"  round {r + 1} {arm}: wall {x['seconds']:.2f} s, CPU {x['cpu_s']:.2f} s, steps {x['steps']}, "
                  f"valid {x['valid']}/{n}", flush=True)
    print(f"\n{n} constrained+jump requests, {repeat} interleaved rounds (cold schemas each round), median [min-max]:")
    med = {}
    for arm, runs in rows.items():
        sec, cpu = [x["seconds"] for x in runs], [x["cpu_s"] for x in runs]
        med[arm] = (statistics.median(sec), statistics.median(cpu))
        print(f"  {arm:<8} ({1 if arm == 'shared' else n} schema{'s' * (arm == 'distinct')}): wall "
              f"{med[arm][0]:.2f} s [{min(sec):.2f}-{max(sec):.2f}], engine-process CPU {med[arm][1]:.2f} s "
              f"[{min(cpu):.2f}-{max(cpu):.2f}], steps {statistics.median(x['steps'] for x in runs):.0f}, valid "
              f"{min(x['valid'] for x in runs)}/{n}, jumped {statistics.median(x['jumped'] for x in runs):.0f} tokens")
    print(f"distinct / shared: wall {med['distinct'][0] / med['shared'][0]:.2f}x, CPU "
          f"{med['distinct'][1] / med['shared'][1]:.2f}x (target <= 1.2x)")


def _profile(eng, texts, mode: str) -> str:
    """cProfile of the step loop (the loop thread) over one run of `mode`: top functions, own and cumulative."""
    from host_overhead import profile_text, profiled_steps

    with profiled_steps(eng) as prof:
        r = _run_once(eng, texts, mode, None, True)
    return (f"\nprofile of {mode}: {r['steps']} steps in {r['seconds']:.3f} s\n"
            + profile_text(prof, ("tottime", "cumulative"), 22))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--model", default=None, help="default: the embedded model; or a path, or preset:NAME[:LAYERS] "
                    "(random weights, real shapes: the GPU machine has no default model)")
    ap.add_argument("--device", default="auto")
    ap.add_argument("--dtype", default=None, help="default float32 (CPU), bfloat16 on CUDA")
    ap.add_argument("--jump-min-tokens", default="auto", help="comma list of shortest jumps to compare "
                    "(auto = the engine's choice: 1 on CPU, more under CUDA graphs), e.g. auto,1,4,8")
    ap.add_argument("--extend-graphs", default="on", help="on, off or on,off: jumped spans through the captured "
                    "multi-token steps, or eagerly (only differs under CUDA graphs)")
    ap.add_argument("--repeat", type=int, default=1, help="timed runs per mode; the median is printed")
    ap.add_argument("--warmup", default="auto", choices=["auto", "on", "off"],
                    help="one untimed run per mode first (auto: on for CUDA, where the first run of a mode "
                         "compiles Triton kernels for its shapes)")
    ap.add_argument("--modes", default="unconstrained,constrained",
                    help="modes run before the constrained+jump rows (the jump ratio needs constrained)")
    ap.add_argument("--schemas", default="shared", choices=["shared", "distinct"],
                    help="distinct: compare one shared schema with one schema per request (constrained+jump only)")
    ap.add_argument("--profile", default=None, metavar="MODE",
                    help="after the table, one more run of MODE (e.g. constrained+jump) under cProfile of the "
                         "step loop: the top functions by own and by cumulative time")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from sglpy.runtime.engine import Engine
    from sglpy.runtime.testing.tiny_model import model_from_spec

    cuda = args.device.startswith("cuda") or (args.device == "auto" and torch.cuda.is_available())
    eng = Engine(model_from_spec(args.model), num_threads=args.threads, device=args.device,
                 dtype=args.dtype or ("bfloat16" if cuda else "float32"), max_total_tokens=65536)
    warm = args.warmup == "on" or (args.warmup == "auto" and cuda)
    kw = dict(warmup=warm, repeat=args.repeat)
    print(f"device {eng.runner.device} ({torch.cuda.get_device_name() if cuda else 'cpu'}), model {eng.model_path}")
    texts = prompts(eng.tokenizer, args.requests)
    if args.schemas == "distinct":
        compare_schemas(eng, texts, args.repeat)
        eng.shutdown()
        return
    t = time.perf_counter()
    eng.constrained.compile("json_schema", json.dumps(SCHEMA)).result()  # a Future: compiled in a worker
    print(f"schema compile (cold, in a compile worker): {time.perf_counter() - t:.2f}s")
    rows = [run_mode(eng, texts, m, **kw) for m in args.modes.split(",")]
    print(f"jump-forward's shortest jump under this engine (auto): {eng.constrained.min_jump_tokens}")
    for x in args.extend_graphs.split(","):
        for j in args.jump_min_tokens.split(","):
            label = "constrained+jump" + ("" if j == "auto" else f" min{j}") + (" eager" if x == "off" else "")
            rows.append(run_mode(eng, texts, label, None if j == "auto" else int(j), x == "on", **kw))
    prof = _profile(eng, texts, args.profile) if args.profile else None
    eng.shutdown()
    try:
        import outlines  # noqa: F401
        print("outlines is installed but not wired into this benchmark yet")
    except ImportError:
        print("outlines not installed: skipped (optional)")
    print(f"\nwarm-up run per mode: {'yes' if warm else 'no'}; timed runs per mode: {args.repeat} (median, [min-max])")
    print(f"\n{'mode':<29}{'steps':>7}{'sec':>8}{'cpu s':>8}{'out tok':>9}{'jumped':>8}{'tok/s':>8}{'lat p50':>9}"
          f"{'valid':>8}{'grammar %':>11}")
    for r in rows:
        print(f"{r['mode']:<29}{r['steps']:>7}{r['seconds']:>8.3f}{r['cpu_s']:>8.2f}{r['out_tokens']:>9}{r['jumped']:>8}"
              f"{r['tok_s']:>8.1f}{r['lat_p50']:>8.1f}s{r['valid']:>5}/{r['n']:<3}{100 * r['grammar_share']:>9.1f}%"
              + (f"  [{r['spread'][0]:.3f}-{r['spread'][1]:.3f}]" if args.repeat > 1 else ""))
    if prof:
        print(prof)
    c = next((r for r in rows if r["mode"] == "constrained"), None)
    for j in rows[len(args.modes.split(",")):] if c else []:
        print(f"\n{j['mode']} vs constrained: {c['seconds'] / j['seconds']:.2f}x faster end to end "
              f"({c['cpu_s'] / j['cpu_s']:.2f}x in engine-process CPU time), "
              f"{c['steps'] / max(j['steps'], 1):.2f}x fewer forward steps (target 1.5x; grammar share target <= 5%)")


if __name__ == "__main__":
    main()

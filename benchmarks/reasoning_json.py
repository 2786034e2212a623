"""JSON answers after free thinking: a tiny random Qwen3 whose chat template opens `<think>`, served with the
qwen3 reasoning parser; N requests with a JSON schema, sampled. Counts answers that are valid JSON after the
thinking and reports how the thinking ended (the model's own `</think>` or the max_thinking_tokens bound).

python benchmarks/reasoning_json.py [--requests 50] [--max-thinking-tokens 16] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

import jsonschema
import torch

from sglpy.runtime.engine import Engine
from sglpy.runtime.reasoning import reasoning_format, split_reasoning
from sglpy.runtime.testing.tiny_model import make_reasoning_model

SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 12},
    "population_millions": {"type": "integer", "minimum": 0, "maximum": 999},
    "capital": {"type": "boolean"},
    "climate": {"type": "string", "enum": ["tropical", "dry", "temperate", "continental", "polar"]}},
    "required": ["city", "population_millions", "capital", "climate"], "additionalProperties": False}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--max-thinking-tokens", type=int, default=16)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    path = make_reasoning_model(pathlib.Path(tempfile.gettempdir()) / "sglpy-reasoning-qwen3")
    eng = Engine(path, reasoning_parser="qwen3", max_thinking_tokens=args.max_thinking_tokens,
                 max_total_tokens=32768)
    tok = eng.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe city number {i} as JSON."}],
                                       tokenize=False, add_generation_prompt=True) for i in range(args.requests)]
    params = [{"max_new_tokens": args.max_thinking_tokens + 96, "temperature": 0.8, "seed": i,
               "json_schema": json.dumps(SCHEMA)} for i in range(args.requests)]
    t = time.perf_counter()
    outs = eng.generate(prompts, params)
    wall = time.perf_counter() - t
    eng.shutdown()
    end_id = tok.convert_tokens_to_ids("</think>")
    fmt = reasoning_format("qwen3")
    valid = forced = 0
    for o in outs:
        ids = o["output_ids"]
        if end_id in ids and ids.index(end_id) == args.max_thinking_tokens:
            forced += 1
        try:
            jsonschema.validate(json.loads(split_reasoning(fmt, o["text"], True).content), SCHEMA)
            valid += 1
        except (ValueError, jsonschema.ValidationError):
            pass
    tokens = sum(len(o["output_ids"]) for o in outs)
    print(f"{args.requests} requests: {valid} valid JSON answers after the thinking; thinking ended by the bound "
          f"({args.max_thinking_tokens} tokens) in {forced}, by the model in {args.requests - forced}; "
          f"{tokens} output tokens in {wall:.1f} s ({tokens / wall:.0f} tok/s)")


if __name__ == "__main__":
    main()

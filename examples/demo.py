"""`make demo`: the engine on the default model, SGLang-style programs in-process, then over HTTP."""

import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import sglpy as sgl  # noqa: E402

PROMPTS = ["What is the capital of France?", "Give me three colors.", "Write a haiku about the sea.",
           "What is 12 + 30?", "Name a famous scientist.", "Say hello in Spanish.",
           "What do bees make?", "Suggest a name for a cat."]


def engine_batch(engine):
    """A batch of chat prompts through the runtime Engine (continuous batching)."""
    tok = engine.tokenizer
    texts = [tok.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
             for p in PROMPTS]
    t = time.perf_counter()
    outs = engine.generate(texts, {"max_new_tokens": 48, "temperature": 0})
    dt = time.perf_counter() - t
    for p, o in zip(PROMPTS, outs):
        print(f"Q: {p}\nA: {o['text'].strip()[:160]}\n")
    n = sum(o["meta_info"]["completion_tokens"] for o in outs)
    print(f"{len(outs)} requests, {n} output tokens in {dt:.1f}s = {n / dt:.1f} tok/s (batched, CPU)")
    schema = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 20},
                                               "country": {"type": "string", "maxLength": 20}},
              "required": ["city", "country"]}
    q = tok.apply_chat_template([{"role": "user", "content": "Name a city and its country as JSON."}],
                                tokenize=False, add_generation_prompt=True)
    out = engine.generate(q, {"json_schema": schema, "max_new_tokens": 64, "temperature": 0})
    print(f"\njson_schema -> {out['text']}  (jump-forward tokens: {out['meta_info']['jump_forward_tokens']},"
          f" generated: {out['meta_info']['completion_tokens'] - out['meta_info']['jump_forward_tokens']})")


def main():
    import demo_programs

    print("=== 1. Runtime Engine on the default model (SmolLM2-135M-Instruct) ===")
    t = time.perf_counter()
    backend = sgl.Engine()
    info = backend.engine.get_server_info()  # quantization="auto" resolved: int4 on CPU here
    cpu = info["cpu_kernels"] or ""  # "native: avx2 (...); ..." or "torch reference: <why>"; None off CPU
    kernels = f"{cpu.split(':')[0] or 'Triton (GPU)'} kernels"
    if cpu.startswith("native:"):
        kernels += f", ISA level {cpu.split(':')[1].split('(')[0].split(';')[0].strip()}"
    print(f"(engine started in {time.perf_counter() - t:.1f}s, quantization {info['quantization']}, {kernels})\n")
    engine_batch(backend.engine)
    print("\n=== 2. SGLang-style programs on the in-process engine ===")
    demo_programs.main(backend)
    print("\n--- a tool call (sgl.gen(tools=...): the call is valid by construction) ---")
    import tool_loop

    tool_loop.program_loop(backend)
    backend.engine.shutdown()
    print("\n=== 3. The same kind of program over HTTP (sglpy serve + RuntimeEndpoint) ===")
    t = time.perf_counter()
    runtime = sgl.Runtime()
    try:
        print(f"(server up at {runtime.url} in {time.perf_counter() - t:.1f}s)")
        import quest_json_regex

        quest_json_regex.main(runtime.endpoint)
        print("\n--- tool calling on the OpenAI API: tools, tool_calls, a role=tool message ---")
        import tool_loop

        tool_loop.openai_loop(runtime.url)
    finally:
        runtime.shutdown()
    print("\ndemo finished")


if __name__ == "__main__":
    main()

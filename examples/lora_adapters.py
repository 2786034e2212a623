"""LoRA adapters per request: two adapters of the default model (random weights, written here in PEFT's format)
and the base model in one batch, a program run with an adapter, and an adapter loaded and unloaded at run time.

With trained adapters, pass their PEFT folders instead (`sglpy serve --lora-paths name=path ...` on a server)."""

import tempfile

import sglpy as sgl
from sglpy.runtime.engine import Engine
from sglpy.runtime.model.loader import resolve_model_path
from sglpy.runtime.testing.tiny_lora import module_shapes, write_random_adapter


@sgl.function
def greet(s, name):
    s += f"Write one friendly sentence to {name}:"
    s += sgl.gen("line", max_tokens=16)


def main():
    """Returns {adapter or None: generated text} for one prompt, and the program's line with an adapter."""
    layers, shapes = module_shapes(resolve_model_path(None))
    folder = tempfile.mkdtemp(prefix="sglpy-lora-")
    paths = {name: write_random_adapter(f"{folder}/{name}", layers, shapes, rank=8, seed=seed, scale=0.05)
             for seed, name in enumerate(("pirate", "poet", "late"))}
    engine = Engine(lora_paths=[f"pirate={paths['pirate']}", f"poet={paths['poet']}"], max_total_tokens=8192)
    try:
        prompt = "The weather today is"
        names = [None, "pirate", "poet"]
        outs = engine.generate([prompt] * 3, {"max_new_tokens": 12, "temperature": 0}, lora_path=names)
        texts = {}
        for name, out in zip(names, outs):  # one batch, three models
            texts[name] = out["text"]
            print(f"{name or 'base':>7}: {out['text']!r}")
        state = greet.run(name="Ada", temperature=0, lora_path="poet", backend=sgl.Engine(engine=engine))
        print("program with poet:", state["line"])
        engine.load_lora_adapter("late", paths["late"])  # while serving; requests may name it now
        print("late:", engine.generate(prompt, {"max_new_tokens": 8, "temperature": 0}, lora_path="late")["text"])
        engine.unload_lora_adapter("late")
        return texts, state["line"]
    finally:
        engine.shutdown()


if __name__ == "__main__":
    main()

"""Quick same-run A/B: one request alone (64 greedy tokens, ignore_eos) on the default model, quantization none vs
int8, interleaved so load drift hits both. python benchmarks/quant_ab.py"""
import time
from sglpy.runtime.engine import Engine
engs = {m: Engine(quantization=m, num_threads=2) for m in ("none", "int8")}
sp = {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True}
prompt = "Write a short story about a robot who learns to paint."
for e in engs.values():
    e.generate(prompt=prompt, sampling_params={"max_new_tokens": 4})
res = {m: [] for m in engs}
for rep in range(3):
    for m, e in engs.items():
        t, c = time.perf_counter(), time.process_time()
        e.generate(prompt=prompt, sampling_params=sp)
        res[m].append((64 / (time.perf_counter() - t), time.perf_counter() - t))
for m, r in res.items():
    print(m, "tok/s per rep:", [round(x[0], 1) for x in r], "best", round(max(x[0] for x in r), 1))
for e in engs.values():
    e.shutdown()

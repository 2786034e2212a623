"""What a speculative verify forward costs: k + 1 decode rows of one request against a one-row decode step.

python benchmarks/spec_verify_cost.py [quantization: auto|none|int8|int4] [reps] [max draft tokens, default 5]

The default model, one request with a 480-token prompt in the KV pool, 1 thread; the row counts alternate in
order and reverse per repetition (interleaved), each forward's KV rolled back after it. A verify of k draft tokens
pays when the expected accepted tokens + 1 exceed this ratio (NGRAM, STANDALONE: docs/speculative.md). Wall time
and the thread's CPU time are both reported: on a shared machine wall time also counts the moments another process
held the core.
"""
import statistics
import sys
import time

import torch

from sglpy.runtime.config import EngineConfig
from sglpy.runtime.core import BatchEntry, Req
from sglpy.runtime.memory.kv_manager import KVManager
from sglpy.runtime.memory.kv_pool import KVPool, ReqToTokenPool
from sglpy.runtime.memory.radix_cache import RadixCache
from sglpy.runtime.model.loader import resolve_model_path
from sglpy.runtime.model.runner import ModelRunner
from sglpy.runtime.sampling_params import SamplingParams

torch.set_num_threads(1)
quant = sys.argv[1] if len(sys.argv) > 1 else "auto"
cfg = EngineConfig(num_threads=1, quantization=quant, max_total_tokens=4096)
r = ModelRunner(cfg, resolve_model_path(None))
kv = KVManager(KVPool(r.num_layers, 4096, r.num_kv_heads, r.head_dim, torch.float32, r.device),
               ReqToTokenPool(8, r.max_context, r.device), RadixCache())
req = Req("x", list(range(1000, 1480)), SamplingParams(max_new_tokens=200))
req.output_ids = [5]
kv.assign_row(req)
kv.grow(req, 480)
r.forward([BatchEntry(req, 0, 480, sample=True)], 0, kv.buffers)
max_k = int(sys.argv[3]) if len(sys.argv) > 3 else 5
times = {k: [] for k in range(max_k + 1)}
cpu = {k: [] for k in range(max_k + 1)}
for rep in range(int(sys.argv[2]) if len(sys.argv) > 2 else 60):
    for k in (range(max_k + 1) if rep % 2 == 0 else reversed(range(max_k + 1))):
        kv.grow(req, 1 + k)
        e = BatchEntry(req, 480, 1 + k, sample=True, draft=tuple(range(7, 7 + k))) if k else \
            BatchEntry(req, 480, 1, sample=True)
        t, c = time.perf_counter(), time.thread_time()
        out = r.forward([e], 0 if k else 1, kv.buffers)
        out.logits[0, 0].item()
        times[k].append(time.perf_counter() - t)
        cpu[k].append(time.thread_time() - c)
        kv.rollback(req, 480)
base, cpu_base = statistics.median(times[0]), statistics.median(cpu[0])
print(f"quantization {r.quantization}, cpu kernels {(r.cpu_kernels or '')[:40]}")
for k, ts in times.items():
    m = statistics.median(ts)
    p90 = sorted(ts)[len(ts) * 9 // 10]
    print(f"  k={k} ({k + 1} rows): {m * 1e3:.2f} ms median [{min(ts) * 1e3:.2f} min, {p90 * 1e3:.2f} p90], "
          f"{m / base:.2f}x one row; CPU {statistics.median(cpu[k]) * 1e3:.2f} ms median, "
          f"{statistics.median(cpu[k]) / cpu_base:.2f}x one row")

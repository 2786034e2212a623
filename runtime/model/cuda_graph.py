"""CUDA-graph decode: batch-size buckets, static input buffers, padded replay (eager on CPU, captured on CUDA).

A decode-only forward of b requests runs as the smallest captured bucket B >= b: rows b..B-1 are padding
that read and write only the KV pool's padding slot through its padding row (seq_len 1, position 0), and
their logits are dropped. Inside the graph every shape is the bucket's: the decode attention is the Triton
split-K kernel, whose grid depends on (B, kv_heads, req_to_token width) and which reads each request's
length on the device. Sampling (penalties, the grammar bitmask, top-k/p) stays outside the graph: masks
change every step and come from the CPU, and one graph per bucket then serves every batch.

On CPU (or CUDA with capture off) the same padded path runs eagerly: a test compares it with the unpadded
forward, so the padding, bucketing and static-buffer logic is checked without a GPU.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import torch

from ..memory.kv_manager import KVBuffers
from .forward_batch import ForwardBatch

logger = logging.getLogger(__name__)

# fields of the packed metadata buffer: one host->device copy per step
_IDS, _POS, _LOC, _ROWS, _LENS = range(5)


def capture_buckets(max_running_requests: int, cuda_graph_max_bs: int) -> tuple[int, ...]:
    """Batch sizes to capture: 1, 2, 4, 8, then every 8 up to min(max_running_requests, cuda_graph_max_bs)."""
    cap = min(max_running_requests, cuda_graph_max_bs)
    if cap < 1:
        raise ValueError(f"capture cap must be >= 1, got {cap}")
    sizes = [b for b in (1, 2, 4, 8) if b <= cap] + list(range(16, cap + 1, 8))
    if sizes[-1] != cap:  # the largest batch the scheduler can form must fit a bucket
        sizes.append(cap)
    return tuple(sizes)


def bucket_for(batch: int, buckets: tuple[int, ...]) -> int | None:
    """Smallest bucket holding `batch` rows, or None when the batch is larger than every bucket."""
    for b in buckets:
        if b >= batch:
            return b
    return None


@dataclass(frozen=True)
class DecodeInputs:
    """One decode step's per-request inputs (host lists; ids may hold future placeholders, < 0)."""

    input_ids: list[int]
    positions: list[int]
    out_cache_loc: list[int]
    req_pool_indices: list[int]
    seq_lens: list[int]

    @property
    def batch(self) -> int:
        """Number of requests."""
        return len(self.input_ids)


# (static ForwardBatch of a bucket) -> logits [bucket, vocab]; the model's forward, closed over the KV buffers
ForwardFn = Callable[[ForwardBatch], torch.Tensor]


class DecodeGraphRunner:
    """Static buffers sized for the largest bucket; one graph (or, eagerly, one static output) per bucket."""

    def __init__(self, forward: ForwardFn, kv: KVBuffers, padding: tuple[int, int], buckets: tuple[int, ...],
                 device: torch.device, capture: bool):
        self.forward_fn, self.kv, self.buckets, self.device = forward, kv, buckets, device
        self.pad_slot, self.pad_row = padding
        self.capture = capture
        n = buckets[-1]
        # meta: [5, max_bs] int64 (ids, positions, out_cache_loc, req_pool_indices, seq_lens) on the device
        self.meta = torch.zeros(5, n, dtype=torch.int64, device=device)
        self.prefix_lens = torch.zeros(n, dtype=torch.int64, device=device)  # decode: seq_lens - 1
        self.extend_lens = torch.ones(n, dtype=torch.int64, device=device)
        self.logits_indices = torch.arange(n, dtype=torch.int64, device=device)
        self._pin = device.type == "cuda"
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> logits [bucket, vocab] (static)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0
        self._pad_meta(0, n)
        if capture:
            self._capture_all()

    def _pad_meta(self, start: int, end: int) -> None:
        m = self.meta
        m[_IDS, start:end] = 0
        m[_POS, start:end] = 0
        m[_LOC, start:end] = self.pad_slot
        m[_ROWS, start:end] = self.pad_row
        m[_LENS, start:end] = 1

    def _batch(self, bucket: int) -> ForwardBatch:
        """The bucket's ForwardBatch: views of the static buffers (the same storage every replay)."""
        m = self.meta
        self.prefix_lens[:bucket] = m[_LENS, :bucket] - 1
        return ForwardBatch(input_ids=m[_IDS, :bucket], positions=m[_POS, :bucket], out_cache_loc=m[_LOC, :bucket],
                            num_decode=bucket, req_pool_indices=m[_ROWS, :bucket],
                            prefix_lens=self.prefix_lens[:bucket], extend_lens=self.extend_lens[:bucket],
                            seq_lens=m[_LENS, :bucket], req_to_token=self.kv.req_to_token,
                            logits_indices=self.logits_indices[:bucket])

    def _capture_all(self) -> None:
        """Capture every bucket (all rows are padding meanwhile)."""
        capture_graphs(self.buckets, self._batch, self.forward_fn, self.device, self.outputs, self.graphs)
        logger.info("captured CUDA graphs for decode batch sizes %s", list(self.buckets))

    def can_run(self, batch: int) -> bool:
        """Whether a decode-only batch of this size has a bucket."""
        return 0 < batch <= self.buckets[-1]

    def run(self, inp: DecodeInputs, future_tokens: torch.Tensor | None) -> torch.Tensor:
        """Logits [b, vocab] of one decode step; a view of the bucket's static output (valid until the next run).

        future_tokens: [k] int64 on the device, the previous step's sampled ids; input id -1 - j means
        future_tokens[j] (overlap scheduling), resolved on the device without a host sync.
        """
        b = inp.batch
        bucket = bucket_for(b, self.buckets)
        if bucket is None:
            raise ValueError(f"decode batch {b} exceeds the largest CUDA-graph bucket {self.buckets[-1]}")
        pad = bucket - b
        host = torch.tensor([inp.input_ids + [0] * pad, inp.positions + [0] * pad,
                             inp.out_cache_loc + [self.pad_slot] * pad, inp.req_pool_indices + [self.pad_row] * pad,
                             inp.seq_lens + [1] * pad], dtype=torch.int64)  # [5, bucket]
        if self._pin:
            host = host.pin_memory()
        self.meta[:, :bucket].copy_(host, non_blocking=True)
        if min(inp.input_ids) < 0:
            ids = self.meta[_IDS, :bucket]
            if future_tokens is not None and future_tokens.shape[0] >= b and inp.input_ids == _STEADY[:b]:
                ids[:b].copy_(future_tokens[:b])  # the overlapped steady state: row i's token is future i (one copy)
            else:
                ids.copy_(resolve_future_ids(ids, future_tokens))
        self.replays += 1
        if bucket in self.graphs:
            self.prefix_lens[:bucket] = self.meta[_LENS, :bucket] - 1
            self.graphs[bucket].replay()
            return self.outputs[bucket][:b]
        out = self.forward_fn(self._batch(bucket))  # eager: CPU, or CUDA with capture off
        static = self.outputs.get(bucket)
        if static is None or static.shape != out.shape:
            static = self.outputs[bucket] = torch.empty_like(out)
        static.copy_(out)  # the same aliasing as a replay: callers must not keep it across steps
        return static[:b]


def capture_graphs(buckets: tuple[int, ...], batch: Callable[[int], ForwardBatch], forward: ForwardFn,
                   device: torch.device, outputs: dict, graphs: dict) -> None:
    """Capture forward(batch(bucket)) for every bucket, largest first, in one shared memory pool.

    Side effects: fills outputs (bucket -> static logits) and graphs (bucket -> CUDAGraph)."""
    pool = torch.cuda.graph_pool_handle()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for bucket in reversed(buckets):
            fb = batch(bucket)
            for _ in range(2):  # warm up: Triton compiles and autotunes outside the capture
                forward(fb)
            g = torch.cuda.CUDAGraph()
            # thread_local: another engine's loop thread in this process may use the device meanwhile
            with torch.cuda.graph(g, pool=pool, stream=stream, capture_error_mode="thread_local"):
                outputs[bucket] = forward(fb)
            graphs[bucket] = g
    torch.cuda.current_stream(device).wait_stream(stream)
    torch.cuda.synchronize(device)


_STEADY = [-1 - i for i in range(4096)]  # placeholder ids of an overlapped decode batch whose row i waits for future i


def resolve_future_ids(ids: torch.Tensor, future_tokens: torch.Tensor | None) -> torch.Tensor:
    """ids with each placeholder -1 - j replaced by future_tokens[j] (device-side; no host sync)."""
    if future_tokens is None:
        raise ValueError("input ids hold future placeholders but no previous-step tokens were given")
    idx = (-ids - 1).clamp_(min=0)
    return torch.where(ids < 0, future_tokens[idx.clamp_(max=max(future_tokens.shape[0] - 1, 0))], ids)

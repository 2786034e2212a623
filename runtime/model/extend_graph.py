"""CUDA-graph multi-token steps: every request of a batch extends by up to T tokens in one captured forward.

Jump-forward appends a few forced tokens to a request, and a speculative draft adds k guessed tokens; the next
step must then extend that request by several tokens while the others decode one. Run eagerly, such a step takes
the whole batch off the decode graph (on the H200, jump-forward made JSON decoding 0.63x for that reason). Here
each request gets a fixed slot of T packed tokens: its real tokens first, then padding. Inside the graph every
shape is the bucket's (bucket * T tokens, extend attention with max_extend_len T, logits for every slot); the
real lengths live only in the device buffers:

- a padding token of a real request sits after its real tokens, so causal attention keeps it out of every
  real row; it writes its K/V to the pool's padding slot, and its logits are never read;
- a padding request (rows b..bucket-1) reads and writes only the padding slot through the padding row.

The runner uses it when every entry extends by 1..T tokens (decode entries by 1), none wants prompt logprobs, and
the batch fits a bucket. On CPU (or CUDA with capture off) the same padded path runs eagerly, so tests compare it
with the unpadded forward without a GPU.
"""

from __future__ import annotations

import logging

import numpy as np
import torch

from ..memory.kv_manager import KVBuffers
from .cuda_graph import ForwardFn, bucket_for, capture_graphs, resolve_future_ids
from .forward_batch import ForwardBatch, HostBatch

logger = logging.getLogger(__name__)

_IDS, _POS, _LOC = range(3)  # rows of the per-token metadata buffer
_ROWS, _PREFIX, _SEQ = range(3)  # rows of the per-request metadata buffer
MAX_BS = 64  # largest multi-token batch captured (its logits take bucket * T * vocab floats)


class ExtendGraphRunner:
    """Static buffers for the largest bucket; one graph (or, eagerly, one static output) per batch-size bucket."""

    def __init__(self, forward: ForwardFn, kv: KVBuffers, padding: tuple[int, int], buckets: tuple[int, ...],
                 tokens_per_req: int, device: torch.device, capture: bool):
        if tokens_per_req < 2:
            raise ValueError(f"a multi-token step needs tokens_per_req >= 2, got {tokens_per_req}")
        self.forward_fn, self.kv, self.buckets, self.t, self.device = forward, kv, buckets, tokens_per_req, device
        self.pad_slot, self.pad_row = padding
        n, t = buckets[-1], tokens_per_req
        self.tok = torch.zeros(3, n * t, dtype=torch.int64, device=device)  # ids, positions, out_cache_loc
        self.req = torch.zeros(3, n, dtype=torch.int64, device=device)  # rows, prefix_lens, seq_lens
        self.extend_lens = torch.full((n,), t, dtype=torch.int64, device=device)
        self.logits_indices = torch.arange(n * t, dtype=torch.int64, device=device)
        self._pin = device.type == "cuda"
        self.outputs: dict[int, torch.Tensor] = {}  # bucket -> logits [bucket * T, vocab] (static)
        self.graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self.replays = 0
        tok, req = self._padding(n)
        self.tok.copy_(torch.from_numpy(tok))
        self.req.copy_(torch.from_numpy(req))
        if capture:
            self._capture_all()

    def _padding(self, bucket: int) -> tuple[np.ndarray, np.ndarray]:
        """Host metadata for `bucket` padding requests: [3, bucket * T] and [3, bucket] int64."""
        t = self.t
        tok = np.zeros((3, bucket * t), dtype=np.int64)
        tok[_POS] = np.tile(np.arange(t), bucket)  # a padding request's tokens at positions 0..T-1
        tok[_LOC] = self.pad_slot
        req = np.zeros((3, bucket), dtype=np.int64)
        req[_ROWS] = self.pad_row
        req[_SEQ] = t
        return tok, req

    def _batch(self, bucket: int) -> ForwardBatch:
        """The bucket's ForwardBatch: views of the static buffers (the same storage every replay)."""
        bt = bucket * self.t
        return ForwardBatch(input_ids=self.tok[_IDS, :bt], positions=self.tok[_POS, :bt],
                            out_cache_loc=self.tok[_LOC, :bt], num_decode=0, req_pool_indices=self.req[_ROWS, :bucket],
                            prefix_lens=self.req[_PREFIX, :bucket], extend_lens=self.extend_lens[:bucket],
                            seq_lens=self.req[_SEQ, :bucket], req_to_token=self.kv.req_to_token,
                            logits_indices=self.logits_indices[:bt], max_extend_len=self.t)

    def _capture_all(self) -> None:
        """Capture every bucket (all requests are padding meanwhile)."""
        capture_graphs(self.buckets, self._batch, self.forward_fn, self.device, self.outputs, self.graphs)
        logger.info("captured CUDA graphs for %d-token steps, batch sizes %s", self.t, list(self.buckets))

    def accepts(self, hb: HostBatch, num_decode: int) -> bool:
        """Whether this forward can run here: some entry extends by 2..T, none by more, no prompt logprobs."""
        b = len(hb.extend_lens)
        if num_decode == b or not 0 < b <= self.buckets[-1]:
            return False
        if max(hb.extend_lens) > self.t or min(hb.extend_lens) < 1 or any(len(r) for r in hb.input_rows):
            return False
        # a request's slot reads req_to_token[row, prefix .. prefix + T - 1]: it must lie inside the row
        return max(hb.prefix_lens) + self.t <= self.kv.req_to_token.shape[1]

    def run(self, hb: HostBatch, future_tokens: torch.Tensor | None) -> torch.Tensor:
        """Logits [len(hb.logits_rows), vocab] of the rows the eager forward would return, in its order.

        future_tokens: [k] int64 on the device; an input id -1 - j means future_tokens[j] (overlap scheduling).
        """
        b, t = len(hb.extend_lens), self.t
        bucket = bucket_for(b, self.buckets)
        ext = np.asarray(hb.extend_lens, dtype=np.int64)  # [b]
        prefix = np.asarray(hb.prefix_lens, dtype=np.int64)
        starts = np.cumsum(ext) - ext
        owner = np.repeat(np.arange(b), ext)  # [tokens] request of each packed token
        slot = owner * t + (np.arange(int(ext.sum())) - starts[owner])  # [tokens] its padded index
        tok, req = self._padding(bucket)
        real = np.arange(b * t)
        # a real request's padding tokens repeat its last position (any valid position would do: rows unread)
        tok[_POS, real] = np.repeat(prefix + ext - 1, t)
        tok[_IDS, slot] = hb.input_ids
        tok[_POS, slot] = hb.positions
        tok[_LOC, slot] = hb.out_cache_loc
        req[_ROWS, :b] = hb.req_rows
        req[_PREFIX, :b] = prefix
        req[_SEQ, :b] = prefix + t
        bt = bucket * t
        host = [torch.from_numpy(tok), torch.from_numpy(req), torch.from_numpy(slot[np.asarray(hb.logits_rows,
                                                                                               dtype=np.int64)])]
        if self._pin:  # pinned + non_blocking: no host wait for the device (overlap scheduling)
            host = [h.pin_memory() for h in host]
        self.tok[:, :bt].copy_(host[0], non_blocking=True)
        self.req[:, :bucket].copy_(host[1], non_blocking=True)
        rows = host[2].to(self.device, non_blocking=True)  # [m] padded index of each logits row
        if min(hb.input_ids) < 0:
            ids = self.tok[_IDS, :bt]
            ids.copy_(resolve_future_ids(ids, future_tokens))
        self.replays += 1
        if bucket in self.graphs:
            self.graphs[bucket].replay()
            return self.outputs[bucket][rows]  # a gather: a new tensor, safe across steps
        return self.forward_fn(self._batch(bucket))[rows]  # eager: CPU, or CUDA with capture off

"""Runs the model: loads it, and turns a scheduled batch into one forward over the KV buffers (read access only)."""

from __future__ import annotations

import logging

import torch

from ..config import EngineConfig
from ..core import BatchEntry, ForwardOutput
from ..device_io import to_device
from ..memory.kv_manager import KVBuffers
from .cuda_graph import DecodeGraphRunner, DecodeInputs, capture_buckets, resolve_future_ids
from .forward_batch import ForwardBatch
from .loader import load_model
from .quantization import quantize_model, resolve_quantization

logger = logging.getLogger(__name__)

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class ModelRunner:
    """Owns the model; reads and writes K/V only through the buffers and slot ids each forward is given."""

    def __init__(self, cfg: EngineConfig, model_path: str):
        if cfg.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.model = load_model(model_path, self.dtype, self.device)
        self.quantization = resolve_quantization(cfg.quantization, self.device)  # what runs: none, int8, int4
        quantize_model(self.model, self.quantization)
        hf = self.model.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        self.max_context = cfg.max_context_len or int(getattr(hf, "max_position_embeddings", 4096))
        self.model.init_rope(self.max_context, self.device, torch.float32)
        # what a KV pool for this model needs: per-layer K/V of [slots, kv_heads, head_dim]
        self.num_layers, self.num_kv_heads, self.head_dim = hf.num_hidden_layers, self.model.num_kv_heads, \
            self.model.head_dim
        self.graphs: DecodeGraphRunner | None = None

    def init_decode_graphs(self, cfg: EngineConfig, kv: KVBuffers, padding: tuple[int, int]) -> None:
        """Set up the padded-bucket decode path (runtime/model/cuda_graph.py) per cfg.disable_cuda_graph.

        None (auto): captured on CUDA, off on CPU. False: captured on CUDA, eager padded buckets on CPU (tests).
        Capture needs the Triton kernels (the torch references sync with the host): without them, graphs are off.
        """
        cuda = self.device.type == "cuda"
        if cfg.disable_cuda_graph or (cfg.disable_cuda_graph is None and not cuda):
            return
        capture = cuda
        if cuda:
            from sglpy.kernels._dispatch import triton_module

            if triton_module("decode_attention_triton", kv.req_to_token) is None:
                logger.warning("CUDA graphs off: the Triton kernels are disabled or unavailable")
                return
        buckets = capture_buckets(cfg.max_running_requests, cfg.cuda_graph_max_bs)
        self.graphs = DecodeGraphRunner(lambda fb: self.model(fb, kv), kv, padding, buckets, self.device, capture)

    def forward(self, entries: list[BatchEntry], num_decode: int, kv: KVBuffers,
                future_tokens: torch.Tensor | None = None) -> ForwardOutput:
        """Run one forward over entries (decode entries first); slots must already be allocated.

        future_tokens: [k] int64 on the device, the previous step's sampled ids (overlap scheduling); an input
        id -1 - j stands for future_tokens[j], resolved on the device.
        """
        if self.graphs is not None and num_decode == len(entries) and self.graphs.can_run(num_decode) \
                and not any(e.req.wants_input_logprobs() for e in entries):
            return self._decode_graph(entries, future_tokens)
        ids, pos, loc, rows = [], [], [], []
        input_rows, input_first, sample_row = [], [], []
        m = 0
        offset = 0
        for e in entries:
            r = e.req
            all_ids = r.all_ids
            end = e.prefix_len + e.extend_len
            ids.extend(all_ids[e.prefix_len:end])
            pos.extend(range(e.prefix_len, end))
            loc.extend(r.slots[e.prefix_len:end])
            # prompt logprobs: logits at positions start-1 .. P-2 score prompt tokens start .. P-1 (position 0 has
            # no logit before it: its entry is null)
            lo = hi = 0
            if r.wants_input_logprobs():
                lo = max(max(r.logprob_start_len, 1) - 1, e.prefix_len)
                hi = min(len(r.input_ids) - 1, end)
            n_in = max(hi - lo, 0)
            rows.extend(range(offset + lo - e.prefix_len, offset + lo - e.prefix_len + n_in))
            input_rows.append(range(m, m + n_in))
            input_first.append(lo + 1)
            m += n_in
            if e.sample:
                rows.append(offset + e.extend_len - 1)
                sample_row.append(m)
                m += 1
            else:
                sample_row.append(None)
            offset += e.extend_len
        dev = self.device
        as_long = lambda xs: to_device(xs, torch.int64, dev)  # noqa: E731 - no host wait on CUDA
        input_ids = as_long(ids)
        if ids and min(ids) < 0:
            input_ids = resolve_future_ids(input_ids, future_tokens)
        fb = ForwardBatch(
            input_ids=input_ids, positions=as_long(pos), out_cache_loc=as_long(loc), num_decode=num_decode,
            req_pool_indices=as_long([e.req.row for e in entries]),
            prefix_lens=as_long([e.prefix_len for e in entries]),
            extend_lens=as_long([e.extend_len for e in entries]),
            seq_lens=as_long([e.prefix_len + e.extend_len for e in entries]),
            req_to_token=kv.req_to_token, logits_indices=as_long(rows),
            max_extend_len=max((e.extend_len for e in entries[num_decode:]), default=1),
        )
        logits = self.model(fb, kv)
        return ForwardOutput(logits, input_rows, input_first, sample_row)

    def _decode_graph(self, entries: list[BatchEntry], future_tokens: torch.Tensor | None) -> ForwardOutput:
        """A decode-only step through the padded buckets (one new token per request, every row sampled)."""
        reqs = [e.req for e in entries]
        inp = DecodeInputs(input_ids=[_token_at(r, e.prefix_len) for r, e in zip(reqs, entries)],
                           positions=[e.prefix_len for e in entries],
                           out_cache_loc=[r.slots[e.prefix_len] for r, e in zip(reqs, entries)],
                           req_pool_indices=[r.row for r in reqs], seq_lens=[e.prefix_len + 1 for e in entries])
        logits = self.graphs.run(inp, future_tokens)  # [b, vocab]
        n = len(entries)
        return ForwardOutput(logits, [range(0)] * n, [1] * n, list(range(n)))


def _token_at(req, pos: int) -> int:
    """all_ids[pos] without building all_ids."""
    n = len(req.input_ids)
    return req.input_ids[pos] if pos < n else req.output_ids[pos - n]

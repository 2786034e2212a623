"""Runs the model: loads it, and turns a scheduled batch into one forward over the KV buffers (read access only)."""

from __future__ import annotations

import torch

from ..config import EngineConfig
from ..core import BatchEntry, ForwardOutput
from ..memory.kv_manager import KVBuffers
from .forward_batch import ForwardBatch
from .loader import load_model

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
        hf = self.model.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        self.max_context = cfg.max_context_len or int(getattr(hf, "max_position_embeddings", 4096))
        self.model.init_rope(self.max_context, self.device, torch.float32)
        # what a KV pool for this model needs: per-layer K/V of [slots, kv_heads, head_dim]
        self.num_layers, self.num_kv_heads, self.head_dim = hf.num_hidden_layers, self.model.num_kv_heads, \
            self.model.head_dim

    def forward(self, entries: list[BatchEntry], num_decode: int, kv: KVBuffers) -> ForwardOutput:
        """Run one forward over entries (decode entries first); slots must already be allocated."""
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
        as_long = lambda xs: torch.tensor(xs, dtype=torch.int64, device=dev)  # noqa: E731
        fb = ForwardBatch(
            input_ids=as_long(ids), positions=as_long(pos), out_cache_loc=as_long(loc), num_decode=num_decode,
            req_pool_indices=as_long([e.req.row for e in entries]),
            prefix_lens=as_long([e.prefix_len for e in entries]),
            extend_lens=as_long([e.extend_len for e in entries]),
            seq_lens=as_long([e.prefix_len + e.extend_len for e in entries]),
            req_to_token=kv.req_to_token, logits_indices=as_long(rows),
        )
        logits = self.model(fb, kv)
        return ForwardOutput(logits, input_rows, input_first, sample_row)

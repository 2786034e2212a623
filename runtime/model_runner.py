"""Loads weights into our model, owns the KV pool, and turns a scheduled batch into one forward."""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass

import torch

from .config import EngineConfig
from .forward_batch import ForwardBatch
from .kv_pool import KVPool, ReqToTokenPool
from .models.llama import LlamaForCausalLM
from .quantization import kv_cache_torch_dtype, quantize_model
from .request import Req

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def load_model(path: str, dtype: torch.dtype, device: torch.device) -> LlamaForCausalLM:
    """Build our model for the HF folder at `path` and load its safetensors weights."""
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    state: dict[str, torch.Tensor] = {}
    files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
    if not files:
        raise ValueError(f"no *.safetensors in {path}")
    for f in files:
        state.update(load_file(f))
    state = {k: v for k, v in state.items() if "rotary_emb" not in k}
    if model.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    state = {k: v.to(device=device, dtype=dtype) for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    if missing or unexpected:
        raise ValueError(f"weights of {path} do not fit the model: missing {missing[:5]}, unexpected {unexpected[:5]}")
    model.fuse_projections()
    return model.eval()


@dataclass(frozen=True)
class BatchEntry:
    """One request's part of a forward: extend KV from prefix_len by extend_len tokens."""

    req: Req
    prefix_len: int
    extend_len: int
    sample: bool  # this forward reaches the sequence end: sample the next token


@dataclass(frozen=True)
class ForwardOutput:
    """Logits rows and, per entry, which rows belong to it (input-logprob rows, then the sample row)."""

    logits: torch.Tensor  # [m, vocab] float32
    input_rows: list[range]  # rows scoring prompt positions (empty range when not requested)
    input_first_pos: list[int]  # absolute prompt position scored by the first input row
    sample_row: list[int | None]  # row to sample from, or None


class ModelRunner:
    """Owns the model, the KV pool and the request-to-slot table."""

    def __init__(self, cfg: EngineConfig, model_path: str):
        if cfg.device == "auto":
            self.device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        else:
            self.device = torch.device(cfg.device)
        self.dtype = _DTYPES[cfg.dtype]
        self.model = load_model(model_path, self.dtype, self.device)
        if cfg.quantization != "none":
            if self.device.type != "cpu":
                raise ValueError(f"quantization={cfg.quantization!r} runs on CPU only (device is {self.device})")
            quantize_model(self.model, cfg.quantization)
        hf = self.model.config
        self.hf_config = hf
        self.vocab_size = hf.vocab_size
        self.max_context = cfg.max_context_len or int(getattr(hf, "max_position_embeddings", 4096))
        self.model.init_rope(self.max_context, self.device, torch.float32)
        self.kv = KVPool(hf.num_hidden_layers, cfg.max_total_tokens, self.model.num_kv_heads,
                         self.model.head_dim, kv_cache_torch_dtype(cfg.kv_cache_dtype, self.dtype), self.device)
        self.req_pool = ReqToTokenPool(cfg.max_running_requests, self.max_context, self.device)

    def forward(self, entries: list[BatchEntry], num_decode: int) -> ForwardOutput:
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
            # prompt logprobs: logits at positions start-1 .. P-2 score prompt tokens start .. P-1
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
            req_to_token=self.req_pool.req_to_token, logits_indices=as_long(rows),
        )
        logits = self.model(fb, self.kv)
        return ForwardOutput(logits, input_rows, input_first, sample_row)

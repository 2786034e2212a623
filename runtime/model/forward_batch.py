"""Tensors derived from a list of Reqs for one forward: decode requests first, then extend requests."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class ForwardBatch:
    """Everything the model needs for one forward; built by the model runner, read-only after."""

    input_ids: torch.Tensor  # [tokens] int64, packed request by request
    positions: torch.Tensor  # [tokens] int64
    out_cache_loc: torch.Tensor  # [tokens] int64: KV slot where each token's K/V is written
    num_decode: int  # the first num_decode requests contribute exactly one token each
    req_pool_indices: torch.Tensor  # [b] int64
    prefix_lens: torch.Tensor  # [b] int64: tokens already in the KV pool before this forward
    extend_lens: torch.Tensor  # [b] int64: tokens added by this forward
    seq_lens: torch.Tensor  # [b] int64 = prefix_lens + extend_lens
    req_to_token: torch.Tensor  # [max_reqs, max_context] int32
    logits_indices: torch.Tensor  # [m] int64: packed token positions whose logits are computed
    max_extend_len: int = 1  # longest extend among the extend requests (host-side: no sync in attention)

    @property
    def num_tokens(self) -> int:
        """Packed token count."""
        return int(self.input_ids.shape[0])

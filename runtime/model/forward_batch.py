"""One forward's inputs: the host lists built from its BatchEntry's in one pass, and the tensors the model reads."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

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
    lora: Any = None  # kernels/lora.LoraSegments: the rows that use LoRA adapters, grouped by adapter; None = none
    mm: Any = None  # model/mm_batch.MultimodalBatch: image embeddings and M-RoPE positions (vision models)

    @property
    def num_tokens(self) -> int:
        """Packed token count."""
        return int(self.input_ids.shape[0])


_NO_ROWS = range(0)


@dataclass
class HostBatch:
    """A forward's inputs as host lists, built in one pass over the entries (the runner turns them into tensors)."""

    input_ids: list[int]  # [tokens] packed request by request
    positions: list[int]  # [tokens]
    out_cache_loc: list[int]  # [tokens] KV slot of each token
    logits_rows: list[int]  # [m] packed token positions whose logits are computed
    req_rows: list[int]  # [s] request rows in req_to_token, per attention sequence (a drafted entry has k + 1)
    prefix_lens: list[int]  # [s]
    extend_lens: list[int]  # [s]
    input_rows: list[range]  # [b] logits rows scoring prompt positions (empty range when not requested)
    input_first_pos: list[int]  # [b] absolute prompt position scored by the first input row
    sample_row: list[int | None]  # [b] logits row to sample from, or None (drafted: k + 1 rows from it)
    num_decode: int  # the first num_decode sequences are one token each (decode rows)


def _ids(req, a: int, b: int) -> list[int]:
    """all_ids[a:b] without building all_ids (prompt + outputs)."""
    n = len(req.input_ids)
    if b <= n:
        return req.input_ids[a:b]
    if a >= n:
        return req.output_ids[a - n:b - n]
    return req.input_ids[a:] + req.output_ids[:b - n]


def build_host_batch(entries, num_decode_entries: int | None = None) -> HostBatch:
    """The host lists of one forward over BatchEntry's (decode entries first, then drafted ones, then extends).

    A one-token entry without prompt logprobs (every decode entry) costs a few appends; only prefill chunks and
    prompt-logprob entries take the general path. The first num_decode_entries entries are decode entries (the
    scheduler's count; None: the one-token entries up to the first longer one). A drafted entry (speculative
    decoding) becomes k + 1 decode rows of its request: row j holds token p + j and attends to positions 0 .. p + j, whose K/V this forward
    writes before any attention reads it, so the rows are exactly the causal extend of [last token + draft], run
    by the decode kernels (one row computes what a plain decode step of that sequence would)."""
    ids, pos, loc, rows = [], [], [], []
    input_rows, input_first, sample_row = [], [], []
    seq_rows, seq_prefix, seq_ext = [], [], []
    m = offset = 0
    nd = len(entries) if num_decode_entries is None else num_decode_entries  # one-token entries at the front
    num_decode, lead = 0, True
    for i, e in enumerate(entries):
        r = e.req
        p = e.prefix_len
        if e.draft:
            if not lead:
                raise ValueError("a drafted entry must come before every multi-token extend entry")
            n = 1 + len(e.draft)
            ids.append(r.input_ids[p] if p < len(r.input_ids) else r.output_ids[p - len(r.input_ids)])
            ids.extend(e.draft)
            pos.extend(range(p, p + n))
            loc.extend(r.slots[p:p + n])
            seq_rows.extend([r.row] * n)
            seq_prefix.extend(range(p, p + n))
            seq_ext.extend([1] * n)
            input_rows.append(_NO_ROWS)
            input_first.append(1)
            rows.extend(range(offset, offset + n))
            sample_row.append(m)
            m += n
            offset += n
            num_decode += n
            continue
        if e.extend_len == 1 and not (r.logprob.return_logprob and r.wants_input_logprobs()):
            n = len(r.input_ids)
            ids.append(r.input_ids[p] if p < n else r.output_ids[p - n])
            pos.append(p)
            loc.append(r.slots[p])
            input_rows.append(_NO_ROWS)
            input_first.append(1)
            if e.sample:
                rows.append(offset)
                sample_row.append(m)
                m += 1
            else:
                sample_row.append(None)
            offset += 1
            seq_rows.append(r.row)
            seq_prefix.append(p)
            seq_ext.append(1)
            if i < nd and lead:
                num_decode += 1
            else:
                lead = False
            continue
        lead = False
        seq_rows.append(r.row)
        seq_prefix.append(p)
        seq_ext.append(e.extend_len)
        end = p + e.extend_len
        ids.extend(_ids(r, p, end))
        pos.extend(range(p, end))
        loc.extend(r.slots[p:end])
        # prompt logprobs: logits at positions start-1 .. P-2 score prompt tokens start .. P-1 (position 0 has
        # no logit before it: its entry is null)
        lo = hi = 0
        if r.wants_input_logprobs():
            lo = max(max(r.logprob.logprob_start_len, 1) - 1, p)
            hi = min(len(r.input_ids) - 1, end)
        n_in = max(hi - lo, 0)
        rows.extend(range(offset + lo - p, offset + lo - p + n_in))
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
    return HostBatch(ids, pos, loc, rows, seq_rows, seq_prefix, seq_ext, input_rows, input_first, sample_row,
                     num_decode)

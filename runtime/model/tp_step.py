"""The per-step message rank 0 broadcasts to the other tensor-parallel ranks, and the KV row mirror it carries.

A step is two int64 broadcasts over the gloo control group: a fixed header, then one payload holding the
forward's token ids, positions, KV slots, per-request lengths, the logit rows, and the request-to-token row
updates. The other ranks keep a mirror of rank 0's `req_to_token` table; rank 0 remembers what each row
already holds there (`RowMirror`) and sends only the new tail (decode: one slot per request), or the whole
row when it changed underneath (a row handed to a new request, a prefix re-pointed at the cache's slots).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .forward_batch import ForwardBatch

FORWARD, STOP = 0, 1
HEADER_LEN = 8  # kind, tokens, requests, num_decode, logit rows, row updates, update slots, (spare)


@dataclass(frozen=True)
class StepMessage:
    """One broadcast step: FORWARD with its inputs, or STOP (the ranks leave the group)."""

    kind: int
    header: torch.Tensor  # [HEADER_LEN] int64
    payload: torch.Tensor  # [n] int64 (empty for STOP)

    @classmethod
    def forward(cls, ids: list[int], pos: list[int], loc: list[int], rows: list[int], prefix: list[int],
                extend: list[int], num_decode: int, logits: list[int],
                updates: list[tuple[int, int, list[int]]]) -> "StepMessage":
        """Pack one forward (lists from the model runner; updates: (row, start, slots))."""
        flat = [s for _, _, slots in updates for s in slots]
        header = torch.tensor([FORWARD, len(ids), len(rows), num_decode, len(logits), len(updates), len(flat), 0],
                              dtype=torch.int64)
        payload = torch.tensor(ids + pos + loc + rows + prefix + extend + logits + [u[0] for u in updates]
                               + [u[1] for u in updates] + [len(u[2]) for u in updates] + flat, dtype=torch.int64)
        return cls(FORWARD, header, payload)

    @classmethod
    def stop(cls) -> "StepMessage":
        """The message that ends the workers' loop."""
        header = torch.zeros(HEADER_LEN, dtype=torch.int64)
        header[0] = STOP
        return cls(STOP, header, torch.zeros(0, dtype=torch.int64))

    def send(self, group) -> None:
        """Broadcast from rank 0."""
        group.broadcast(self.header)
        if self.payload.numel():
            group.broadcast(self.payload)

    @classmethod
    def receive(cls, group) -> "StepMessage":
        """Wait for rank 0's next message (ranks 1..N-1)."""
        header = torch.empty(HEADER_LEN, dtype=torch.int64)
        group.broadcast(header)
        kind = int(header[0])
        if kind == STOP:
            return cls(STOP, header, torch.zeros(0, dtype=torch.int64))
        t, b, _, m, u, n, _ = header[1:].tolist()
        payload = torch.empty(3 * t + 3 * b + m + 3 * u + n, dtype=torch.int64)
        group.broadcast(payload)
        return cls(kind, header, payload)

    def apply_row_updates(self, req_to_token: torch.Tensor) -> None:
        """Write the carried row updates into a mirror table ([max_reqs, max_context] int32)."""
        t, b, _, m, u, _, _ = self.header[1:].tolist()
        base = 3 * t + 3 * b + m
        meta = self.payload[base:base + 3 * u].view(3, u).tolist() if u else [[], [], []]
        off = base + 3 * u
        for row, start, n in zip(*meta):
            req_to_token[row, start:start + n] = self.payload[off:off + n].to(torch.int32)
            off += n

    def batch(self, req_to_token: torch.Tensor, device: torch.device) -> ForwardBatch:
        """The ForwardBatch this message describes, over this rank's own request-to-token table."""
        t, b, nd, m, _, _, _ = self.header[1:].tolist()
        p = self.payload.to(device)
        cut = [t, t, t, b, b, b, m]
        ids, pos, loc, rows, prefix, extend, logits = torch.split(p[:sum(cut)], cut)
        return ForwardBatch(input_ids=ids, positions=pos, out_cache_loc=loc, num_decode=nd,
                            req_pool_indices=rows, prefix_lens=prefix, extend_lens=extend,
                            seq_lens=prefix + extend, req_to_token=req_to_token, logits_indices=logits)


class RowMirror:
    """Rank 0's record of what each request-to-token row holds on the other ranks."""

    def __init__(self):
        self._sent: dict[int, list[int]] = {}  # row -> slots of positions 0..len-1 as the mirror has them

    def updates(self, row: int, slots: list[int], n: int) -> tuple[int, int, list[int]] | None:
        """The update that makes the mirror's row hold slots[:n] (None when it already does)."""
        sent = self._sent.get(row)
        k = len(sent) if sent is not None else -1
        if 0 <= k <= n and slots[:k] == sent:
            if k == n:
                return None
            sent.extend(slots[k:n])
            return row, k, slots[k:n]
        if k > n and sent[:n] == slots[:n]:
            del sent[n:]  # positions past n are stale there (a rollback); they are never read before rewritten
            return None
        self._sent[row] = slots[:n]
        return row, 0, slots[:n]

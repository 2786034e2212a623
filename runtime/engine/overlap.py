"""Overlap scheduling's pieces: placeholder output ids, sampled ids read back without waiting, pinned buffers.

The overlapped order itself is the engine's one step function (engine/step.py): while the device runs step n,
the CPU resolves step n-1. A request whose step n-1 token is not read back yet carries a placeholder id
-1 - j in output_ids (the j-th id of step n-1's sampling), so the scheduler sees it one token longer, as it will
be; forward n resolves placeholder input ids on the device from step n-1's token tensor.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from ..core import Req

if TYPE_CHECKING:
    from ..memory.kv_manager import KVManager


def drop_placeholder(req: Req, kv: KVManager) -> None:
    """Remove a trailing unresolved id (the request ends before it is read back) and any KV slot taken for it."""
    if req.output_ids and req.output_ids[-1] < 0:
        if req.kv_len >= req.seq_len:
            kv.rollback(req, req.seq_len - 1)
        req.output_ids.pop()


class HostTokens:
    """Sampled ids on their way to the host: a pinned buffer, a non-blocking copy and an event (CUDA)."""

    def __init__(self, tokens: torch.Tensor, pinned: torch.Tensor | None):
        self.n = int(tokens.shape[0])
        self.event = None
        if tokens.is_cuda:
            self.buf = pinned[: self.n]  # pinned: a true async copy, the loop does not wait here
            self.buf.copy_(tokens, non_blocking=True)
            self.event = torch.cuda.Event()
            self.event.record()
        else:
            self.buf = tokens

    def wait(self) -> list[int]:
        """The ids on the host (waits for the copy, not for later work on the stream)."""
        if self.event is not None:
            self.event.synchronize()
        return self.buf.tolist()


class PinnedIds:
    """Two pinned host buffers for sampled ids, alternating: step n's copy must not overwrite step n-1's before it
    is read. None of them off CUDA (the ids are already on the host)."""

    def __init__(self, device: torch.device, n: int):
        self._bufs = ([torch.empty(n, dtype=torch.int64, pin_memory=True) for _ in range(2)]
                      if device.type == "cuda" else None)
        self._flip = 0

    def next(self) -> torch.Tensor | None:
        """The buffer for the next step's copy (None off CUDA)."""
        if self._bufs is None:
            return None
        buf, self._flip = self._bufs[self._flip], 1 - self._flip
        return buf

"""Attention with a sliding window and/or logit soft-capping (Gemma 2/3, Phi-3), in torch over the KV pool.

The attention kernels (native CPU, Triton, their torch references) take neither a window nor a soft-cap, so the
layers that need one run here: every request's keys are gathered from the pool, scores are capped as
tanh(s / cap) * cap, and a key j is visible to a query at position i when j <= i and i - j < window.
Layers without either keep the kernels (runtime/model/decoder.py picks per layer and per forward).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .forward_batch import ForwardBatch


@dataclass(frozen=True)
class WindowPlan:
    """One forward's per-request key slots and positions, shared by every windowed layer."""

    rows: list[tuple[int, int, torch.Tensor, torch.Tensor]]  # (first q row, n queries, key slots [S], q pos [n])
    max_seq_len: int


def plan_window_attention(fb: ForwardBatch) -> WindowPlan:
    """Gather each request's slot list once per forward (one host read of the lengths)."""
    prefix, ext = fb.prefix_lens.tolist(), fb.extend_lens.tolist()
    rows_idx = fb.req_pool_indices.tolist()
    rows, first = [], 0
    for r, p, e in zip(rows_idx, prefix, ext):
        slots = fb.req_to_token[r, : p + e].long()
        qpos = torch.arange(p, p + e, device=slots.device)
        rows.append((first, e, slots, qpos))
        first += e
    return WindowPlan(rows, max((p + e for p, e in zip(prefix, ext)), default=0))


def window_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: WindowPlan, scale: float,
                     window: int | None, softcap: float | None) -> torch.Tensor:
    """q: [tokens, heads, d]; k_cache, v_cache: [slots, kv_heads, d] -> [tokens, heads, d] (float32 softmax)."""
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.empty_like(q)
    for first, n, slots, qpos in plan.rows:
        if n == 0:
            continue
        k = k_cache[slots].to(q.dtype).transpose(0, 1)  # [kv_heads, S, d]
        v = v_cache[slots].to(q.dtype).transpose(0, 1)
        if heads != kv_heads:
            k = k.repeat_interleave(heads // kv_heads, dim=0)
            v = v.repeat_interleave(heads // kv_heads, dim=0)
        qq = q[first:first + n].transpose(0, 1)  # [heads, n, d]
        s = torch.matmul(qq, k.transpose(1, 2)) * scale  # [heads, n, S]
        if softcap:
            s = torch.tanh(s / softcap) * softcap
        kpos = torch.arange(slots.shape[0], device=q.device)
        visible = kpos[None, :] <= qpos[:, None]
        if window is not None:
            visible &= kpos[None, :] > qpos[:, None] - window
        s = s.masked_fill(~visible, float("-inf"))
        p = torch.softmax(s, dim=-1, dtype=torch.float32).to(q.dtype)
        out[first:first + n] = torch.matmul(p, v).transpose(0, 1)
    return out

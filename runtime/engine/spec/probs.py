"""STANDALONE speculative sampling's distributions: the processed next-token distribution of a logits row (what the
sampler draws from), and the rejection step that turns a draft token drawn from q into a token distributed as p.

The standard scheme (Leviathan et al., Chen et al.): the draft token d ~ q is accepted with probability
min(1, p(d) / q(d)); on rejection the token is drawn from the residual max(0, p - q), renormalised. The token
emitted is then distributed exactly as p, whatever q is, as long as d was really drawn from q: so the draft may
process its logits differently (no penalties, the end tokens masked) provided q is the distribution it drew from.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ...core import Req
from ..truncation import inverse_cdf


def processed_probs(logits: torch.Tensor, reqs: list[Req]) -> torch.Tensor:
    """The distribution the sampler draws from for each row of logits [n, vocab] (penalties and grammar masks
    already applied; -inf = forbidden): temperature, then top_k, top_p and min_p over a descending sort (the
    semantics of engine/truncation.py). Returns [n, vocab] float32 probabilities summing to 1 per row."""
    n, vocab = logits.shape
    s = [r.sampling for r in reqs]
    dev = logits.device
    temp = torch.tensor([x.temperature for x in s], dtype=torch.float32, device=dev)
    top_k = torch.tensor([x.top_k if 0 < x.top_k < vocab else vocab for x in s], dtype=torch.int64, device=dev)
    top_p = torch.tensor([x.top_p for x in s], dtype=torch.float32, device=dev)
    min_p = torch.tensor([x.min_p for x in s], dtype=torch.float32, device=dev)
    sorted_l, idx = (logits.float() / temp[:, None]).sort(dim=-1, descending=True)  # [n, vocab]
    rank = torch.arange(vocab, device=dev)[None, :]
    sorted_l = sorted_l.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_l, dim=-1)
    probs = probs.masked_fill((probs.cumsum(-1) - probs) > top_p[:, None], 0.0)
    probs = probs.masked_fill(probs < (min_p[:, None] * probs[:, :1]), 0.0)
    probs = probs / probs.sum(dim=-1, keepdim=True)
    return torch.zeros_like(probs).scatter_(1, idx, probs)


@dataclass(frozen=True)
class Judged:
    """One draft token judged against the target: the token to append and whether it is the draft's."""

    token: int
    accepted: bool


def judge(p: torch.Tensor, q: torch.Tensor, draft: int, u: float, u_residual) -> Judged:
    """Accept draft (drawn from q [vocab]) with probability min(1, p(d)/q(d)) given uniform u; else draw from the
    residual max(0, p - q) with the uniform u_residual() returns (drawn only on rejection)."""
    pd, qd = float(p[draft]), float(q[draft])
    if qd > 0 and u * qd < pd:
        return Judged(draft, True)
    residual = (p - q).clamp_(min=0.0)
    if float(residual.sum()) <= 0.0:  # p <= q everywhere means p == q: only reachable through rounding
        residual = p.clone()
    return Judged(int(inverse_cdf(residual[None, :], torch.tensor([u_residual()], device=p.device))[0]), False)

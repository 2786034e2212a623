"""Turns a batch of logits into next tokens: penalties, masks, greedy / temperature / top-k / top-p / min-p."""

from __future__ import annotations

import torch

from sglpy.kernels import apply_token_bitmask
from ..core import Req, TokenLogprob
from ..device_io import rows as take_rows
from ..device_io import to_device


def token_logprobs(logprobs: torch.Tensor, chosen: list[int], top_k: list[int]) -> list[TokenLogprob]:
    """Chosen-token logprob and top-k alternatives per row of a [rows, vocab] logprob tensor."""
    # logprobs: [rows, vocab]
    chosen_lp = logprobs.gather(1, to_device(chosen, torch.int64, logprobs.device)[:, None])[:, 0].tolist()
    tops: list[tuple] = [()] * len(chosen)
    # one topk per distinct k: a request asking for many alternatives does not make its neighbours pay for them
    for k in sorted({k for k in top_k if k > 0}):
        rows = [i for i, ki in enumerate(top_k) if ki == k]
        src = logprobs if len(rows) == len(top_k) else logprobs[rows]
        vals, idx = src.topk(k, dim=-1)
        for i, v, t in zip(rows, vals.tolist(), idx.tolist()):
            tops[i] = tuple(zip(v, t))
    return [TokenLogprob(chosen_lp[i], chosen[i], tops[i]) for i in range(len(chosen))]


class Sampler:
    """Stateless apart from the fallback generator used by unseeded requests."""

    def __init__(self, seed: int, device: torch.device):
        self.device = device
        self.generator = torch.Generator(device="cpu").manual_seed(seed)

    def _uniform(self, req: Req) -> float:
        s = req.sampling
        if s.seed is not None:
            if req.generator is None:
                req.generator = torch.Generator(device="cpu").manual_seed(s.seed)
            return float(torch.rand(1, generator=req.generator))
        return float(torch.rand(1, generator=self.generator))

    def draw_uniforms(self, reqs: list[Req]) -> list[float | None]:
        """One uniform per sampled (non-greedy) request, None for greedy ones.

        Drawn before sampling, so a batch retried row by row (a neighbour failed) samples the same tokens.
        """
        return [None if r.sampling.greedy else self._uniform(r) for r in reqs]

    def sample(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int], uniforms: list[float | None],
               bitmask: torch.Tensor | None = None, masked_rows: torch.Tensor | None = None) -> list[int]:
        """Next token per row of logits [b, vocab] (modified in place) for reqs, with uniforms from draw_uniforms."""
        return self.sample_tensor(logits, reqs, eos_ids, uniforms, bitmask, masked_rows).tolist()

    def sample_tensor(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int], uniforms: list[float | None],
                      bitmask: torch.Tensor | None = None, masked_rows: torch.Tensor | None = None) -> torch.Tensor:
        """sample() without reading the result back: [b] int64 on the logits' device (overlap scheduling)."""
        b, vocab = logits.shape
        self._apply_penalties(logits, reqs, eos_ids)
        if bitmask is not None:
            if bitmask.device != logits.device:  # masks are built on the host (grammar/ is numpy)
                bitmask, masked_rows = _to_device(bitmask, logits.device), _to_device(masked_rows, logits.device)
            apply_token_bitmask(logits, bitmask, masked_rows)  # grammar: disallowed -> -inf
        greedy = [i for i, r in enumerate(reqs) if r.sampling.greedy]
        if len(greedy) == b:
            return logits.argmax(dim=-1)
        sampled = [i for i, r in enumerate(reqs) if not r.sampling.greedy]
        rows = self._sample_rows(take_rows(logits, sampled), [reqs[i] for i in sampled], [uniforms[i] for i in sampled])
        if not greedy:
            return rows
        out = torch.empty(b, dtype=torch.int64, device=logits.device)
        out[to_device(greedy, torch.int64, logits.device)] = take_rows(logits, greedy).argmax(dim=-1)
        out[to_device(sampled, torch.int64, logits.device)] = rows
        return out

    def _apply_penalties(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int]) -> None:
        vocab = logits.shape[1]
        for i, r in enumerate(reqs):
            s = r.sampling
            if s.repetition_penalty != 1.0 or s.frequency_penalty or s.presence_penalty:
                if s.repetition_penalty != 1.0:
                    seen = to_device(sorted(set(r.all_ids)), torch.int64, logits.device)
                    v = logits[i, seen]
                    logits[i, seen] = torch.where(v > 0, v / s.repetition_penalty, v * s.repetition_penalty)
                if r.output_ids and (s.frequency_penalty or s.presence_penalty):
                    counts = torch.bincount(to_device(r.output_ids, torch.int64, logits.device), minlength=vocab)
                    counts = counts[:vocab].to(logits.dtype)
                    logits[i] -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0).to(logits.dtype)
            if s.logit_bias:
                if r.logit_bias_rows is None:  # once per request: a vocabulary-sized bias must not cost every step
                    items = [(t, b) for t, b in s.logit_bias.items() if 0 <= t < vocab]
                    r.logit_bias_rows = (to_device([t for t, _ in items], torch.int64, logits.device),
                                         to_device([b for _, b in items], logits.dtype, logits.device))
                ids, values = r.logit_bias_rows
                logits[i, ids] += values  # ids are distinct (dict keys)
            if len(r.output_ids) < s.min_new_tokens and r.grammar is None:  # the constraint wins
                # below min_new_tokens nothing may end the request
                stop_ids = [t for t in (eos_ids | set(s.stop_token_ids)) if 0 <= t < vocab]
                if stop_ids and not s.ignore_eos:
                    logits[i].index_fill_(0, to_device(stop_ids, torch.int64, logits.device), float("-inf"))
                elif s.stop_token_ids:
                    logits[i].index_fill_(0, to_device(list(s.stop_token_ids), torch.int64, logits.device),
                                          float("-inf"))

    def _sample_rows(self, logits: torch.Tensor, reqs: list[Req], uniforms: list[float]) -> torch.Tensor:
        # logits: [n, vocab] -> [n] int64 token ids
        temps = to_device([r.sampling.temperature for r in reqs], torch.float32, logits.device)
        logits = logits / temps[:, None]
        u = to_device(uniforms, torch.float32, logits.device)
        needs_sort = [i for i, r in enumerate(reqs)
                      if r.sampling.top_k != -1 or r.sampling.top_p < 1.0 or r.sampling.min_p > 0.0]
        plain = [i for i in range(len(reqs)) if i not in set(needs_sort)]
        if not needs_sort:
            return _inverse_cdf(torch.softmax(logits, dim=-1), u)
        out = torch.empty(len(reqs), dtype=torch.int64, device=logits.device)
        if plain:
            probs = torch.softmax(take_rows(logits, plain), dim=-1)
            out[to_device(plain, torch.int64, logits.device)] = _inverse_cdf(probs, take_rows(u, plain))
        sub = [reqs[i] for i in needs_sort]
        sorted_l, idx = take_rows(logits, needs_sort).sort(dim=-1, descending=True)
        rank = torch.arange(sorted_l.shape[1], device=logits.device)[None, :]
        k = to_device([r.sampling.top_k if r.sampling.top_k > 0 else sorted_l.shape[1] for r in sub], torch.int64,
                      logits.device)
        sorted_l = sorted_l.masked_fill(rank >= k[:, None], float("-inf"))
        probs = torch.softmax(sorted_l, dim=-1)
        top_p = to_device([r.sampling.top_p for r in sub], torch.float32, logits.device)
        # keep the smallest prefix whose mass reaches top_p (the first token is always kept)
        probs = probs.masked_fill((probs.cumsum(-1) - probs) > top_p[:, None], 0.0)
        min_p = to_device([r.sampling.min_p for r in sub], torch.float32, logits.device)
        probs = probs.masked_fill(probs < (min_p[:, None] * probs[:, :1]), 0.0)
        choice = _inverse_cdf(probs, take_rows(u, needs_sort))
        out[to_device(needs_sort, torch.int64, logits.device)] = idx.gather(1, choice[:, None])[:, 0]
        return out


def _to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor on `device`: staged through pinned memory so the copy does not wait for the device."""
    if t is None or t.device == device:
        return t
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)


def _inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Index sampled from (unnormalised) probs rows using uniforms u."""
    cdf = probs.cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True)[:, 0]
    return idx.clamp_(max=probs.shape[1] - 1)

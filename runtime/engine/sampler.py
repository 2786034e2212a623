"""Turns a batch of logits into next tokens: penalties, masks, greedy / temperature / top-k / top-p / min-p.

Penalties run on the whole batch (engine/penalties.py); truncated sampling runs on top-k candidates and
sorts the vocabulary only for rows whose candidates cannot hold the cut (engine/truncation.py).
"""

from __future__ import annotations

import operator
from dataclasses import dataclass

import torch

from sglpy.kernels import apply_token_bitmask
from ..core import Req, TokenLogprob
from ..device_io import rows as take_rows
from ..device_io import host_tensor, to_device
from .host_memory import keep_freed_blocks
from .penalties import Penalties
from .truncation import CANDIDATES, candidate_sample, greedy, inverse_cdf, sorted_sample


_sampling = operator.attrgetter("sampling")
_greedy = operator.attrgetter("greedy")
_seed = operator.attrgetter("seed")


def token_logprobs(logprobs: torch.Tensor, chosen: list[int], top_k: list[int]) -> list[TokenLogprob]:
    """Chosen-token logprob and top-k alternatives per row of a [rows, vocab] logprob tensor."""
    # logprobs: [rows, vocab]; one gather and one topk (the largest k asked) for all rows
    chosen_lp = logprobs.gather(1, to_device(chosen, torch.int64, logprobs.device)[:, None])[:, 0].tolist()
    k = max(top_k, default=0)  # more than the vocabulary raises: that request alone fails (processor retries)
    tops: list[tuple] = [()] * len(chosen)
    if k > 0:
        want = [i for i, ki in enumerate(top_k) if ki > 0]
        src = logprobs if len(want) == len(top_k) else take_rows(logprobs, want)
        vals, idx = src.topk(k, dim=-1)
        for i, v, t in zip(want, vals.tolist(), idx.tolist()):
            tops[i] = tuple(zip(v[:top_k[i]], t[:top_k[i]]))
    return [TokenLogprob(chosen_lp[i], chosen[i], tops[i]) for i in range(len(chosen))]


@dataclass(frozen=True)
class _Rows:
    """The sampled rows' parameters as tensors (one host-to-device copy per step)."""

    temp: torch.Tensor  # [n] float32
    top_k: torch.Tensor  # [n] int64, vocab for -1
    top_p: torch.Tensor  # [n] float32
    min_p: torch.Tensor  # [n] float32
    u: torch.Tensor  # [n] float32 uniforms


class Sampler:
    """Next tokens from a batch of logits. State: the fallback generator of unseeded requests, the penalty scratch."""

    def __init__(self, seed: int, device: torch.device, batch_invariant: bool = False,
                 penalties: Penalties | None = None):
        self.device = device
        self.batch_invariant = batch_invariant  # deterministic inference: sampled rows on CUDA take invariant_sample
        self.generator = torch.Generator(device="cpu").manual_seed(seed)
        self.penalties = penalties if penalties is not None else Penalties()
        if device.type == "cpu":  # the logits sampled here are freed every step: malloc keeps their blocks for reuse
            keep_freed_blocks()

    def draw_uniforms(self, reqs: list[Req]) -> list[float | None]:
        """One uniform per sampled (non-greedy) request, None for greedy ones.

        Drawn before sampling, so a batch retried row by row (a neighbour failed) samples the same tokens. A
        seeded request draws from its own generator (its n-th sampled token always uses its n-th draw); the
        others share the engine's, in one draw for the batch.
        """
        samplings = list(map(_sampling, reqs))
        greedy_rows = list(map(_greedy, samplings)).count(True)
        if greedy_rows == len(reqs):
            return [None] * len(reqs)
        if not greedy_rows and list(map(_seed, samplings)).count(None) == len(reqs):
            return torch.rand(len(reqs), generator=self.generator).tolist()  # one shared draw
        out: list[float | None] = [None] * len(reqs)
        shared = []
        for i, r in enumerate(reqs):
            s = r.sampling
            if s.greedy:
                continue
            if s.seed is None:
                shared.append(i)
                continue
            if r.generator is None:
                r.generator = torch.Generator(device="cpu").manual_seed(s.seed)
            out[i] = float(torch.rand(1, generator=r.generator))
        if shared:
            for i, v in zip(shared, torch.rand(len(shared), generator=self.generator).tolist()):
                out[i] = v
        return out

    def sample(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int], uniforms: list[float | None],
               bitmask: torch.Tensor | None = None, masked_rows: torch.Tensor | None = None) -> list[int]:
        """Next token per row of logits [b, vocab] (modified in place) for reqs, with uniforms from draw_uniforms."""
        return self.sample_tensor(logits, reqs, eos_ids, uniforms, bitmask, masked_rows).tolist()

    @torch.inference_mode()  # the forward's logits are inference tensors, changed in place here
    def sample_tensor(self, logits: torch.Tensor, reqs: list[Req], eos_ids: set[int], uniforms: list[float | None],
                      bitmask: torch.Tensor | None = None, masked_rows: torch.Tensor | None = None,
                      undo: list | None = None) -> torch.Tensor:
        """sample() without reading the result back: [b] int64 on the logits' device (overlap scheduling).

        undo, when given, records every in-place change to logits (penalties.restore puts them back)."""
        b, vocab = logits.shape
        self.penalties.apply(logits, reqs, eos_ids, undo)
        if bitmask is not None:
            if bitmask.device != logits.device:  # masks are built on the host (grammar/ is numpy)
                bitmask, masked_rows = _to_device(bitmask, logits.device), _to_device(masked_rows, logits.device)
            if undo is not None:
                undo.append((masked_rows, None, logits[masked_rows]))
            apply_token_bitmask(logits, bitmask, masked_rows)  # grammar: disallowed -> -inf
        sampled = [i for i, u in enumerate(uniforms) if u is not None]
        if not sampled:
            return greedy(logits)
        if len(sampled) == b:
            return self._sample_rows(logits, reqs, uniforms)
        out = torch.empty(b, dtype=torch.int64, device=logits.device)
        argmax_rows = [i for i, u in enumerate(uniforms) if u is None]
        out[to_device(argmax_rows, torch.int64, logits.device)] = greedy(take_rows(logits, argmax_rows))
        picked = self._sample_rows(take_rows(logits, sampled), [reqs[i] for i in sampled],
                                   [uniforms[i] for i in sampled])
        out[to_device(sampled, torch.int64, logits.device)] = picked
        return out

    def _sample_rows(self, logits: torch.Tensor, reqs: list[Req], uniforms: list[float]) -> torch.Tensor:
        """logits [n, vocab] of sampled (non-greedy) requests -> [n] int64 token ids."""
        n, vocab = logits.shape
        params = [(s.temperature, s.top_k if 0 < s.top_k < vocab else vocab, s.top_p, s.min_p)
                  for s in (r.sampling for r in reqs)]
        temps, ks, top_ps, min_ps = map(list, zip(*params))
        host = host_tensor(temps + top_ps + min_ps + uniforms, torch.float32)
        dev = _to_device(host, logits.device).view(4, n)
        p = _Rows(temp=dev[0], top_p=dev[1], min_p=dev[2], u=dev[3], top_k=to_device(ks, torch.int64, logits.device))
        if self.batch_invariant and logits.is_cuda:
            return invariant_sample(logits, p)
        # group rows by their candidate count: a row's result never depends on its neighbours' parameters
        groups: dict[tuple[int, bool], list[int]] = {}
        plain = []
        if ks.count(ks[0]) == n and ks[0] < vocab:  # one top_k for every row (C-level passes)
            groups[(ks[0], False)] = list(range(n))
        else:
            for i, (_, k, top_p, min_p) in enumerate(params):
                if k < vocab:
                    groups.setdefault((k, False), []).append(i)
                elif top_p < 1.0 or min_p > 0.0:
                    groups.setdefault((min(CANDIDATES, vocab), True), []).append(i)
                else:
                    plain.append(i)
        if len(plain) == n:
            return inverse_cdf(torch.softmax(logits / p.temp[:, None], dim=-1), p.u)
        out = torch.empty(n, dtype=torch.int64, device=logits.device)
        if plain:
            idx = to_device(plain, torch.int64, logits.device)
            probs = torch.softmax(logits.index_select(0, idx) / p.temp[idx, None], dim=-1)
            out[idx] = inverse_cdf(probs, p.u[idx])
        for (k, whole_row), members in groups.items():
            idx = to_device(members, torch.int64, logits.device) if len(members) < n else None
            pick = (lambda t: t) if idx is None else (lambda t: t.index_select(0, idx))
            sub = pick(logits)
            rules = (min([ks[i] for i in members]) < k, min([top_ps[i] for i in members]) < 1.0,
                     max([min_ps[i] for i in members]) > 0.0)
            tokens, exact = candidate_sample(sub, pick(p.temp), pick(p.top_k), pick(p.top_p), pick(p.min_p),
                                             pick(p.u), k, whole_row, rules)
            if whole_row and logits.is_cuda:  # no host sync: sort every row, keep the sort where needed
                full = sorted_sample(sub / pick(p.temp)[:, None], pick(p.top_k), pick(p.top_p), pick(p.min_p),
                                     pick(p.u))
                tokens = torch.where(exact, tokens, full)
            elif whole_row and not bool(exact.all()):  # the candidates hold too little mass: sort those rows
                miss = (~exact).nonzero()[:, 0]
                tokens[miss] = sorted_sample(sub[miss] / pick(p.temp)[miss, None], pick(p.top_k)[miss],
                                             pick(p.top_p)[miss], pick(p.min_p)[miss], pick(p.u)[miss])
            if idx is None:
                return tokens
            out[idx] = tokens
        return out


def invariant_sample(logits: torch.Tensor, p: _Rows) -> torch.Tensor:
    """Sampled rows [n, vocab] -> [n] ids, each row's result independent of n (deterministic inference on CUDA).

    Every row takes the full stable sort (no top-k candidates: which of tied logits a top-k keeps, and in what
    order, depends on the number of rows), and one row is padded to two: torch runs a one-row cumsum on CUDA
    through a different scan algorithm than a many-row one, so the same row's cumulative sums would differ."""
    n = logits.shape[0]
    if n == 1:
        two = lambda t: t.expand(2, *t.shape[1:])  # noqa: E731 - the row twice, read-only
        return invariant_sample(two(logits), _Rows(two(p.temp), two(p.top_k), two(p.top_p), two(p.min_p),
                                                   two(p.u)))[:1]
    return sorted_sample(logits / p.temp[:, None], p.top_k, p.top_p, p.min_p, p.u, stable=True)


def _to_device(t: torch.Tensor | None, device: torch.device) -> torch.Tensor | None:
    """A host tensor on `device`: staged through pinned memory so the copy does not wait for the device."""
    if t is None or t.device == device:
        return t
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t.to(device)

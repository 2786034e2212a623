"""Deterministic inference's sampler on CUDA (invariant_sample), checked on CPU: a row's token does not depend on
its neighbours or on the number of rows, ties go to the lower token id, and it samples what sorted_sample does."""

import torch

from sglpy.runtime.engine.sampler import _Rows, invariant_sample
from sglpy.runtime.engine.truncation import sorted_sample


def _rows(n, temp=0.9, top_k=-1, top_p=0.95, min_p=0.0, vocab=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    u = torch.rand(n, generator=g)
    k = vocab if top_k < 0 else top_k
    return _Rows(torch.full((n,), temp), torch.full((n,), k, dtype=torch.int64), torch.full((n,), top_p),
                 torch.full((n,), min_p), u)


def _pick(p: _Rows, idx):
    return _Rows(p.temp[idx], p.top_k[idx], p.top_p[idx], p.min_p[idx], p.u[idx])


def test_rows_do_not_depend_on_the_batch():
    g = torch.Generator().manual_seed(1)
    # bf16-rounded logits: many exact ties, as a bf16 model's are
    logits = (torch.randn(6, 512, generator=g) * 3).to(torch.bfloat16).float()
    p = _rows(6)
    together = invariant_sample(logits, p)
    for i in range(6):
        assert invariant_sample(logits[i:i + 1], _pick(p, [i])).item() == together[i].item()
    sub = [4, 1, 3]
    assert invariant_sample(logits[sub], _pick(p, sub)).tolist() == together[sub].tolist()
    ref = sorted_sample(logits / p.temp[:, None], p.top_k, p.top_p, p.min_p, p.u, stable=True)
    assert together.tolist() == ref.tolist()


def test_ties_go_to_the_lower_token_id():
    logits = torch.full((1, 64), -5.0)
    logits[0, 40] = logits[0, 7] = 3.0  # two best tokens, tied
    for u in (0.0, 0.2, 0.49):  # draws in the first half of the tied pair's mass
        p = _Rows(torch.ones(1), torch.tensor([64]), torch.ones(1), torch.zeros(1), torch.tensor([u]))
        assert invariant_sample(logits, p).item() == 7
    p = _Rows(torch.ones(1), torch.tensor([64]), torch.ones(1), torch.zeros(1), torch.tensor([0.6]))
    assert invariant_sample(logits, p).item() == 40

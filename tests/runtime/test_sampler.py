"""The batched sampler against a reference of its semantics: penalties bit for bit, truncated sampling in
distribution (and token for token for the same uniform, but for rounding at a boundary), seeded reproducibility."""

import numpy as np
import pytest
import torch

from sglpy.runtime.core import Req
from sglpy.runtime.engine.penalties import Penalties
from sglpy.runtime.engine.sampler import Sampler, token_logprobs
from sglpy.runtime.engine.truncation import candidate_sample, greedy, inverse_cdf, sorted_sample, top_candidates
from sglpy.runtime.sampling_params import SamplingParams

EOS = {2}


def reference_penalties(logits, reqs, eos_ids):
    """The one-request-at-a-time rules (the sampler's semantics, as first written)."""
    vocab = logits.shape[1]
    for i, r in enumerate(reqs):
        s = r.sampling
        if s.repetition_penalty != 1.0:
            seen = torch.tensor(sorted(set(r.input_ids + r.output_ids)), dtype=torch.int64)
            v = logits[i, seen]
            logits[i, seen] = torch.where(v > 0, v / s.repetition_penalty, v * s.repetition_penalty)
        if r.output_ids and (s.frequency_penalty or s.presence_penalty):
            counts = torch.bincount(torch.tensor(r.output_ids), minlength=vocab)[:vocab].to(logits.dtype)
            logits[i] -= s.frequency_penalty * counts + s.presence_penalty * (counts > 0).to(logits.dtype)
        if s.logit_bias:
            items = [(t, b) for t, b in s.logit_bias.items() if 0 <= t < vocab]
            ids = torch.tensor([t for t, _ in items], dtype=torch.int64)
            logits[i, ids] += torch.tensor([b for _, b in items], dtype=logits.dtype)
        if len(r.output_ids) < s.min_new_tokens and r.grammar is None:
            stop_ids = [t for t in (eos_ids | set(s.stop_token_ids)) if 0 <= t < vocab]
            if stop_ids and not s.ignore_eos:
                logits[i].index_fill_(0, torch.tensor(stop_ids), float("-inf"))
            elif s.stop_token_ids:
                logits[i].index_fill_(0, torch.tensor(list(s.stop_token_ids)), float("-inf"))


def _req(i, vocab, rng, **sp):
    r = Req(f"r{i}", rng.integers(0, vocab, size=int(rng.integers(1, 40))).tolist(), SamplingParams(**sp))
    return r


PENALTY_PARAMS = [
    dict(repetition_penalty=1.3),
    dict(frequency_penalty=0.3, presence_penalty=0.7),
    dict(frequency_penalty=-0.45),
    dict(presence_penalty=1.1, repetition_penalty=0.7, logit_bias={5: 3.5, 17: -100.0, 10**6: 1.0}),
    dict(logit_bias={0: 0.1, 3: -0.25}),
    dict(min_new_tokens=5, stop_token_ids=[7, 9]),
    dict(min_new_tokens=5, ignore_eos=True, stop_token_ids=[11]),
    dict(min_new_tokens=3),
    dict(),
]


def test_batched_penalties_equal_the_per_request_rules_bit_for_bit_over_steps():
    vocab, rng = 512, np.random.default_rng(0)
    reqs = [_req(i, vocab, rng, **PENALTY_PARAMS[i % len(PENALTY_PARAMS)]) for i in range(27)]
    pen = Penalties()
    for step in range(8):
        logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(step)) * 4
        logits[0, :3] = torch.tensor([0.0, -0.0, float("-inf")])
        want, got = logits.clone(), logits.clone()
        reference_penalties(want, reqs, EOS)
        pen.apply(got, reqs, EOS)
        assert torch.equal(want, got), step
        for r in reqs:  # outputs grow by one token (a repeat now and then), or are rewritten (a jump-forward)
            r.output_ids.append(int(rng.integers(0, 8)) if step % 2 else int(rng.integers(0, vocab)))
        reqs[1].output_ids[:] = reqs[1].output_ids[:-2] + [4, 4, 4]
        reqs[1].num_jumped_tokens += 3
        del reqs[2].output_ids[-2:]
        reqs = reqs[::-1]  # the batch order changes from step to step


def test_top_candidates_and_greedy_are_exact_with_ties():
    g = torch.Generator().manual_seed(1)
    x = torch.randint(-20, 20, (64, 4096), generator=g).float()  # many ties
    x[3] = float("-inf")
    x[4, 100] = float("nan")
    for k in (1, 5, 50, 256):
        vals, cols = top_candidates(x[:3], k)
        assert torch.equal(vals, x[:3].topk(k, dim=-1).values)
        assert torch.equal(x[:3].gather(1, cols), vals)
        assert all(len(set(c.tolist())) == k for c in cols)
    assert torch.equal(greedy(x), x.argmax(dim=-1))
    assert torch.equal(greedy(x[:1]), x[:1].argmax(dim=-1))
    y = torch.randn(300, 49152, generator=g)
    assert torch.equal(greedy(y), y.argmax(dim=-1))
    # a vocabulary no group size divides (columns past the last full group) and a NaN among them
    z = torch.randint(-30, 30, (8, 50257), generator=g).float()
    z[5, 50250] = float("nan")
    z[6, -3:] = 100.0
    z[2, -1] = 1000.0  # the largest value of its row in the last column, outside every full group
    assert torch.equal(greedy(z), z.argmax(dim=-1))
    for k in (1, 50, 256):
        vals, cols = top_candidates(z[:5], k)
        assert torch.equal(vals, z[:5].topk(k, dim=-1).values)
        assert torch.equal(z[:5].gather(1, cols), vals)
        assert all(len(set(c.tolist())) == k for c in cols)


CASES = [
    dict(top_k=20),
    dict(top_k=50, top_p=0.8),
    dict(top_p=0.9),  # exact on the candidates (a peaked row)
    dict(top_p=0.95, flat=True),  # the candidates hold too little mass: the full sort
    dict(min_p=0.05),
    dict(top_k=40, min_p=0.2, top_p=0.7),
    dict(min_p=0.001, flat=True),
    dict(),  # temperature only
]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_sampling_matches_the_full_sort_in_distribution(case):
    case = dict(case)
    flat = case.pop("flat", False)
    vocab, n = 4096, 3000
    g = torch.Generator().manual_seed(7)
    row = torch.randn(vocab, generator=g) * (0.3 if flat else 3.0)
    logits = row.expand(n, vocab).contiguous()
    sp = SamplingParams(temperature=0.7, **case)
    reqs = [Req(f"r{i}", [1], sp) for i in range(n)]
    u = torch.rand(n, generator=g)
    got = Sampler(0, torch.device("cpu")).sample_tensor(logits.clone(), reqs, set(), u.tolist())
    k = torch.full((n,), sp.top_k if sp.top_k > 0 else vocab)
    top_p, min_p = torch.full((n,), sp.top_p), torch.full((n,), sp.min_p)
    if case:
        want = sorted_sample(logits / 0.7, k, top_p, min_p, u)
    else:  # temperature alone draws in vocabulary order (no sort at all)
        want = inverse_cdf(torch.softmax(logits / 0.7, dim=-1), u)
    assert (got == want).float().mean() > 0.998  # the same uniform picks the same token
    # the kept set and its probabilities, from the reference's own arithmetic
    s, idx = (row / 0.7).sort(descending=True)
    probs = torch.softmax(s.masked_fill(torch.arange(vocab) >= k[0], float("-inf")), dim=-1)
    probs = probs.masked_fill((probs.cumsum(-1) - probs) > sp.top_p, 0.0)
    probs = probs.masked_fill(probs < sp.min_p * probs[0], 0.0)
    probs = probs / probs.sum()  # by rank
    rank = torch.empty(vocab, dtype=torch.int64).index_put_((idx,), torch.arange(vocab))[got]
    assert bool((probs[rank] > 0).all())  # only kept tokens are drawn
    # total variation over rank bins (ranks 0-15 one by one, then doubling ranges) of 3000 draws
    edges = list(range(17)) + [2 ** e for e in range(5, 14)]
    bins = torch.bucketize(torch.arange(vocab), torch.tensor(edges[1:]), right=True)
    want_p = torch.zeros(len(edges)).index_add_(0, bins, probs)
    got_p = torch.bincount(bins[rank], minlength=len(edges)).float() / n
    assert 0.5 * (got_p - want_p).abs().sum() < 0.05


def test_candidates_report_rows_they_cannot_hold():
    vocab = 8192
    g = torch.Generator().manual_seed(3)
    logits = torch.cat([torch.randn(1, vocab, generator=g) * 4, torch.randn(1, vocab, generator=g) * 0.1])
    ones = torch.ones(2)
    _, exact = candidate_sample(logits, ones, torch.full((2,), vocab), torch.full((2,), 0.9), torch.zeros(2),
                                torch.full((2,), 0.5), 256, whole_row=True)
    assert exact.tolist() == [True, False]


def test_seeded_rows_do_not_depend_on_their_neighbours():
    vocab = 4096
    g = torch.Generator().manual_seed(5)
    logits = torch.randn(6, vocab, generator=g) * 3
    params = [dict(top_k=30), dict(top_p=0.9), dict(min_p=0.1), dict(), dict(top_k=5, top_p=0.5),
              dict(temperature=0)]
    reqs = [Req(f"r{i}", [1], SamplingParams(seed=100 + i, **{"temperature": 0.9, **p})) for i, p in enumerate(params)]
    batched = Sampler(0, torch.device("cpu")).sample(logits.clone(), reqs, set(),
                                                      Sampler(0, torch.device("cpu")).draw_uniforms(reqs))
    for r in reqs:
        r.generator = None
    alone = []
    for i, r in enumerate(reqs):
        s = Sampler(i, torch.device("cpu"))
        alone.append(s.sample(logits[i:i + 1].clone(), [r], set(), s.draw_uniforms([r]))[0])
    assert batched == alone


def test_token_logprobs_one_topk_for_mixed_k():
    g = torch.Generator().manual_seed(2)
    lp = torch.log_softmax(torch.randn(4, 300, generator=g), dim=-1)
    recs = token_logprobs(lp, [1, 2, 3, 4], [0, 3, 1, 5])
    for i, (rec, k) in enumerate(zip(recs, [0, 3, 1, 5])):
        assert rec.logprob == lp[i, i + 1].item() and rec.token_id == i + 1
        vals, idx = lp[i].topk(k) if k else (torch.empty(0), torch.empty(0, dtype=torch.int64))
        assert rec.top == tuple(zip(vals.tolist(), idx.tolist()))


def test_undo_restores_the_logits_changed_in_place():
    from sglpy.runtime.engine.penalties import restore

    vocab, rng = 512, np.random.default_rng(4)
    reqs = [_req(i, vocab, rng, **PENALTY_PARAMS[i % len(PENALTY_PARAMS)]) for i in range(18)]
    for r in reqs:
        r.output_ids = rng.integers(0, 6, size=5).tolist()
    logits = torch.randn(len(reqs), vocab, generator=torch.Generator().manual_seed(9))
    before, undo = logits.clone(), []
    bitmask = torch.zeros(2, (vocab + 31) // 32, dtype=torch.int32)
    bitmask[:, 0] = 0b1011
    Sampler(0, torch.device("cpu")).sample_tensor(logits, reqs, EOS, [None] * len(reqs), bitmask,
                                                  torch.tensor([3, 8]), undo)
    assert not torch.equal(logits, before)
    restore(logits, undo)
    assert torch.equal(logits, before)

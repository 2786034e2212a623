"""Per-forward plans (decode attention read pattern, rotary cos/sin) give the same results as the plain kernels."""

from __future__ import annotations

import pytest
import torch

from sglpy.runtime.testing.kernel_cases import make_paged_batch
from sglpy.kernels import apply_rotary, build_rope_cache, decode_attention_reference
from sglpy.kernels.decode_plan import VIEW_ANY_LEN_BATCH, VIEW_MIN_LEN, decode_attention_planned, plan_decode_attention
from sglpy.kernels.cpu_native import DISABLE_ENV
from sglpy.kernels.rotary import apply_rotary_planned, plan_rotary


@pytest.fixture(autouse=True)
def torch_path(monkeypatch):
    """These tests check the torch path's plan (views, gathers): the one that runs without the native kernels."""
    monkeypatch.setenv(DISABLE_ENV, "1")


def _contiguous_batch(lens, kv_heads, d, dtype, gap=3):
    """Each request's slots one contiguous run (as a lone request's prompt + decode slots are)."""
    total = sum(lens) + gap * (len(lens) + 1)
    k_cache, v_cache = torch.randn(total, kv_heads, d).to(dtype), torch.randn(total, kv_heads, d).to(dtype)
    req_to_token = torch.zeros(len(lens) + 2, max(lens) + 5, dtype=torch.int32)
    rows = torch.randperm(len(lens) + 2)[: len(lens)]
    start = gap
    for row, n in zip(rows.tolist(), lens):
        req_to_token[row, :n] = torch.arange(start, start + n, dtype=torch.int32)
        start += n + gap
    return k_cache, v_cache, req_to_token, rows


@pytest.mark.parametrize("lens", [[1], [37], [5, 40, 1], [9] * VIEW_ANY_LEN_BATCH, [VIEW_MIN_LEN + 3] * 12])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16])
def test_contiguous_requests_read_views(lens, kv_dtype):
    torch.manual_seed(len(lens))
    k_cache, v_cache, r2t, rows = _contiguous_batch(lens, 3, 16, kv_dtype)
    sl = torch.tensor(lens)
    plan = plan_decode_attention(r2t, rows, sl)
    assert not plan.groups and [(i, n) for i, _, n in plan.views] == list(enumerate(lens))
    q = torch.randn(len(lens), 9, 16)
    got = decode_attention_planned(q, k_cache, v_cache, plan, 0.25)
    want = decode_attention_reference(q, k_cache.float(), v_cache.float(), r2t, rows, sl, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("lens", [[33, 1, 17], [20] * 6, [400] + [3] * 7, [9] * (VIEW_ANY_LEN_BATCH + 1)])
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.float16])
def test_scattered_or_large_batches_gather(lens, kv_dtype):
    pb = make_paged_batch(lens, 2, 16, kv_dtype, seed=len(lens))
    if len(lens) == VIEW_ANY_LEN_BATCH + 1:  # contiguous, but too many short requests for per-request views
        k_cache, v_cache, r2t, rows = _contiguous_batch(lens, 2, 16, kv_dtype)
    else:
        k_cache, v_cache, r2t, rows = pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices
    sl = torch.tensor(lens)
    plan = plan_decode_attention(r2t, rows, sl)
    assert [i for i, _, _ in plan.views] == ([1] if lens == [33, 1, 17] else [])  # length 1 is a trivial run
    if len(set(lens)) == 1:
        assert len(plan.groups) == 1 and plan.groups[0].mask is None  # equal lengths: no mask at all
    if lens[0] == 400:
        assert len(plan.groups) > 1  # one long request among short ones: length groups
    q = torch.randn(len(lens), 4, 16)
    got = decode_attention_planned(q, k_cache, v_cache, plan, 0.3)
    want = decode_attention_reference(q, k_cache.float(), v_cache.float(), r2t, rows, sl, 0.3)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_mixed_batch_views_some_requests_and_gathers_the_rest():
    torch.manual_seed(3)
    lens = [200, 150, 7, 300, 12, 140, 5, 9, 130, 160]  # > VIEW_ANY_LEN_BATCH requests
    k_cache, v_cache, r2t, rows = _contiguous_batch(lens, 3, 16, torch.float32)
    scattered = [2, 3, 7]  # these requests' slots get shuffled among themselves
    pool = torch.cat([r2t[rows[i], :lens[i]] for i in scattered])
    pool = pool[torch.randperm(len(pool))]
    start = 0
    for i in scattered:
        r2t[rows[i], :lens[i]] = pool[start:start + lens[i]]
        start += lens[i]
    sl = torch.tensor(lens)
    plan = plan_decode_attention(r2t, rows, sl)
    viewed = sorted(i for i, _, _ in plan.views)
    assert viewed == [i for i, n in enumerate(lens) if n >= VIEW_MIN_LEN and i not in scattered]
    gathered = sorted(int(j) for g in plan.groups for j in g.index)
    assert gathered == sorted(set(range(len(lens))) - set(viewed))
    q = torch.randn(len(lens), 9, 16)
    got = decode_attention_planned(q, k_cache, v_cache, plan, 0.25)
    want = decode_attention_reference(q, k_cache, v_cache, r2t, rows, sl, 0.25)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_plan_rejects_bad_metadata_once():
    r2t = torch.zeros(3, 6, dtype=torch.int32)
    with pytest.raises(ValueError, match="seq_lens must be >= 1"):
        plan_decode_attention(r2t, torch.tensor([0, 1]), torch.tensor([0, 2]))
    with pytest.raises(ValueError, match=r"<= req_to_token.shape\[1\]"):
        plan_decode_attention(r2t, torch.tensor([0]), torch.tensor([7]))
    with pytest.raises(ValueError, match="seq_lens length"):
        plan_decode_attention(r2t, torch.tensor([0, 1]), torch.tensor([2]))
    plan = plan_decode_attention(r2t, torch.tensor([0]), torch.tensor([2]))
    with pytest.raises(ValueError, match="q dim 0"):
        decode_attention_planned(torch.randn(2, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8), plan, 0.5)
    with pytest.raises(ValueError, match="do not fit"):
        decode_attention_planned(torch.randn(1, 3, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8), plan, 0.5)
    empty = plan_decode_attention(r2t, torch.tensor([], dtype=torch.int64), torch.tensor([], dtype=torch.int64))
    assert decode_attention_planned(torch.randn(0, 4, 8), torch.randn(10, 2, 8), torch.randn(10, 2, 8),
                                    empty, 0.5).shape == (0, 4, 8)


@pytest.mark.parametrize("fused", [True, False])
def test_rotary_plan_equals_apply_rotary(fused):
    n, heads, kv_heads, d = 5, 4, 2, 16
    cache = build_rope_cache(d, 64, 10000.0)
    pos = torch.tensor([0, 3, 63, 7, 7])
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d)
    if fused:  # q and k adjacent views of one qkv row: rotated as one tensor
        q = qkv[:, : heads * d].view(n, heads, d)
        k = qkv[:, heads * d: (heads + kv_heads) * d].view(n, kv_heads, d)
    else:
        q, k = torch.randn(n, heads, d), torch.randn(n, kv_heads, d)
    q_ref, k_ref = q.clone(), k.clone()
    v_before = qkv[:, (heads + kv_heads) * d:].clone()
    apply_rotary(q_ref, k_ref, pos, cache)
    apply_rotary_planned(q, k, plan_rotary(pos, cache))
    assert torch.equal(q, q_ref) and torch.equal(k, k_ref)
    assert torch.equal(qkv[:, (heads + kv_heads) * d:], v_before)
    with pytest.raises(ValueError, match="positions must lie in"):
        plan_rotary(torch.tensor([64]), cache)

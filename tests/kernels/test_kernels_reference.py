"""The torch references (the CPU hot path) against float64 loop oracles and HF Llama modules."""

from __future__ import annotations

import math

import pytest
import torch

from sglpy.runtime.testing.kernel_cases import make_paged_batch, naive_attention
from sglpy.kernels import (
    apply_rotary,
    apply_token_bitmask,
    build_rope_cache,
    decode_attention,
    extend_attention,
    rmsnorm,
    store_kv,
)

TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 3e-3}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2), (9, 3), (4, 1)])
def test_decode_attention_matches_loop_oracle(dtype, heads, kv_heads):
    kv_lens = [1, 5, 17, 3]
    pb = make_paged_batch(kv_lens, kv_heads, 16, dtype, seed=heads * 10 + kv_heads)
    q = torch.randn(len(kv_lens), heads, 16).to(dtype)
    scale = 1 / math.sqrt(16)
    seq_lens = torch.tensor(kv_lens, dtype=torch.int64)
    o = decode_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, seq_lens, scale)
    assert o.shape == q.shape and o.dtype == dtype
    for i, (row, n) in enumerate(zip(pb.req_pool_indices.tolist(), kv_lens)):
        slots = pb.req_to_token[row, :n].long()
        want = naive_attention(q[i : i + 1], pb.k_cache[slots], pb.v_cache[slots], [n], scale)
        torch.testing.assert_close(o[i : i + 1].double(), want, atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads", [(4, 4), (6, 2)])
def test_extend_attention_matches_loop_oracle(dtype, heads, kv_heads):
    prefix, ext = [0, 4, 0, 9, 3], [5, 1, 1, 6, 0]
    pb = make_paged_batch([p + e for p, e in zip(prefix, ext)], kv_heads, 8, dtype, seed=3)
    q = torch.randn(sum(ext), heads, 8).to(dtype)
    scale = 0.3
    o = extend_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices,
                         torch.tensor(prefix), torch.tensor(ext), scale)
    start = 0
    for row, p, e in zip(pb.req_pool_indices.tolist(), prefix, ext):
        slots = pb.req_to_token[row, : p + e].long()
        want = naive_attention(q[start : start + e], pb.k_cache[slots], pb.v_cache[slots],
                               [p + j + 1 for j in range(e)], scale)
        torch.testing.assert_close(o[start : start + e].double(), want, atol=TOL[dtype], rtol=TOL[dtype])
        start += e


def test_decode_equals_extend_of_last_token():
    # Decoding the last token must equal extending it with the rest as prefix.
    kv_lens = [7, 2, 12]
    pb = make_paged_batch(kv_lens, 2, 16, torch.float32, seed=5)
    q = torch.randn(3, 4, 16)
    args = (pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices)
    o_dec = decode_attention(q, *args, torch.tensor(kv_lens), 0.25)
    o_ext = extend_attention(q, *args, torch.tensor(kv_lens) - 1, torch.ones(3, dtype=torch.int64), 0.25)
    torch.testing.assert_close(o_dec, o_ext, atol=1e-5, rtol=1e-5)


def test_store_kv_writes_only_given_slots():
    k_cache = torch.zeros(10, 2, 4)
    v_cache = torch.zeros(10, 2, 4)
    loc = torch.tensor([7, 2, 5])
    k, v = torch.randn(3, 2, 4), torch.randn(3, 2, 4)
    store_kv(k_cache, v_cache, loc, k, v)
    torch.testing.assert_close(k_cache[loc], k)
    torch.testing.assert_close(v_cache[loc], v)
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[loc] = False
    assert k_cache[untouched].abs().sum() == 0 and v_cache[untouched].abs().sum() == 0


@pytest.mark.parametrize("native", [False, True])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_matches_hf_llama(dtype, with_residual, native, monkeypatch):
    from transformers.models.llama.modeling_llama import LlamaRMSNorm

    from sglpy.kernels.cpu_native import DISABLE_ENV, find_compiler

    if native and (dtype != torch.float32 or find_compiler() is None):
        pytest.skip("the native kernel runs float32 rows, where a compiler built it")
    if not native:
        monkeypatch.setenv(DISABLE_ENV, "1")
    hf = LlamaRMSNorm(32, eps=1e-5).to(dtype)
    with torch.no_grad():
        hf.weight.copy_(torch.randn(32))
    x = torch.randn(5, 32).to(dtype)
    res = torch.randn(5, 32).to(dtype) if with_residual else None
    got = rmsnorm(x, hf.weight.detach(), 1e-5, res)
    want_res = x + res if with_residual else x
    with torch.no_grad():
        want = hf(want_res)
    assert torch.equal(got.residual, want_res)
    if native:  # one pass in C: the sum of squares adds in another order
        torch.testing.assert_close(got.out, want, rtol=2e-6, atol=2e-6)
    else:
        assert torch.equal(got.out, want)  # torch's rms_norm: same ops in the same order, bit-identical


def _hf_rotary(q, k, positions, head_dim, base, rope_parameters):
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    cfg = LlamaConfig(hidden_size=head_dim * q.shape[1], num_attention_heads=q.shape[1], head_dim=head_dim,
                      max_position_embeddings=4096, rope_parameters={"rope_theta": base, **rope_parameters})
    emb = LlamaRotaryEmbedding(cfg)
    cos, sin = emb(q, positions[None])
    # HF layout is [batch, heads, seq, dim]
    qh, kh = apply_rotary_pos_emb(q.transpose(0, 1)[None], k.transpose(0, 1)[None], cos, sin)
    return qh[0].transpose(0, 1), kh[0].transpose(0, 1)


@pytest.mark.parametrize(
    "rope_parameters",
    [
        {"rope_type": "default"},
        {"rope_type": "linear", "factor": 4.0},
        {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
         "original_max_position_embeddings": 512},
    ],
)
def test_rotary_matches_hf_llama(rope_parameters):
    head_dim, base = 64, 500000.0
    q, k = torch.randn(6, 4, head_dim), torch.randn(6, 2, head_dim)
    positions = torch.tensor([0, 1, 2, 100, 2047, 5])
    want_q, want_k = _hf_rotary(q, k, positions, head_dim, base, rope_parameters)
    cache = build_rope_cache(head_dim, 4096, base, rope_parameters)
    apply_rotary(q, k, positions, cache)
    torch.testing.assert_close(q, want_q, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(k, want_k, atol=1e-5, rtol=1e-5)


def test_rotary_works_on_strided_views_of_a_fused_qkv():
    n, heads, kv_heads, d = 4, 4, 2, 8
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d)
    q = qkv[:, : heads * d].view(n, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
    q_copy, k_copy = q.clone(), k.clone()
    v_before = qkv[:, (heads + kv_heads) * d :].clone()
    cache = build_rope_cache(d, 16)
    pos = torch.tensor([3, 0, 9, 15])
    apply_rotary(q, k, pos, cache)
    apply_rotary(q_copy, k_copy, pos, cache)
    torch.testing.assert_close(q, q_copy)
    torch.testing.assert_close(k, k_copy)
    assert torch.equal(qkv[:, (heads + kv_heads) * d :], v_before)


def test_bitmask_masks_exactly_the_cleared_bits():
    vocab = 70  # 3 words, the last one partial
    logits = torch.randn(3, vocab)
    allowed = torch.rand(3, vocab) < 0.3
    allowed[:, 31] = True  # bit 31 makes the int32 word negative
    words = torch.zeros(3, 3, dtype=torch.int64)
    for t in range(vocab):
        words[:, t // 32] |= allowed[:, t].long() << (t % 32)
    bitmask = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)
    before = logits.clone()
    apply_token_bitmask(logits, bitmask)
    assert torch.equal(logits[allowed], before[allowed])
    assert torch.isneginf(logits[~allowed]).all()


def test_bitmask_indices_touch_only_listed_rows():
    logits = torch.randn(4, 40)
    before = logits.clone()
    bitmask = torch.zeros(2, 2, dtype=torch.int32)
    bitmask[:, 0] = 0b101
    apply_token_bitmask(logits, bitmask, torch.tensor([3, 1]))
    assert torch.equal(logits[[0, 2]], before[[0, 2]])
    for r in (1, 3):
        assert torch.equal(logits[r, [0, 2]], before[r, [0, 2]])
        assert torch.isneginf(logits[r]).sum() == 38


def test_bitmask_shorter_than_vocab_disallows_the_tail():
    logits = torch.zeros(1, 40)
    apply_token_bitmask(logits, torch.full((1, 1), -1, dtype=torch.int32))
    assert torch.isfinite(logits[0, :32]).all() and torch.isneginf(logits[0, 32:]).all()


def test_length_groups_bound_padding_and_cover_every_request():
    from sglpy.kernels.decode_attention import length_groups

    lens = [8192] + [10] * 63
    groups = length_groups(lens)
    assert sorted(i for g in groups for i in g) == list(range(64))
    for g in groups:
        assert len(g) * max(lens[i] for i in g) <= 2 * sum(lens[i] for i in g)
    assert length_groups([100, 90, 80, 120]) == [[3, 0, 1, 2]]


def test_decode_attention_mixed_lengths_match_oracle():
    # One long request among short ones takes the grouped path; results stay in request order.
    kv_lens = [3, 200, 1, 5, 150, 2]
    pb = make_paged_batch(kv_lens, 2, 8, torch.float32, seed=11)
    q = torch.randn(len(kv_lens), 4, 8)
    o = decode_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(kv_lens), 0.3)
    for i, (row, n) in enumerate(zip(pb.req_pool_indices.tolist(), kv_lens)):
        slots = pb.req_to_token[row, :n].long()
        want = naive_attention(q[i : i + 1], pb.k_cache[slots], pb.v_cache[slots], [n], 0.3)
        torch.testing.assert_close(o[i : i + 1].double(), want, atol=2e-5, rtol=2e-5)


def test_short_extends_batched_path_equals_one_request_at_a_time():
    """Many short extends go through one padded SDPA; it must equal running each request alone."""
    from sglpy.kernels.extend_attention import SHORT_EXTEND, extend_attention_reference

    torch.manual_seed(0)
    heads, kv_heads, d = 6, 2, 16
    prefix = [0, 5, 40, 3, 17, 90, 0]
    ext = [1, 3, SHORT_EXTEND, 2, 50, 7, 4]  # one long extend takes the per-request path
    slots_n = 512
    k_cache, v_cache = torch.randn(slots_n, kv_heads, d), torch.randn(slots_n, kv_heads, d)
    req_to_token = torch.zeros(len(ext), 256, dtype=torch.int32)
    perm = torch.randperm(slots_n)
    used = 0
    for r, (p, e) in enumerate(zip(prefix, ext)):
        req_to_token[r, : p + e] = perm[used: used + p + e].to(torch.int32)
        used += p + e
    q = torch.randn(sum(ext), heads, d)
    t = lambda xs: torch.tensor(xs)  # noqa: E731
    out = extend_attention_reference(q, k_cache, v_cache, req_to_token, t(list(range(len(ext)))), t(prefix), t(ext), 0.25)
    start = 0
    for r, (p, e) in enumerate(zip(prefix, ext)):
        alone = extend_attention_reference(q[start:start + e], k_cache, v_cache, req_to_token, t([r]), t([p]), t([e]), 0.25)
        torch.testing.assert_close(out[start:start + e], alone, rtol=1e-5, atol=1e-5)
        start += e

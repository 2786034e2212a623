"""Each Triton kernel against its torch reference under TRITON_INTERPRET=1 (set in conftest), small ragged shapes."""

from __future__ import annotations

import os

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

pytest.importorskip("triton")
pytest.importorskip("numpy")
if os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("needs TRITON_INTERPRET=1 (tests/conftest.py sets it)", allow_module_level=True)

from sglpy.runtime.testing.kernel_cases import make_paged_batch, patch_interpreter_bf16_dot  # noqa: E402
from sglpy.kernels import (  # noqa: E402
    apply_rotary_reference,
    apply_token_bitmask_reference,
    build_rope_cache,
    decode_attention_reference,
    extend_attention_reference,
    rmsnorm_reference,
    store_kv_reference,
)
from sglpy.kernels.bitmask_triton import apply_token_bitmask_triton  # noqa: E402
from sglpy.kernels.decode_attention_triton import decode_attention_triton  # noqa: E402
from sglpy.kernels.extend_attention_triton import extend_attention_triton  # noqa: E402
from sglpy.kernels.kv_store_triton import store_kv_triton  # noqa: E402
from sglpy.kernels.rmsnorm_triton import rmsnorm_triton  # noqa: E402
from sglpy.kernels.rotary_triton import apply_rotary_triton  # noqa: E402

patch_interpreter_bf16_dot()

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: 1e-5, BF16: 2e-2, F16: 2e-3}


def close(got: torch.Tensor, want: torch.Tensor) -> None:
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[want.dtype], rtol=TOL[want.dtype])


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,kv_lens,num_splits",
    [
        (F32, 4, 4, [1, 5, 40, 3], 1),  # MHA, single split, length-1 request
        (F32, 6, 2, [1, 5, 40, 3], 3),  # GQA 3, splits (some empty for short requests)
        (BF16, 9, 3, [33, 1, 17], 4),  # SmolLM2 head layout
        (F16, 8, 1, [50, 2], 2),  # MQA
        (BF16, 32, 2, [20], 2),  # group 16 fills the whole 16-row dot tile
    ],
)
def test_decode_attention_matches_reference(dtype, heads, kv_heads, kv_lens, num_splits):
    pb = make_paged_batch(kv_lens, kv_heads, 16, dtype, seed=heads)
    q = torch.randn(len(kv_lens), heads, 16).to(dtype)
    sl = torch.tensor(kv_lens)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, sl, 0.25)
    got = decode_attention_triton(*args, num_splits=num_splits, block_n=16)
    close(got, decode_attention_reference(*args))


def test_decode_attention_default_splits_and_odd_head_dim():
    # head_dim 24 pads to a 32-wide tile; int32 lengths and pool indices are accepted too.
    pb = make_paged_batch([70, 3], 2, 24, F32, seed=1)
    q = torch.randn(2, 4, 24)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices.int(), torch.tensor([70, 3]).int(), 0.2)
    close(decode_attention_triton(*args), decode_attention_reference(*args))


@pytest.mark.parametrize(
    "dtype,heads,kv_heads,prefix,ext",
    [
        (F32, 4, 4, [0, 4, 0, 20, 3], [5, 1, 1, 19, 0]),  # empty prefix, single tokens, zero-length extend
        (BF16, 6, 2, [0, 7], [33, 2]),  # several query blocks for one request
        (F16, 4, 1, [17], [16]),
    ],
)
def test_extend_attention_matches_reference(dtype, heads, kv_heads, prefix, ext):
    pb = make_paged_batch([p + e for p, e in zip(prefix, ext)], kv_heads, 16, dtype, seed=len(prefix))
    q = torch.randn(sum(ext), heads, 16).to(dtype)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(prefix),
            torch.tensor(ext), 0.3)
    close(extend_attention_triton(*args, block_m=16, block_n=16), extend_attention_reference(*args))


@pytest.mark.parametrize("kv_dtype", [BF16, F16])
def test_attention_reads_16bit_caches_under_float32_queries(kv_dtype):
    """kv_cache_dtype: a bf16/fp16 pool read by float32 queries equals the float32 pool holding the same values."""
    pb = make_paged_batch([33, 1, 17], 3, 16, kv_dtype, seed=5)
    q = torch.randn(3, 9, 16)
    sl = torch.tensor([33, 1, 17])
    wide = (pb.k_cache.float(), pb.v_cache.float())
    got = decode_attention_triton(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, sl, 0.25,
                                  num_splits=2, block_n=16)
    want = decode_attention_reference(q, *wide, pb.req_to_token, pb.req_pool_indices, sl, 0.25)
    assert got.dtype == F32
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(decode_attention_reference(q, pb.k_cache, pb.v_cache, pb.req_to_token,
                                                  pb.req_pool_indices, sl, 0.25), want)
    prefix, ext = torch.tensor([30, 0, 9]), torch.tensor([3, 1, 8])
    qe = torch.randn(12, 9, 16)
    args = (pb.req_to_token, pb.req_pool_indices, prefix, ext, 0.3)
    got = extend_attention_triton(qe, pb.k_cache, pb.v_cache, *args, block_m=16, block_n=16)
    want = extend_attention_reference(qe, *wide, *args)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(extend_attention_reference(qe, pb.k_cache, pb.v_cache, *args), want,
                               atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("kv_dtype", [BF16, F16])
def test_store_kv_converts_to_the_cache_dtype(kv_dtype):
    k_cache, v_cache = torch.zeros(20, 3, 8, dtype=kv_dtype), torch.zeros(20, 3, 8, dtype=kv_dtype)
    k, v = torch.randn(5, 3, 8), torch.randn(5, 3, 8)
    loc = torch.tensor([19, 0, 7, 3, 11])
    want_k, want_v = k_cache.clone(), v_cache.clone()
    store_kv_reference(want_k, want_v, loc, k, v)
    assert torch.equal(want_k[loc], k.to(kv_dtype)) and torch.equal(want_v[loc], v.to(kv_dtype))
    store_kv_triton(k_cache, v_cache, loc, k, v)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype,loc_dtype", [(F32, torch.int64), (BF16, torch.int32), (F16, torch.int64)])
def test_store_kv_matches_reference(dtype, loc_dtype):
    k_cache = torch.randn(20, 3, 8).to(dtype)
    v_cache = torch.randn(20, 3, 8).to(dtype)
    big = torch.randn(5, 3, 16).to(dtype)
    k, v = big[..., :8], big[..., 8:]  # strided views, as from a fused projection
    loc = torch.tensor([19, 0, 7, 3, 11], dtype=loc_dtype)
    want_k, want_v = k_cache.clone(), v_cache.clone()
    store_kv_reference(want_k, want_v, loc, k, v)
    store_kv_triton(k_cache, v_cache, loc, k, v)
    assert torch.equal(k_cache, want_k) and torch.equal(v_cache, want_v)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
@pytest.mark.parametrize("with_residual", [False, True])
def test_rmsnorm_matches_reference(dtype, with_residual):
    x = torch.randn(3, 40).to(dtype)  # hidden 40 pads to a 64-wide block
    w = torch.randn(40).to(dtype)
    res = torch.randn(3, 40).to(dtype) if with_residual else None
    want = rmsnorm_reference(x, w, 1e-6, res)
    out, res_out = rmsnorm_triton(x, w, 1e-6, res)
    close(out, want.out)
    if dtype == F32:
        assert torch.equal(res_out, want.residual)
    else:  # the interpreter's float32 -> bf16/f16 cast may round differently from torch's by one ulp
        close(res_out, want.residual)


@pytest.mark.parametrize("dtype", [F32, BF16, F16])
def test_rotary_matches_reference_on_strided_views(dtype):
    n, heads, kv_heads, d = 5, 4, 2, 16
    qkv = torch.randn(n, (heads + 2 * kv_heads) * d).to(dtype)
    q = qkv[:, : heads * d].view(n, heads, d)
    k = qkv[:, heads * d : (heads + kv_heads) * d].view(n, kv_heads, d)
    v_before = qkv[:, (heads + kv_heads) * d :].clone()
    cache = build_rope_cache(d, 64, 10000.0)
    pos = torch.tensor([0, 63, 5, 5, 17])
    want_q, want_k = q.clone(), k.clone()
    apply_rotary_reference(want_q, want_k, pos, cache)
    apply_rotary_triton(q, k, pos, cache)
    close(q, want_q)
    close(k, want_k)
    assert torch.equal(qkv[:, (heads + kv_heads) * d :], v_before)


@pytest.mark.parametrize(
    "use_indices,words_extra,dtype", [(False, 0, F32), (True, 0, BF16), (False, -1, F16), (True, -1, F32)]
)
def test_bitmask_matches_reference(use_indices, words_extra, dtype):
    vocab = 2100  # crosses a 1024-token block and ends mid-word
    words = (vocab + 31) // 32 + words_extra  # -1: short bitmask, the tail is disallowed
    logits = torch.randn(4, vocab).to(dtype)
    indices = torch.tensor([2, 0]) if use_indices else None
    rows = 2 if use_indices else 4
    bitmask = torch.randint(-(2**31), 2**31 - 1, (rows, words), dtype=torch.int64).to(torch.int32)
    want = logits.clone()
    apply_token_bitmask_reference(want, bitmask, indices)
    apply_token_bitmask_triton(logits, bitmask, indices)
    assert torch.equal(logits, want)


def test_cpu_tensors_dispatch_to_the_reference(monkeypatch):
    from sglpy.kernels import _dispatch

    assert _dispatch.triton_module("rmsnorm_triton", torch.zeros(1)) is None


@pytest.fixture
def force_triton(monkeypatch):
    """Route the public wrappers to the Triton modules for CPU tensors (the interpreter runs them)."""
    import importlib

    taken = []

    def forced(module, t):
        taken.append(module)
        return importlib.import_module(f"sglpy.kernels.{module}")

    for name in ("kv_store", "decode_attention", "extend_attention", "rmsnorm", "rotary", "bitmask"):
        monkeypatch.setattr(importlib.import_module(f"sglpy.kernels.{name}"), "triton_module", forced)
    return taken


def test_public_wrappers_through_triton(force_triton):
    # The CUDA path end to end (wrapper -> launcher -> kernel), minus the device.
    from sglpy.kernels import (
        apply_rotary,
        apply_token_bitmask,
        decode_attention,
        extend_attention,
        rmsnorm,
        store_kv,
    )

    kv_lens = [3, 9]
    pb = make_paged_batch(kv_lens, 2, 16, F32, seed=7)
    k_new, v_new = torch.randn(2, 2, 16), torch.randn(2, 2, 16)
    loc = torch.tensor([pb.req_to_token[r, n - 1].item() for r, n in zip(pb.req_pool_indices.tolist(), kv_lens)])
    kc, vc = pb.k_cache.clone(), pb.v_cache.clone()
    store_kv(kc, vc, loc, k_new, v_new)
    want_kc, want_vc = pb.k_cache.clone(), pb.v_cache.clone()
    store_kv_reference(want_kc, want_vc, loc, k_new, v_new)
    assert torch.equal(kc, want_kc) and torch.equal(vc, want_vc)

    q = torch.randn(2, 4, 16)
    meta = (kc, vc, pb.req_to_token, pb.req_pool_indices)
    close(decode_attention(q, *meta, torch.tensor(kv_lens), 0.25),
          decode_attention_reference(q, *meta, torch.tensor(kv_lens), 0.25))
    qe = torch.randn(sum(kv_lens) - 2, 4, 16)
    ext_args = (torch.tensor([1, 1]), torch.tensor([2, 8]), 0.25)
    close(extend_attention(qe, *meta, *ext_args), extend_attention_reference(qe, *meta, *ext_args))

    x, r, w = torch.randn(3, 32), torch.randn(3, 32), torch.randn(32)
    got, want = rmsnorm(x, w, 1e-6, r), rmsnorm_reference(x, w, 1e-6, r)
    close(got.out, want.out)
    close(got.residual, want.residual)
    assert rmsnorm(x, w, 1e-6).residual is x

    cache = build_rope_cache(16, 32)
    qr, kr, pos = torch.randn(3, 4, 16), torch.randn(3, 2, 16), torch.tensor([0, 31, 4])
    qr2, kr2 = qr.clone(), kr.clone()
    apply_rotary(qr, kr, pos, cache)
    apply_rotary_reference(qr2, kr2, pos, cache)
    close(qr, qr2)
    close(kr, kr2)

    logits = torch.randn(3, 50)
    bitmask = torch.tensor([[5, 1]], dtype=torch.int32)
    want_logits = logits.clone()
    apply_token_bitmask(logits, bitmask, torch.tensor([1]))
    apply_token_bitmask_reference(want_logits, bitmask, torch.tensor([1]))
    assert torch.equal(logits, want_logits)
    assert set(force_triton) == {"kv_store_triton", "decode_attention_triton", "extend_attention_triton",
                                 "rmsnorm_triton", "rotary_triton", "bitmask_triton"}


@settings(max_examples=8, deadline=None, derandomize=True)
@given(
    lens=st.lists(st.tuples(st.integers(0, 40), st.integers(0, 20)), min_size=1, max_size=4),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3]),
    splits=st.integers(1, 4),
)
def test_attention_property_random_ragged_batches(lens, kv_heads, group, splits):
    """Triton decode and extend equal the references on random ragged batches (prefix, extend) per request."""
    prefix = [p for p, _ in lens]
    ext = [e for _, e in lens]
    heads = kv_heads * group
    pb = make_paged_batch([max(p + e, 1) for p, e in lens], kv_heads, 16, F32, seed=sum(prefix) + 3 * sum(ext))
    meta = (pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices)
    if sum(ext) > 0:
        q = torch.randn(sum(ext), heads, 16)
        args = (q, *meta, torch.tensor(prefix), torch.tensor(ext), 0.25)
        close(extend_attention_triton(*args, block_m=16, block_n=16), extend_attention_reference(*args))
    seq_lens = torch.tensor([max(p + e, 1) for p, e in lens])
    qd = torch.randn(len(lens), heads, 16)
    args = (qd, *meta, seq_lens, 0.25)
    close(decode_attention_triton(*args, num_splits=splits, block_n=16), decode_attention_reference(*args))


@pytest.mark.parametrize(
    "kv_lens,window,softcap,num_splits",
    [
        ([1, 5, 40, 3], 8, 0.0, 3),  # windows shorter and longer than the requests, some splits empty
        ([70, 3, 33], 20, 5.0, 2),  # window + soft-cap
        ([70, 3], 0, 2.0, 1),  # soft-cap alone
        ([600, 17], 100, 0.0, 4),  # the long request's keys before its window are never split over
    ],
)
def test_decode_attention_window_softcap_match_reference(kv_lens, window, softcap, num_splits):
    pb = make_paged_batch(kv_lens, 2, 16, F32, seed=len(kv_lens) + window)
    q = torch.randn(len(kv_lens), 6, 16)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(kv_lens), 0.25)
    want = decode_attention_reference(*args, window, softcap)
    close(decode_attention_triton(*args, num_splits=num_splits, block_n=16, window=window, softcap=softcap), want)
    # fixed split points (deterministic inference): the 600-token request's window starts in its second split
    close(decode_attention_triton(*args, block_n=16, batch_invariant=True, window=window, softcap=softcap), want)


@pytest.mark.parametrize(
    "prefix,ext,window,softcap",
    [
        ([0, 4, 0, 20, 3], [5, 1, 1, 19, 0], 4, 0.0),  # ragged, cached prefixes past the window, empty extend
        ([0, 7], [33, 2], 8, 3.0),  # several query blocks, window + soft-cap
        ([17], [16], 0, 1.0),  # soft-cap alone
        ([40, 2], [40, 30], 100, 0.0),  # window longer than the context
        ([40, 2], [40, 30], 1, 0.0),  # each token sees itself only
    ],
)
def test_extend_attention_window_softcap_match_reference(prefix, ext, window, softcap):
    pb = make_paged_batch([p + e for p, e in zip(prefix, ext)], 2, 16, F32, seed=len(prefix) + window)
    q = torch.randn(sum(ext), 6, 16)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(prefix),
            torch.tensor(ext), 0.3)
    close(extend_attention_triton(*args, block_m=16, block_n=16, window=window, softcap=softcap),
          extend_attention_reference(*args, window, softcap))

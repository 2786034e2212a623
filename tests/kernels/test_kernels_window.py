"""Sliding windows and attention-logit soft-capping in the attention kernels (Gemma 2/3, Phi-3, Mistral): the torch
references against a float64 loop oracle, the native CPU kernels against the references (ragged batches, cached
prefixes, windows shorter and longer than the context, long contexts split into chunks), the no-window path left
bit-identical, and the window's block alignment keeping deterministic inference's batch invariance."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglpy.kernels.cpu_native import DISABLE_ENV, find_compiler, native_lib
from sglpy.kernels.decode_attention import decode_attention, decode_attention_reference
from sglpy.kernels.decode_attention_cpu import decode_attention_cpu
from sglpy.kernels.decode_plan import decode_attention_planned, plan_decode_attention
from sglpy.kernels.extend_attention import extend_attention, extend_attention_reference
from sglpy.kernels.extend_attention_cpu import extend_attention_cpu
from sglpy.runtime.testing.kernel_cases import make_paged_batch

_DISABLED = __import__("os").environ.get(DISABLE_ENV, "") not in ("", "0")
needs_native = pytest.mark.skipif(find_compiler() is None or _DISABLED,
                                  reason=f"no C++ compiler on this machine, or {DISABLE_ENV} is set")
TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 3e-3}


def oracle(q_rows, k, v, positions, scale, window, softcap):
    """Float64 loop: the query at positions[j] sees keys (positions[j] - window, positions[j]] (all of [0, p] when
    window is 0), scaled scores capped as tanh(s / softcap) * softcap when softcap > 0; GQA by head // group."""
    # q_rows: [m, heads, d]; k, v: [L, kv_heads, d]
    m, heads, d = q_rows.shape
    group = heads // k.shape[1]
    out = torch.zeros(m, heads, d, dtype=torch.float64)
    for j, p in enumerate(positions):
        lo = max(0, p - window + 1) if window else 0
        for h in range(heads):
            kk, vv = k[lo:p + 1, h // group].double(), v[lo:p + 1, h // group].double()
            s = (kk @ q_rows[j, h].double()) * scale
            if softcap:
                s = torch.tanh(s / softcap) * softcap
            out[j, h] = torch.softmax(s, dim=0) @ vv
    return out


def _close(got, want, dtype):
    torch.testing.assert_close(got.double(), want.double(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("window,softcap", [(4, 0.0), (0, 2.0), (6, 1.5), (100, 0.0)])
def test_references_match_the_loop_oracle(window, softcap):
    heads, kv_heads, d, scale = 6, 2, 16, 0.4
    prefix, ext = [0, 4, 0, 9, 3, 20], [5, 1, 1, 6, 0, 40]  # > SHORT_EXTEND: the per-request path too
    lens = [p + e for p, e in zip(prefix, ext)]
    pb = make_paged_batch(lens, kv_heads, d, torch.float32, seed=window + 7)
    q = torch.randn(sum(ext), heads, d)
    o = extend_attention_reference(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices,
                                   torch.tensor(prefix), torch.tensor(ext), scale, window, softcap)
    start = 0
    for row, p, e in zip(pb.req_pool_indices.tolist(), prefix, ext):
        slots = pb.req_to_token[row, :p + e].long()
        want = oracle(q[start:start + e], pb.k_cache[slots], pb.v_cache[slots], range(p, p + e), scale, window,
                      softcap)
        _close(o[start:start + e], want, torch.float32)
        start += e
    qd = torch.randn(len(lens), heads, d)
    dec_lens = [max(n, 1) for n in lens]
    od = decode_attention_reference(qd, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices,
                                    torch.tensor(dec_lens), scale, window, softcap)
    for i, (row, n) in enumerate(zip(pb.req_pool_indices.tolist(), dec_lens)):
        slots = pb.req_to_token[row, :n].long()
        want = oracle(qd[i:i + 1], pb.k_cache[slots], pb.v_cache[slots], [n - 1], scale, window, softcap)
        _close(od[i:i + 1], want, torch.float32)


@pytest.mark.parametrize("bad", [dict(window=-1), dict(softcap=-0.5), dict(softcap=float("inf")),
                                 dict(softcap=float("nan")), dict(window=2.5)])
def test_bad_window_or_softcap_is_named(bad):
    pb = make_paged_batch([5], 1, 16, torch.float32)
    q = torch.randn(1, 2, 16)
    with pytest.raises(ValueError, match="window|softcap"):
        decode_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor([5]), 0.3,
                         **bad)
    with pytest.raises(ValueError, match="window|softcap"):
        extend_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor([4]),
                         torch.tensor([1]), 0.3, **bad)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 4, 64), (8, 1, 128), (6, 2, 32)])
@pytest.mark.parametrize("window,softcap", [(16, 0.0), (0, 5.0), (50, 3.0), (4000, 0.0), (1, 0.0)])
def test_native_decode_matches_the_reference(dtype, heads, kv_heads, d, window, softcap):
    """Ragged lengths around the window (shorter, equal, longer), one long request split into chunks."""
    lens = [1, 16, 17, 50, 300, 2500]
    pb = make_paged_batch(lens, kv_heads, d, dtype, seed=d + window)
    q = torch.randn(len(lens), heads, d)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(lens), 0.125)
    _close(decode_attention_cpu(native_lib(), *args, window, softcap),
           decode_attention_reference(*args, window, softcap), torch.float32)
    # the long request alone: split into key chunks over its window only (few requests, several threads)
    one = (q[5:], pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices[5:], torch.tensor(lens[5:]), 0.125)
    _close(decode_attention_cpu(native_lib(), *one, window, softcap),
           decode_attention_reference(*one, window, softcap), torch.float32)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(8, 4, 64), (4, 1, 128), (6, 2, 48)])
@pytest.mark.parametrize("window,softcap", [(16, 0.0), (0, 5.0), (70, 3.0), (4000, 0.0), (1, 0.0)])
def test_native_extend_matches_the_reference(dtype, heads, kv_heads, d, window, softcap):
    """Cached prefixes (inside and past the window), several query blocks per request, an empty extend."""
    prefix, ext = [0, 40, 0, 200, 3, 7], [150, 1, 5, 90, 0, 64]
    pb = make_paged_batch([p + e for p, e in zip(prefix, ext)], kv_heads, d, dtype, seed=d + window)
    q = torch.randn(sum(ext), heads, d)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(prefix),
            torch.tensor(ext), 0.125)
    _close(extend_attention_cpu(native_lib(), *args, window, softcap),
           extend_attention_reference(*args, window, softcap), torch.float32)


@needs_native
@settings(max_examples=25, deadline=None, derandomize=True)
@given(lens=st.lists(st.tuples(st.integers(0, 150), st.integers(0, 80)), min_size=1, max_size=5),
       window=st.integers(1, 200), softcap=st.sampled_from([0.0, 0.5, 20.0]), group=st.sampled_from([1, 3]))
def test_native_property_random_ragged_batches(lens, window, softcap, group):
    prefix, ext = [p for p, _ in lens], [e for _, e in lens]
    pb = make_paged_batch([max(p + e, 1) for p, e in lens], 2, 32, torch.float32, seed=sum(prefix) + window)
    meta = (pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices)
    if sum(ext):
        q = torch.randn(sum(ext), 2 * group, 32)
        args = (q, *meta, torch.tensor(prefix), torch.tensor(ext), 0.2)
        _close(extend_attention_cpu(native_lib(), *args, window, softcap),
               extend_attention_reference(*args, window, softcap), torch.float32)
    qd = torch.randn(len(lens), 2 * group, 32)
    args = (qd, *meta, torch.tensor([max(p + e, 1) for p, e in lens]), 0.2)
    _close(decode_attention_cpu(native_lib(), *args, window, softcap),
           decode_attention_reference(*args, window, softcap), torch.float32)


@needs_native
def test_a_window_the_context_never_reaches_is_bit_identical_to_none():
    """The window's code path costs nothing where it never applies: the same bits as plain causal attention."""
    lens = [300, 5, 900]
    pb = make_paged_batch(lens, 2, 64, torch.float32, seed=2)
    q = torch.randn(3, 8, 64)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(lens), 0.125)
    assert torch.equal(decode_attention_cpu(native_lib(), *args, 901), decode_attention_cpu(native_lib(), *args))
    prefix, ext = torch.tensor([200, 0, 800]), torch.tensor([100, 5, 100])
    qe = torch.randn(205, 8, 64)
    eargs = (qe, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, prefix, ext, 0.125)
    assert torch.equal(extend_attention_cpu(native_lib(), *eargs, 901), extend_attention_cpu(native_lib(), *eargs))


@needs_native
def test_windowed_extend_is_batch_invariant_and_decode_equals_one_token_extend():
    """Key blocks stay at multiples of 64 from position 0 under a window: a row's bits do not depend on the chunk
    it was computed in, and deterministic decode (a one-token extend) gives the bits of the extend."""
    lens = [300, 90]
    pb = make_paged_batch(lens, 2, 64, torch.float32, seed=9)
    rows = pb.req_pool_indices
    q = torch.randn(300, 6, 64)
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    for window, softcap in ((37, 0.0), (100, 4.0)):
        whole = extend_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, rows[:1], t([0]), t([300]), 0.25,
                                 window, softcap)
        for cut in (1, 63, 64, 150, 299):
            tail = extend_attention(q[cut:], pb.k_cache, pb.v_cache, pb.req_to_token, rows[:1], t([cut]),
                                    t([300 - cut]), 0.25, window, softcap)
            assert torch.equal(tail, whole[cut:]), (window, cut)
        plan = plan_decode_attention(pb.req_to_token, rows, t([300, 90]), batch_invariant=True)
        qd = torch.cat([q[299:300], torch.randn(1, 6, 64)])
        dec = decode_attention_planned(qd, pb.k_cache, pb.v_cache, plan, 0.25, window, softcap)
        assert torch.equal(dec[0], whole[299])


@needs_native
def test_decode_reads_only_the_window():
    """Slot ids before the window are never read: out-of-range ids there are not reported (nor dereferenced)."""
    pb = make_paged_batch([100], 1, 16, torch.float32, seed=1)
    r2t = pb.req_to_token.clone()
    row = int(pb.req_pool_indices[0])
    r2t[row, :60] = 10 ** 6  # far outside the pool
    q = torch.randn(1, 2, 16)
    args = (q, pb.k_cache, pb.v_cache, r2t, pb.req_pool_indices, torch.tensor([100]), 0.25)
    want = decode_attention_reference(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices,
                                      torch.tensor([100]), 0.25, 40)
    _close(decode_attention_cpu(native_lib(), *args, 40), want, torch.float32)
    with pytest.raises(ValueError, match="slot id outside"):
        decode_attention_cpu(native_lib(), *args, 41)

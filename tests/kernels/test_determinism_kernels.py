"""Batch invariance of the kernels deterministic inference runs (docs/determinism.md): a row's result, bit for bit,
does not depend on how many rows share the call, where they sit, or where a prefix/chunk split falls."""

from __future__ import annotations

import os

import pytest
import torch

from sglpy.kernels.cpu_native import DISABLE_ENV, find_compiler, native_lib
from sglpy.kernels.decode_plan import decode_attention_planned, plan_decode_attention
from sglpy.kernels.extend_attention import extend_attention
from sglpy.kernels.quant_linear import pack_linear, quant_linear_unchecked
from sglpy.kernels.quant_linear_cpu import linear_f32_cpu
from sglpy.runtime.testing.kernel_cases import make_paged_batch

_DISABLED = os.environ.get(DISABLE_ENV, "") not in ("", "0")
pytestmark = pytest.mark.skipif(find_compiler() is None or _DISABLED,
                                reason=f"no C++ compiler on this machine, or {DISABLE_ENV} is set")

ROW_COUNTS = (1, 2, 7, 8, 9, 16, 17, 33, 64)


def _linear(kind: str, n: int, k: int):
    """A [M, k] -> [M, n] function through the path deterministic inference uses for `kind`."""
    g = torch.Generator().manual_seed(n + k)
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g)
    if kind == "f32":
        return lambda x: linear_f32_cpu(native_lib(), x, w, bias)
    p = pack_linear(w, bias, kind, 32, dense=None)  # no dense copy: the native kernel for every row count
    assert p.native
    return lambda x: quant_linear_unchecked(x, p)


@pytest.mark.parametrize("kind,n,k", [("f32", 96, 64), ("f32", 40, 37), ("int8", 96, 64), ("int4", 96, 64),
                                      ("int4", 1536, 576), ("int8", 33, 80), ("int4", 70, 96)])  # tail rows
def test_linear_row_depends_on_its_row_alone(kind, n, k):
    f = _linear(kind, n, k)
    x = torch.randn(64, k, generator=torch.Generator().manual_seed(1))
    full = f(x)
    for m in ROW_COUNTS:
        assert torch.equal(f(x[:m]), full[:m]), f"{kind}: rows of an M={m} call differ from the same rows at M=64"
    perm = torch.randperm(64, generator=torch.Generator().manual_seed(2))
    assert torch.equal(f(x[perm]), full[perm]), f"{kind}: a row's result depends on its position"


def test_f32_linear_matches_float64():
    f = _linear("f32", 40, 37)  # K not a multiple of 16: the scalar tail runs too
    g = torch.Generator().manual_seed(40 + 37)
    w, bias = torch.randn(40, 37, generator=g) * 0.05, torch.randn(40, generator=g)
    x = torch.randn(11, 37)
    want = (x.double() @ w.double().t() + bias.double()).float()
    torch.testing.assert_close(f(x), want, atol=1e-5, rtol=1e-5)


def test_dense_copy_is_what_makes_rows_batch_dependent():
    """The control: with the many-row dense copy (the default), some row of a 33-row call differs from the same row
    computed alone; the deterministic path (above) never does. If this stops holding, the default path became
    batch-invariant by itself and docs/determinism.md should say so."""
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 128, generator=g) * 0.05
    p = pack_linear(w, None, "int8", 32, dense=torch.float32)
    x = torch.randn(33, 128, generator=g)
    full = quant_linear_unchecked(x, p)
    alone = torch.cat([quant_linear_unchecked(x[i:i + 1], p) for i in range(33)])
    assert not torch.equal(full, alone)


def _extend(pb, q, rows, prefix, ext):
    t = lambda xs: torch.tensor(xs, dtype=torch.int64)  # noqa: E731
    return extend_attention(q, pb.k_cache, pb.v_cache, pb.req_to_token, t(rows), t(prefix), t(ext), 0.25)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_extend_attention_same_for_any_prefix_or_chunk_split(dtype):
    heads, kv_heads, d = 6, 2, 32
    lens = [150, 70, 300]
    pb = make_paged_batch(lens, kv_heads, d, dtype, seed=3)
    rows = pb.req_pool_indices.tolist()
    q = torch.randn(150, heads, d)
    whole = _extend(pb, q, [rows[0]], [0], [150])
    for cut in (1, 37, 64, 100, 149):  # a cached prefix of `cut` tokens, or a chunk boundary there
        tail = _extend(pb, q[cut:], [rows[0]], [cut], [150 - cut])
        assert torch.equal(tail, whole[cut:]), f"prefix split at {cut} changed the result"
    # the same request among others (packed second)
    q_other = torch.randn(70, heads, d)
    both = _extend(pb, torch.cat([q_other, q[40:]]), [rows[1], rows[0]], [0, 40], [70, 110])
    assert torch.equal(both[70:], whole[40:])


def _decode(pb, q, idx, lens, invariant):
    rows = pb.req_pool_indices[idx]
    plan = plan_decode_attention(pb.req_to_token, rows, torch.tensor(lens), batch_invariant=invariant)
    return decode_attention_planned(q, pb.k_cache, pb.v_cache, plan, 0.25)


def test_invariant_decode_equals_alone_and_equals_extend():
    heads, kv_heads, d = 9, 3, 64
    lens = [700, 5, 300, 64, 1000]  # long ones: the default kernel would split them by batch size
    pb = make_paged_batch(lens, kv_heads, d, torch.float32, seed=4)
    q = torch.randn(len(lens), heads, d)
    batch = _decode(pb, q, list(range(5)), lens, True)
    for i, n in enumerate(lens):
        alone = _decode(pb, q[i:i + 1], [i], [n], True)
        assert torch.equal(alone[0], batch[i]), f"request {i} differs alone vs in the batch"
        ext = _extend(pb, q[i:i + 1], [int(pb.req_pool_indices[i])], [n - 1], [1])
        assert torch.equal(ext[0], batch[i]), f"request {i}: decode differs from a one-token extend"
    # the default plan splits long requests into 256-key chunks of their own: batch-invariant too, a speculative
    # verify row equals a one-row step (its chunks are not the extend kernel's 64-key blocks: a different order)
    default_batch = _decode(pb, q, list(range(5)), lens, False)
    default_alone = torch.cat([_decode(pb, q[i:i + 1], [i], [n], False) for i, n in enumerate(lens)])
    assert torch.equal(default_batch, default_alone)
    assert not torch.equal(default_batch, batch)  # the control: the two plans add in different orders


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="the Triton kernel runs interpreted on CPU")
def test_triton_decode_fixed_splits_are_batch_invariant():
    pytest.importorskip("triton")
    from sglpy.kernels.decode_attention import decode_attention_reference
    from sglpy.kernels.decode_attention_triton import decode_attention_triton, fixed_split_len

    assert fixed_split_len(8192) == 256 and fixed_split_len(131072) == 2048
    heads, kv_heads, d = 4, 2, 16
    lens = [300, 3, 520]
    pb = make_paged_batch(lens, kv_heads, d, torch.float32, seed=5, max_context=600)
    q = torch.randn(3, heads, d)
    sl = torch.tensor(lens)
    args = (pb.k_cache, pb.v_cache, pb.req_to_token)
    batch = decode_attention_triton(q, *args, pb.req_pool_indices, sl, 0.25, batch_invariant=True)
    torch.testing.assert_close(batch, decode_attention_reference(q, *args, pb.req_pool_indices, sl, 0.25),
                               atol=1e-5, rtol=1e-5)
    for i in range(3):
        alone = decode_attention_triton(q[i:i + 1], *args, pb.req_pool_indices[i:i + 1], sl[i:i + 1], 0.25,
                                        batch_invariant=True)
        assert torch.equal(alone[0], batch[i])


def test_row_split_linear_depends_on_row_kind_alone():
    """Deterministic inference's quantized linear (runtime/model/quantization.py): generated-token rows run the
    native GEMV, prompt rows the dense copy in 64-row tiles; a row's result depends on its kind and its own values,
    never on the other rows, their kinds or how many there are."""
    from sglpy.runtime.model.quantization import QuantizedLinear, RowByRowLinear, RowSplit

    g = torch.Generator().manual_seed(9)
    w = torch.randn(192, 96, generator=g) * 0.05
    split = RowSplit()
    lin = RowByRowLinear(QuantizedLinear(pack_linear(w, torch.randn(192, generator=g), "int4", 32,
                                                     dense=torch.float32)), split)
    x = torch.randn(150, 96, generator=g)

    def run(kinds: torch.Tensor) -> torch.Tensor:
        split.native, split.head_native = kinds, None
        return lin(x[:kinds.shape[0]])

    prompt = run(torch.zeros(150, dtype=torch.bool))  # every row a prompt row: three tiles, the last one padded
    generated = run(torch.ones(150, dtype=torch.bool))
    assert not torch.equal(prompt, generated)  # the two kinds do run different kernels
    for seed, m in ((1, 1), (2, 5), (3, 64), (4, 70), (5, 150)):
        kinds = torch.rand(m, generator=torch.Generator().manual_seed(seed)) < 0.5
        got = run(kinds)
        assert torch.equal(got[kinds], generated[:m][kinds]) and torch.equal(got[~kinds], prompt[:m][~kinds])


def test_row_split_float32_linear_depends_on_row_kind_alone():
    """quantization none under deterministic inference: generated rows run the native float32 GEMV, prompt rows
    torch's float32 GEMM in fixed 64-row tiles."""
    from sglpy.runtime.model.quantization import RowByRowLinear, RowSplit

    split = RowSplit()
    lin = RowByRowLinear(torch.nn.Linear(96, 200), split)
    x = torch.randn(140, 96, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        split.native = torch.zeros(140, dtype=torch.bool)
        prompt = lin(x)
        split.native = torch.ones(140, dtype=torch.bool)
        generated = lin(x)
        for seed, m in ((1, 1), (2, 9), (3, 64), (4, 100)):
            kinds = torch.rand(m, generator=torch.Generator().manual_seed(seed)) < 0.5
            split.native = kinds
            got = lin(x[:m])
            assert torch.equal(got[kinds], generated[:m][kinds]) and torch.equal(got[~kinds], prompt[:m][~kinds])


def test_float32_decode_rows_are_row_invariant_up_to_16():
    """quantization none without the flag: up to 16 rows (decode and speculative verify steps) a row's bits are those
    of a one-row call; more rows take torch's GEMM (the control: it gives row 0 other bits than the GEMV)."""
    from sglpy.runtime.model.quantization import DecodeRowsLinear

    lin = DecodeRowsLinear(torch.nn.Linear(96, 200))
    x = torch.randn(40, 96, generator=torch.Generator().manual_seed(12))
    with torch.no_grad():
        alone = torch.cat([lin(x[i:i + 1]) for i in range(16)])
        for m in (2, 5, 8, 16):
            assert torch.equal(lin(x[:m]), alone[:m]), m
        many = lin(x)
        assert torch.equal(many, lin.inner(x))
        torch.testing.assert_close(many[:16], alone)
        assert not torch.equal(many[:16], alone)  # the control: another reduction order

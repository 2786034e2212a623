"""Segmented LoRA: the torch reference against a row-by-row float64 oracle, the Triton kernel against the reference
under TRITON_INTERPRET=1 (set in conftest), the grouping of rows and the wrapper's checks."""

from __future__ import annotations

import os

import pytest
import torch

from sglpy.kernels.lora import group_rows, lora_delta, lora_delta_reference

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: 1e-5, BF16: 3e-2, F16: 3e-3}


def _case(row_slots, ranks, n_in, offsets, pool_rank, dtype, seed=0, slots=4):
    g = torch.Generator().manual_seed(seed)
    n_slices, out = len(offsets) - 1, offsets[-1]
    x = torch.randn(len(row_slots), n_in, generator=g).to(dtype)
    y = torch.randn(len(row_slots), out, generator=g).to(dtype)
    a = (torch.randn(slots, n_slices * pool_rank, n_in, generator=g) * n_in ** -0.5).to(dtype)
    b = (torch.randn(slots, pool_rank, out, generator=g) * 0.5).to(dtype)  # Bt: [slots, R, out]
    seg = group_rows(row_slots, ranks, x.device)
    return x, y, a, b, seg


def _oracle(x, y, a, b, offsets, row_slots, ranks):
    """Row by row in float64: slice s of row i gets (x_i A[slot, s R : s R + r]^T) Bt[slot, :r, slice cols]."""
    out = y.double().clone()
    pool_rank = b.shape[1]
    for i, slot in enumerate(row_slots):
        if slot < 0:
            continue
        r = ranks[slot]
        for s in range(len(offsets) - 1):
            h = x[i].double() @ a[slot, s * pool_rank:s * pool_rank + r].double().t()
            out[i, offsets[s]:offsets[s + 1]] += h @ b[slot, :r, offsets[s]:offsets[s + 1]].double()
    return out


CASES = [  # row slots (-1 = base), rank per slot, in, slice offsets, pool rank
    ([0, 1, -1, 2, 0, 1, 2, -1], {0: 4, 1: 16, 2: 8}, 48, (0, 32, 40, 48), 16),  # q/k/v slices, mixed ranks
    ([1] * 5, {1: 8}, 40, (0, 24), 8),  # one adapter on every row (no gather)
    ([-1, 3, 3, -1, 0], {3: 2, 0: 5}, 33, (0, 20, 40), 8),  # gate/up slices, odd sizes
]


@pytest.mark.parametrize("row_slots,ranks,n_in,offsets,pool_rank", CASES)
def test_reference_matches_row_oracle(row_slots, ranks, n_in, offsets, pool_rank):
    x, y, a, b, seg = _case(row_slots, ranks, n_in, offsets, pool_rank, F32)
    want = _oracle(x, y, a, b, offsets, row_slots, ranks)
    got = lora_delta_reference(x, y.clone(), a, b, offsets, seg)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


def test_group_rows_keeps_order_and_skips_base():
    seg = group_rows([2, -1, 0, 2, 0, -1], {0: 3, 2: 7}, torch.device("cpu"))
    assert seg.rows.tolist() == [0, 3, 2, 4] and seg.host_indptr == (0, 2, 4)
    assert seg.host_slots == (2, 0) and seg.host_ranks == (7, 3) and not seg.all_rows
    assert group_rows([-1, -1], {}, torch.device("cpu")) is None
    assert group_rows([1, 1], {1: 4}, torch.device("cpu")).all_rows


def test_checks_name_the_problem():
    x, y, a, b, seg = _case([0, 1], {0: 4, 1: 4}, 16, (0, 8), 4, F32)
    with pytest.raises(ValueError, match="offsets"):
        lora_delta(x, y, a, b, (0, 7), seg)
    with pytest.raises(ValueError, match="dtype"):
        lora_delta(x, y, a.half(), b, (0, 8), seg)  # a and bt of one dtype
    with pytest.raises(ValueError, match="dtype"):
        lora_delta(x, y.double(), a, b, (0, 8), seg)
    bad = group_rows([0, 9], {0: 4, 9: 4}, x.device)
    with pytest.raises(ValueError, match="slots"):
        lora_delta(x, y, a, b, (0, 8), bad)


triton_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@triton_only
@pytest.mark.parametrize("dtype", [F32, F16])
@pytest.mark.parametrize("row_slots,ranks,n_in,offsets,pool_rank", CASES)
def test_triton_matches_reference(row_slots, ranks, n_in, offsets, pool_rank, dtype):
    pytest.importorskip("triton")
    from sglpy.kernels.lora_triton import lora_delta_triton

    x, y, a, b, seg = _case(row_slots, ranks, n_in, offsets, pool_rank, dtype, seed=1)
    want = lora_delta_reference(x.float(), y.float().clone(), a.float(), b.float(), offsets, seg)
    got = lora_delta_triton(x, y.clone(), a, b, offsets, seg)
    torch.testing.assert_close(got.float(), want, atol=TOL[dtype], rtol=TOL[dtype])


@triton_only
def test_triton_long_segment_crosses_row_blocks():
    pytest.importorskip("triton")
    from sglpy.kernels.lora_triton import lora_delta_triton

    rows = [0] * 40 + [1] * 30 + [-1] * 3  # prefill-sized segments: several 64-row or 16-row blocks
    x, y, a, b, seg = _case(rows, {0: 16, 1: 3}, 24, (0, 16), 16, F32, seed=2)
    want = lora_delta_reference(x, y.clone(), a, b, (0, 16), seg)
    torch.testing.assert_close(lora_delta_triton(x, y.clone(), a, b, (0, 16), seg), want, atol=1e-5, rtol=1e-5)


NATIVE_CASES = CASES + [  # decode-sized: 16 rows over 8 adapters, fused q/k/v, enough work for the threads
    ([k % 8 for k in range(16)], {k: (8, 16, 64)[k % 3] for k in range(8)}, 96, (0, 64, 96, 128), 64),
    ([5], {5: 16}, 200, (0, 300), 16),  # one row, one adapter: the work split across rank rows and columns
    # prefill-sized: segments of several 16-row shrink blocks (odd lengths, base rows between), ranks below the pool's
    ([0] * 37 + [-1] * 5 + [3] * 50 + [0] * 6 + [6] * 3, {0: 16, 3: 5, 6: 12}, 72, (0, 48, 80, 200), 16),
]


@pytest.mark.parametrize("wdtype", [F32, BF16])
@pytest.mark.parametrize("row_slots,ranks,n_in,offsets,pool_rank", NATIVE_CASES)
def test_native_cpu_matches_reference(row_slots, ranks, n_in, offsets, pool_rank, wdtype):
    """float32 x / y with float32 or bf16 adapter weights; the result does not depend on the thread count."""
    from sglpy.kernels.lora_cpu import lora_delta_cpu, lora_lib

    x, y, a, b, seg = _case(row_slots, ranks, n_in, offsets, pool_rank, F32, seed=3, slots=8)
    a, b = a.to(wdtype), b.to(wdtype)
    lib = lora_lib(x, y, a, b)
    if lib is None:
        pytest.skip("the native CPU kernels are not built here")
    want = lora_delta_reference(x, y.clone(), a, b, offsets, seg)  # upcasts the weights: same products
    got = lora_delta_cpu(lib, x, y.clone(), a, b, torch.tensor(offsets), seg)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert torch.equal(lora_delta(x, y.clone(), a, b, offsets, seg), got)  # the wrapper takes the native path
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(lora_delta_cpu(lib, x, y.clone(), a, b, torch.tensor(offsets), seg), got)
    finally:
        torch.set_num_threads(threads)


def test_native_cpu_refuses_segments_outside_the_tensors():
    from sglpy.kernels.lora_cpu import lora_delta_cpu, lora_lib

    x, y, a, b, _ = _case([0, 1], {0: 4, 1: 4}, 16, (0, 8), 4, F32)
    if lora_lib(x, y, a, b) is None:
        pytest.skip("the native CPU kernels are not built here")
    bad = group_rows([0, 9], {0: 4, 9: 4}, x.device)
    before = y.clone()
    with pytest.raises(ValueError, match="outside the tensors"):
        lora_delta_cpu(lora_lib(x, y, a, b), x, y, a, b, torch.tensor((0, 8)), bad)
    assert torch.equal(y, before)  # nothing written

"""The native row-wise argmax / top-k (kernels/csrc/select_rows.cpp) against torch, and the sampler's greedy and
top-k candidates with and without them."""

import pytest
import torch

from sglpy.kernels.select_cpu import (argmax_rows, sample_rows, sample_rows_reference, select_lib, topk_rows,
                                     topk_rows_reference)
from sglpy.runtime.engine.truncation import greedy, top_candidates


@pytest.fixture
def lib():
    x = torch.zeros(1, 4)
    lib = select_lib(x)
    if lib is None:
        pytest.skip("native CPU kernels unavailable")
    return lib


def _same(a, b):  # NaN equal to NaN
    return torch.equal(a.nan_to_num(nan=1e30), b.nan_to_num(nan=1e30))


def _rows():
    g = torch.Generator().manual_seed(1)
    ties = torch.randint(-20, 20, (24, 4096), generator=g).float()  # many ties
    ties[3] = float("-inf")
    ties[4, 100] = float("nan")
    ties[7, 5] = ties[7, 3000] = float("nan")
    ties[9, :2000] = float("inf")
    ties[9, 2000:] = float("-inf")  # +inf and -inf: no NaN
    odd = torch.randint(-30, 30, (6, 50257), generator=g).float()  # columns past the last full block
    odd[2, -1] = 1000.0
    return [ties, odd, torch.randn(64, 49152, generator=g), torch.randn(3, 17, generator=g),
            torch.randn(10, 1000, generator=g)[:, 3:900],  # rows a stride apart
            *_running_rows(g)]


def _running_rows(g):
    """Rows for the one-pass top-k (k much smaller than the row): its buffer filling, its floor's ties, -inf, NaN."""
    asc = torch.arange(49152.0).repeat(4, 1)  # every column beats the last: the buffer fills again and again
    asc[1] = -asc[1]
    asc[2] = 0.0  # all ties: the first k columns
    asc[3, ::7] = float("-inf")
    masked = torch.full((8, 49152), float("-inf"))  # a grammar's mask: fewer finite columns than k, then -inf ones
    for r in range(8):
        masked[r, torch.randint(0, 49152, (r * 9,), generator=g)] = torch.randn(r * 9, generator=g)
    nan = torch.randn(4, 49152, generator=g)  # a NaN past the first pass's lanes' first values
    nan[0, 40000] = nan[1, -1] = nan[2, 60] = nan[3, 0] = float("nan")
    few = torch.randint(-3, 3, (16, 49152), generator=g).float()  # the floor tied by thousands of columns
    wide = torch.randn(4, 151936, generator=g) * 4  # several segments of lanes at k = 256
    zeros = torch.zeros(2, 4096)  # -0 and +0 are equal: by column
    zeros[0, ::2] = -0.0
    zeros[1, 100:] = -0.0
    zeros[:, 3000] = 1.0
    return [asc, masked, nan, few, wide, zeros]


def test_argmax_rows_is_torch_argmax_first_maximum_nan_largest(lib):
    for x in _rows():
        assert torch.equal(argmax_rows(lib, x), x.argmax(dim=-1))


def test_topk_rows_values_equal_torch_and_ties_come_by_column(lib):
    for x in _rows():
        for k in (1, 5, 50, 64, 256, 1000):
            if k > x.shape[1]:
                continue
            vals, idx = topk_rows(lib, x, k)
            assert _same(vals, topk_rows_reference(x, k).values)
            assert _same(x.gather(1, idx), vals)
            assert all(len(set(c.tolist())) == k for c in idx)
            eq = vals[:, 1:] == vals[:, :-1]  # equal neighbours: ascending columns
            assert bool((idx[:, 1:] > idx[:, :-1])[eq].all())
    with pytest.raises(ValueError):
        topk_rows(lib, torch.zeros(2, 4), 5)


@pytest.mark.parametrize("isa", ["avx2", "baseline"])
def test_each_lower_isa_level_selects_as_torch(isa):
    """The levels below this CPU's best (forced, as SGLPY_CPU_ISA does): their passes run on other vector widths
    (the AVX2 and SSE2 max passes once compiled lane by lane), with the same answers."""
    from sglpy.kernels import cpu_native
    from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels
    from sglpy.kernels.select_cpu import _typed

    if isa not in runnable_levels(read_cpu_flags()) or cpu_native.find_compiler() is None:
        pytest.skip(f"this machine does not build and run the {isa} level")
    built = cpu_native.build_native(cpu_native.find_compiler(), cpu_native.cache_dir(), isa=isa)
    assert built.lib is not None and built.isa == isa, built.detail
    lib = _typed(built.lib)
    for x in _rows():
        assert torch.equal(argmax_rows(lib, x), x.argmax(dim=-1)), isa
        for k in (1, 50, 256):
            if k <= x.shape[1]:
                vals, idx = topk_rows(lib, x, k)
                assert _same(vals, topk_rows_reference(x, k).values) and _same(x.gather(1, idx), vals), (isa, k)


def test_topk_rows_with_two_threads_equals_one(lib):
    x = torch.randn(64, 49152, generator=torch.Generator().manual_seed(4))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = topk_rows(lib, x, 50)
        torch.set_num_threads(2)
        two = topk_rows(lib, x, 50)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])


def test_sampler_paths_agree_with_the_torch_fallback(lib, monkeypatch):
    x = torch.randn(32, 49152, generator=torch.Generator().manual_seed(2)) * 3
    native_g, native_c = greedy(x), top_candidates(x, 50)
    monkeypatch.setenv("SGLPY_DISABLE_CPU_KERNELS", "1")
    assert select_lib(x) is None
    assert torch.equal(greedy(x), native_g)
    ref = top_candidates(x, 50)
    assert torch.equal(ref[0], native_c[0]) and torch.equal(ref[1], native_c[1])  # no ties in random rows


def test_sample_rows_equals_the_torch_ops_bit_for_bit(lib):
    g = torch.Generator().manual_seed(5)
    for trial in range(400):
        n, k = int(torch.randint(1, 70, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g))
        vals = (torch.randn(n, k, generator=g) * (0.3, 1.0, 3.0, 10.0)[trial % 4]).sort(dim=-1, descending=True).values
        if trial % 7 == 0:
            vals = vals.round()  # ties
        if trial % 5 == 0:
            vals[:, k // 2:] = float("-inf")  # cut by top-k: weight 0
        scaled = vals / (torch.rand(n, generator=g) + 0.05)[:, None]
        w = torch.exp(scaled - scaled[:, :1])
        top_p = (torch.where(torch.rand(n, generator=g) < 0.2, torch.ones(n), torch.rand(n, generator=g))
                 if trial % 3 else None)
        min_p = torch.rand(n, generator=g) * 0.3 if trial % 2 else None
        u = torch.rand(n, generator=g)
        u[0] = 0.0 if trial % 11 == 0 else u[0]
        assert torch.equal(sample_rows(lib, w, top_p, min_p, u), sample_rows_reference(w, top_p, min_p, u)), trial
    # tiny weights after a 1.0: a float running sum would lose them all, torch's (double) does not
    w = torch.cat([torch.ones(2, 1), torch.full((2, 99), 3e-8)], dim=1)
    u, top_p = torch.tensor([0.9999995, 0.5]), torch.tensor([1.0, 0.9999999])
    want = sample_rows_reference(w, top_p, None, u)
    assert int(want[0]) > 0 and torch.equal(sample_rows(lib, w, top_p, None, u), want)
    w[0, 0] = float("nan")
    assert sample_rows(lib, w, top_p, None, u) is None  # declined: the caller runs the reference
    assert sample_rows(lib, w.t().contiguous().t(), None, None, u) is None  # not contiguous

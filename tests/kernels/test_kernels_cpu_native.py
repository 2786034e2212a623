"""Native CPU kernels (kernels/cpu_native.py, kernels/csrc/): the build, its fallbacks, and each kernel against its
torch reference."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch
from hypothesis import given, settings, strategies as st

from sglpy.kernels import cpu_native
from sglpy.kernels.cpu_native import DISABLE_ENV, build_native, find_compiler, native_lib
from sglpy.kernels.decode_attention import decode_attention, decode_attention_reference
from sglpy.kernels.decode_attention_cpu import decode_attention_cpu, supports
from sglpy.kernels.decode_plan import decode_attention_planned, plan_decode_attention
from sglpy.runtime.testing.kernel_cases import make_paged_batch

needs_native = pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler on this machine")


@pytest.fixture(scope="module")
def lib():
    built = native_lib()
    assert built is not None, cpu_native.native_status()
    return built


@needs_native
def test_builds_where_a_compiler_exists_and_says_what_it_built():
    assert native_lib() is not None
    assert cpu_native.native_status().startswith("native: ")


@needs_native
def test_one_openmp_runtime_in_the_process():
    """The library binds to torch's libgomp: a second copy would mean a second worker pool per thread."""
    code = ("import torch; from sglpy.kernels.cpu_native import native_lib, loaded_libgomp, torch_openmp_is_libgomp\n"
            "torch.ones(512, 512).sum(); assert native_lib() is not None\n"
            "print(torch_openmp_is_libgomp(), len(loaded_libgomp()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    uses_gomp, copies = out.stdout.split()
    if uses_gomp == "True":
        assert copies == "1"


def test_no_compiler_is_a_reason_not_an_error(tmp_path):
    built = build_native(None, tmp_path)
    assert built.lib is None and "no C++ compiler" in built.detail
    built = build_native(str(tmp_path / "missing-g++"), tmp_path)
    assert built.lib is None and "does not run" in built.detail


def test_a_failing_compiler_is_reported_with_its_output(tmp_path):
    fake = tmp_path / "bad-cxx"
    fake.write_text("#!/bin/sh\nif [ \"$1\" = --version ]; then echo bad 1.0; exit 0; fi\necho 'boom: no luck' >&2\n"
                    "exit 1\n")
    fake.chmod(0o755)
    built = build_native(str(fake), tmp_path / "cache")
    assert built.lib is None and "building the CPU kernels failed" in built.detail and "boom" in built.detail
    assert not list((tmp_path / "cache").glob("*.so*"))  # no half-written library left behind


@needs_native
def test_the_library_is_built_once_and_reused(tmp_path):
    first = build_native(find_compiler(), tmp_path)
    assert first.lib is not None
    files = list(tmp_path.glob("*.so"))
    assert len(files) == 1
    mtime = files[0].stat().st_mtime_ns
    again = build_native(find_compiler(), tmp_path)
    assert again.lib is not None and files[0].stat().st_mtime_ns == mtime


def test_disable_env_selects_the_reference(monkeypatch):
    monkeypatch.setenv(DISABLE_ENV, "1")
    assert native_lib() is None
    assert cpu_native.native_status().startswith("torch reference: ")
    pb = make_paged_batch([5, 9], 2, 16, torch.float32)
    plan = plan_decode_attention(pb.req_to_token, pb.req_pool_indices, torch.tensor([5, 9]))
    assert plan.native is None


# ---------------------------------------------------------------- decode attention


def _check(lib, lens, heads, kv_heads, d, dtype, q_dtype=torch.float32, seed=0):
    pb = make_paged_batch(lens, kv_heads, d, dtype, seed=seed)
    q = torch.randn(len(lens), heads, d, generator=torch.Generator().manual_seed(seed + 1)).to(q_dtype)
    sl = torch.tensor(lens)
    assert supports(q, pb.k_cache, pb.v_cache, pb.req_to_token)
    got = decode_attention_cpu(lib, q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, sl, d ** -0.5)
    want = decode_attention_reference(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, sl, d ** -0.5)
    assert got.dtype == q.dtype and got.shape == q.shape
    tol = 1e-5 if q_dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 8, 128), (4, 1, 16), (6, 2, 80), (2, 1, 256)])
def test_decode_attention_matches_the_reference(lib, dtype, heads, kv_heads, d):
    _check(lib, [1, 63, 64, 65, 200, 7], heads, kv_heads, d, dtype)


@needs_native
@pytest.mark.parametrize("lens", [[1], [3000], [5000, 2], [700, 900, 1100]])
def test_few_long_requests_split_into_chunks_and_merge(lib, lens):
    """Fewer requests than 4 x threads: each is split into key chunks (flash-decoding) and merged."""
    _check(lib, lens, 9, 3, 64, torch.float32)
    _check(lib, lens, 9, 3, 64, torch.bfloat16, seed=1)


@needs_native
def test_bf16_queries_come_back_bf16(lib):
    _check(lib, [10, 40], 4, 2, 32, torch.bfloat16, q_dtype=torch.bfloat16)


@needs_native
@settings(max_examples=40, deadline=None)
@given(lens=st.lists(st.integers(1, 300), min_size=1, max_size=12), kv_heads=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 2, 3, 4]), d=st.sampled_from([16, 32, 64, 128]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16, torch.float16]), seed=st.integers(0, 1000))
def test_decode_attention_property(lens, kv_heads, group, d, dtype, seed):
    _check(native_lib(), lens, kv_heads * group, kv_heads, d, dtype, seed=seed)


@needs_native
def test_decode_attention_agrees_with_fp64_on_extreme_scores(lib):
    """Large logits: the online softmax's rescaling (and exp of very negative numbers) keeps full precision."""
    from sglpy.runtime.testing.kernel_cases import naive_attention

    pb = make_paged_batch([150], 1, 16, torch.float32, seed=3)
    pb.k_cache.mul_(30.0)
    q = torch.randn(1, 2, 16) * 3
    got = decode_attention_cpu(lib, q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices,
                               torch.tensor([150]), 0.25)
    slots = pb.req_to_token[pb.req_pool_indices[0], :150].long()
    want = naive_attention(q, pb.k_cache[slots], pb.v_cache[slots], [150], 0.25)
    torch.testing.assert_close(got.double(), want, atol=1e-5, rtol=1e-5)


@needs_native
def test_bad_metadata_raises_naming_the_request_and_reads_nothing_out_of_bounds(lib):
    pb = make_paged_batch([5, 9], 2, 16, torch.float32)
    q = torch.randn(2, 4, 16)
    rows = pb.req_pool_indices
    args = (pb.k_cache, pb.v_cache)
    with pytest.raises(ValueError, match=r"seq_lens\[1\] = 0 must lie in \[1, "):
        decode_attention_cpu(lib, q, *args, pb.req_to_token, rows, torch.tensor([5, 0]), 0.25)
    with pytest.raises(ValueError, match=r"seq_lens\[0\] = 99 must lie"):
        decode_attention_cpu(lib, q, *args, pb.req_to_token, rows, torch.tensor([99, 9]), 0.25)
    with pytest.raises(ValueError, match=r"req_pool_indices\[1\] = 40 must lie in \[0, 4\)"):
        decode_attention_cpu(lib, q, *args, pb.req_to_token, torch.tensor([int(rows[0]), 40]), torch.tensor([5, 9]),
                             0.25)
    r2t = pb.req_to_token.clone()
    r2t[rows[1], 4] = 10 ** 6  # a slot far past the pool
    with pytest.raises(ValueError, match=r"request 1 \(row \d+\) has a slot id outside \[0, \d+\)"):
        decode_attention_cpu(lib, q, *args, r2t, rows, torch.tensor([5, 9]), 0.25)
    r2t[rows[1], 4] = -3
    with pytest.raises(ValueError, match="request 1"):
        decode_attention(q, *args, r2t, rows, torch.tensor([5, 9]), 0.25)


@needs_native
def test_unreadable_layouts_fall_back_to_the_reference(lib):
    pb = make_paged_batch([5, 9], 2, 24, torch.float32)  # head_dim 24: not a multiple of 16
    q = torch.randn(2, 4, 24)
    assert not supports(q, pb.k_cache, pb.v_cache, pb.req_to_token)
    sl = torch.tensor([5, 9])
    plan = plan_decode_attention(pb.req_to_token, pb.req_pool_indices, sl)
    got = decode_attention_planned(q, pb.k_cache, pb.v_cache, plan, 0.2)
    want = decode_attention_reference(q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, sl, 0.2)
    torch.testing.assert_close(got, want)
    assert not supports(q, pb.k_cache, pb.v_cache, pb.req_to_token.long())  # int64 table


@needs_native
def test_planned_native_path_equals_the_torch_path(lib, monkeypatch):
    pb = make_paged_batch([33, 1, 17, 250], 3, 64, torch.bfloat16, seed=5)
    q = torch.randn(4, 9, 64)
    sl = torch.tensor([33, 1, 17, 250])
    plan = plan_decode_attention(pb.req_to_token, pb.req_pool_indices, sl)
    assert plan.native is not None and not plan.views and not plan.groups
    got = decode_attention_planned(q, pb.k_cache, pb.v_cache, plan, 0.125)
    monkeypatch.setenv(DISABLE_ENV, "1")
    torch_plan = plan_decode_attention(pb.req_to_token, pb.req_pool_indices, sl)
    want = decode_attention_planned(q, pb.k_cache, pb.v_cache, torch_plan, 0.125)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_sources_ship_with_the_package():
    csrc = pathlib.Path(cpu_native.__file__).with_name("csrc")
    names = {p.name for p in csrc.iterdir()}
    assert {"cpu_common.h", "decode_attention.cpp"} <= names
    for name in cpu_native.SIGNATURES:  # every declared entry point exists in some source
        assert any(name in p.read_text() for p in csrc.glob("*.cpp")), name

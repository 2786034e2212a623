"""Native CPU kernels (kernels/cpu_native.py, kernels/csrc/): the build, its fallbacks, and each kernel against its
torch reference."""

from __future__ import annotations

import pathlib
import shutil
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
from sglpy.kernels.quant_linear import quant_linear_reference
from sglpy.runtime.testing.kernel_cases import make_paged_batch

_DISABLED = __import__("os").environ.get(DISABLE_ENV, "") not in ("", "0")
needs_native = pytest.mark.skipif(find_compiler() is None or _DISABLED,
                                  reason=f"no C++ compiler on this machine, or {DISABLE_ENV} is set")


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


# ---------------------------------------------------------------- weight-only GEMV


@needs_native
@settings(max_examples=30, deadline=None)
@given(kind=st.sampled_from(["int8", "int4"]), n=st.integers(1, 70), groups=st.integers(1, 6), rows=st.integers(1, 20),
       with_bias=st.booleans(), seed=st.integers(0, 1000))
def test_gemv_matches_the_reference(kind, n, groups, rows, with_bias, seed):
    """Any N (no 16-row interleave), K a multiple of 32, M over eight rows (several passes over the weights)."""
    from sglpy.kernels.quant_linear import pack_linear
    from sglpy.kernels.quant_linear_cpu import quant_linear_cpu

    g = torch.Generator().manual_seed(seed)
    k = 32 * groups
    w = torch.randn(n, k, generator=g) * 0.05
    bias = torch.randn(n, generator=g) if with_bias else None
    p = pack_linear(w, bias, kind, 32, native=True)
    x = torch.randn(rows, k, generator=g)
    got = quant_linear_cpu(native_lib(), x, p.kind, p.qweight, p.scales, p.bias, p.out_features)
    assert_gemv_close(native_lib(), got, x, p)


def assert_gemv_close(lib, got: torch.Tensor, x: torch.Tensor, p) -> None:
    """The native GEMV's output within native_error_bound of the reference."""
    from sglpy.kernels.quant_linear import dequantize
    from sglpy.kernels.quant_linear_cpu import native_error_bound

    want = quant_linear_reference(x, p)
    err = (got - want).abs()
    tol = native_error_bound(lib, x, dequantize(p), p.kind == "int8")
    assert got.shape == want.shape and bool((err <= tol).all()), f"max excess {(err - tol).max().item():.3g}"


# ---------------------------------------------------------------- decode glue: rmsnorm, rotary + store, silu * up


def _rope_plan(positions, head_dim, max_pos=512):
    from sglpy.kernels.rotary import build_rope_cache, plan_rotary

    return plan_rotary(torch.tensor(positions), build_rope_cache(head_dim, max_pos, 10000.0))


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d,rows", [(9, 3, 64, 1), (4, 4, 32, 11), (8, 2, 128, 3)])
def test_rotate_and_store_matches_the_torch_path(kv_dtype, heads, kv_heads, d, rows):
    from sglpy.kernels.rotary_store import rotate_and_store, rotate_and_store_reference

    g = torch.Generator().manual_seed(rows)
    width = (heads + 2 * kv_heads) * d
    qkv = torch.randn(rows, width, generator=g)
    positions = torch.randint(0, 500, (rows,), generator=g).tolist()
    plan = _rope_plan(positions, d)
    loc = torch.randperm(40, generator=g)[:rows]
    caches = [torch.zeros(40, kv_heads, d, dtype=kv_dtype) for _ in range(4)]
    q_native = rotate_and_store(qkv.clone(), heads, kv_heads, d, plan, caches[0], caches[1], loc)
    q_torch = rotate_and_store_reference(qkv.clone(), heads, kv_heads, d, plan, caches[2], caches[3], loc)
    assert q_native.shape == (rows, heads, d)
    torch.testing.assert_close(q_native, q_torch, rtol=1e-6, atol=1e-6)
    tol = 1e-6 if kv_dtype == torch.float32 else 1e-2  # a product fused or not can move a 16-bit rounding
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=tol, atol=tol)
    torch.testing.assert_close(caches[1].float(), caches[3].float(), rtol=tol, atol=tol)
    untouched = torch.ones(40, dtype=torch.bool)
    untouched[loc] = False
    assert caches[0][untouched].abs().sum() == 0 and caches[1][untouched].abs().sum() == 0


@needs_native
@pytest.mark.parametrize("kv_dtype", [torch.bfloat16, torch.float16])
def test_pool_stores_round_exactly_as_torch(kv_dtype):
    """At position 0 the rotary is the identity on finite values (inf * sin 0 is nan in both paths), so the stored
    elements must equal torch's .to() bit for bit: round to nearest even, overflow to inf, subnormals."""
    from sglpy.kernels.rotary_store import rotate_and_store

    d, rows = 32, 12
    special = torch.tensor([0.0, 1e-40, 65504.0, 65520.0, 1e6, -1e6, 3.0e38, -3.0e38, 1.00390625, 1.01171875,
                            6.0e-8, 3.0e-8, -2.0e-5])
    n = rows * 2 * d - len(special)
    g = torch.Generator().manual_seed(0)
    vals = torch.cat([special, torch.randn(n, generator=g) * 10.0 ** torch.randint(-9, 6, (n,), generator=g).float()])
    qkv = torch.zeros(rows, 3 * d)  # one q head, one kv head
    qkv[:, d:] = vals[: rows * 2 * d].reshape(rows, 2 * d)
    k_cache, v_cache = torch.zeros(rows, 1, d, dtype=kv_dtype), torch.zeros(rows, 1, d, dtype=kv_dtype)
    rotate_and_store(qkv, 1, 1, d, _rope_plan([0] * rows, d), k_cache, v_cache, torch.arange(rows))
    want = qkv[:, d:].to(kv_dtype).reshape(rows, 2, 1, d)
    assert torch.equal(k_cache.view(torch.int16), want[:, 0].contiguous().view(torch.int16))
    assert torch.equal(v_cache.view(torch.int16), want[:, 1].contiguous().view(torch.int16))


@needs_native
def test_rotate_and_store_rejects_bad_rows_before_writing():
    from sglpy.kernels.decode_glue_cpu import rotate_and_store_cpu
    from sglpy.kernels.rotary import build_rope_cache

    qkv = torch.randn(3, 3 * 16)
    k_cache, v_cache = torch.zeros(8, 1, 16), torch.zeros(8, 1, 16)
    cache = build_rope_cache(16, 64)
    with pytest.raises(ValueError, match=r"out_cache_loc\[2\] = 8 is not a slot of the pool \[0, 8\)"):
        rotate_and_store_cpu(native_lib(), qkv, 1, 1, 16, torch.tensor([0, 1, 2]), cache, k_cache, v_cache,
                             torch.tensor([0, 1, 8]))
    with pytest.raises(ValueError, match=r"positions\[1\] = 64 must lie in \[0, 64\)"):
        rotate_and_store_cpu(native_lib(), qkv, 1, 1, 16, torch.tensor([0, 64, 2]), cache, k_cache, v_cache,
                             torch.tensor([0, 1, 2]))
    assert k_cache.abs().sum() == 0 and v_cache.abs().sum() == 0


@needs_native
@pytest.mark.parametrize("rows", [1, 5, 40])
def test_silu_and_mul_matches_torch(rows):
    from sglpy.kernels.activation import silu_and_mul, silu_and_mul_reference

    gu = torch.randn(rows, 2 * 96) * 4
    gu[0, :6] = torch.tensor([0.0, -100.0, 100.0, -88.5, 88.5, 1e-30])
    torch.testing.assert_close(silu_and_mul(gu), silu_and_mul_reference(gu), rtol=1e-6, atol=1e-6)
    with pytest.raises(ValueError, match="must be even"):
        silu_and_mul(torch.randn(2, 7))


@needs_native
@pytest.mark.parametrize("rows", [1, 3, 33])
def test_rmsnorm_rows_in_parallel_match_the_reference(rows, monkeypatch):
    from sglpy.kernels.rmsnorm import rmsnorm, rmsnorm_reference

    x, res, w = torch.randn(rows, 576), torch.randn(rows, 576), torch.randn(576)
    for residual in (None, res):
        got = rmsnorm(x, w, 1e-6, residual)
        want = rmsnorm_reference(x, w, 1e-6, residual)
        torch.testing.assert_close(got.out, want.out, rtol=2e-6, atol=2e-6)
        assert torch.equal(got.residual, want.residual)


@needs_native
@pytest.mark.parametrize("isa", ["avx512", "avx2", "baseline", "neon"])
def test_every_isa_level_this_cpu_runs_matches_the_references(isa):
    """Each instruction-set level's build (kernels/cpu_isa.py; on this box forced, as SGLPY_CPU_ISA does): every
    kernel against its reference: the widening loads' portable branch, the int8-activation GEMV, the float one."""
    from sglpy.kernels.activation import silu_and_mul_reference
    from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels
    from sglpy.kernels.decode_glue_cpu import rmsnorm_cpu, rotate_and_store_cpu, silu_and_mul_cpu
    from sglpy.kernels.quant_linear import pack_linear
    from sglpy.kernels.quant_linear_cpu import quant_linear_cpu
    from sglpy.kernels.rmsnorm import rmsnorm_reference
    from sglpy.kernels.rotary_store import rotate_and_store_reference

    if isa not in runnable_levels(read_cpu_flags()):
        pytest.skip(f"this CPU does not run the {isa} level")
    built = build_native(find_compiler(), cpu_native.cache_dir(), isa=isa)  # shared with SGLPY_CPU_ISA runs
    assert built.lib is not None and built.isa == isa, built.detail
    lib = built.lib
    # int8 activations at every x86 level (SSE2's pmaddwd at baseline) and on ARM with dotprod; float32 elsewhere
    assert lib.sglpy_gemv_int8_activations() == ("-march=x86-64" in built.detail or "+dotprod" in built.detail)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        _check(lib, [1, 70, 300], 9, 3, 64, dtype)
        _check(lib, [2000], 4, 2, 48, dtype)  # split into chunks; head_dim 48: the runtime-width path
        _check_extend(lib, [0, 70], [100, 3], 9, 3, 64, dtype)
        _check_extend(lib, [10], [90], 4, 2, 48, dtype)
    g = torch.Generator().manual_seed(3)
    for kind, (n, k) in [("int8", (40, 96)), ("int8", (33, 80)), ("int4", (40, 96)), ("int4", (70, 576))]:
        p = pack_linear(torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g), kind, 32, native=True)
        for rows in (1, 3, 11):
            x = torch.randn(rows, k, generator=g)
            y = quant_linear_cpu(lib, x, p.kind, p.qweight, p.scales, p.bias, n)
            assert_gemv_close(lib, y, x, p)
            for i in (0, rows - 1):  # a row's result never depends on the rows beside it (docs/determinism.md)
                assert torch.equal(y[i:i + 1], quant_linear_cpu(lib, x[i:i + 1], p.kind, p.qweight, p.scales, p.bias,
                                                                n)), (isa, kind, rows, i)
    x, res, w = torch.randn(2, 64), torch.randn(2, 64), torch.randn(64)
    out, stream = rmsnorm_cpu(lib, x, w, 1e-6, res)
    want = rmsnorm_reference(x, w, 1e-6, res)
    torch.testing.assert_close(out, want.out, rtol=2e-6, atol=2e-6)
    for width in (64, 2 * 70):  # I = 70: the vector loop and its scalar tail
        gu = torch.randn(3, width) * 4
        torch.testing.assert_close(silu_and_mul_cpu(lib, gu), silu_and_mul_reference(gu), rtol=1e-6, atol=1e-6)
    qkv = torch.randn(2, 3 * 32)
    plan = _rope_plan([5, 300], 32)
    caches = [torch.zeros(4, 1, 32, dtype=torch.float16) for _ in range(4)]
    ref = rotate_and_store_reference(qkv.clone(), 1, 1, 32, plan, caches[2], caches[3], torch.tensor([3, 1]))
    mine = qkv.clone()
    rotate_and_store_cpu(lib, mine, 1, 1, 32, plan.positions, plan.cos_sin_cache, caches[0], caches[1],
                         torch.tensor([3, 1]))
    torch.testing.assert_close(mine[:, :32].view(2, 1, 32), ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(caches[0].float(), caches[2].float(), rtol=1e-2, atol=1e-2)


@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler on this machine")
def test_avx512_and_avx2_gemvs_give_the_same_bits():
    """Both x86 int8-activation levels compute the same integer block dot products against int4 codes (vpdpbusd, or
    vpmaddubsw + vpmaddwd) and the same float steps after them: equal outputs (the int4 tail rows past the last tile
    of 8 sum their zero-point terms at the level's vector width, so they are equal only below 8 groups, as here).
    With AVX-512 VNNI the avx512 level runs pairs of tiles 16 lanes wide (N = 48: three pairs; 45 (int8, int4):
    two pairs, an 8-lane tile and a 5-channel tail), so this also checks those against the 8-lane tiles.
    Against int8 weights they are equal where both quantize activations alike (avx2 with AVX-VNNI); avx2 without it
    quantizes them to 7 bits (q8_dot.h: S8_QMAX), and each level stays within its own bound of the reference."""
    from sglpy.kernels.quant_linear import dequantize
    from sglpy.kernels.quant_linear_cpu import native_error_bound
    from sglpy.kernels.cpu_isa import read_cpu_flags, runnable_levels
    from sglpy.kernels.quant_linear import pack_linear
    from sglpy.kernels.quant_linear_cpu import quant_linear_cpu

    if not {"avx512", "avx2"} <= set(runnable_levels(read_cpu_flags())):
        pytest.skip("this CPU does not run both the avx512 and the avx2 level")
    libs = [build_native(find_compiler(), cpu_native.cache_dir(), isa=lv).lib for lv in ("avx512", "avx2")]
    g = torch.Generator().manual_seed(5)
    for kind, (n, k) in [("int8", (45, 80)), ("int4", (48, 576)), ("int4", (45, 96))]:
        p = pack_linear(torch.randn(n, k, generator=g) * 0.05, torch.randn(n, generator=g), kind, 32, native=True)
        x = torch.randn(9, k, generator=g)
        a, b = (quant_linear_cpu(lib, x, p.kind, p.qweight, p.scales, p.bias, n) for lib in libs)
        if kind == "int8" and libs[1].sglpy_gemv_int8_weight_act_max() != libs[0].sglpy_gemv_int8_weight_act_max():
            want = quant_linear_reference(x, p)
            for lib, got in zip(libs, (a, b)):
                assert bool(((got - want).abs() <= native_error_bound(lib, x, dequantize(p), True)).all())
            assert not torch.equal(a, b)  # 7-bit activations at avx2: a test that they are really in use
            continue
        assert torch.equal(a, b), (kind, (a - b).abs().max().item())


@needs_native
def test_wrappers_refuse_shapes_the_kernels_would_read_past():
    from sglpy.kernels.quant_linear import pack_linear
    from sglpy.kernels.quant_linear_cpu import quant_linear_cpu
    from sglpy.kernels.rotary_store import rotate_and_store

    for kind in ("int8", "int4"):
        p = pack_linear(torch.randn(16, 64), None, kind, 32, native=True)
        with pytest.raises(ValueError, match="x dim 1 \\(in_features\\) must be 64, got 96"):
            quant_linear_cpu(native_lib(), torch.randn(2, 96), p.kind, p.qweight, p.scales, p.bias, 16)
    caches = torch.zeros(8, 1, 16), torch.zeros(8, 1, 16)
    with pytest.raises(ValueError, match="positions length"):
        rotate_and_store(torch.randn(3, 48), 1, 1, 16, _rope_plan([0, 1], 16), *caches, torch.tensor([0, 1, 2]))


# ---------------------------------------------------------------- extend (prefill) attention


def _check_extend(lib, prefix, ext, heads, kv_heads, d, dtype, seed=0, strided=False):
    from sglpy.kernels.extend_attention import extend_attention_reference
    from sglpy.kernels.extend_attention_cpu import extend_attention_cpu

    pb = make_paged_batch([p + e for p, e in zip(prefix, ext)], kv_heads, d, dtype, seed=seed)
    n = sum(ext)
    g = torch.Generator().manual_seed(seed + 7)
    if strided:  # q as the fused qkv projection's view: rows (heads + 2 kv_heads) * d apart
        q = torch.randn(n, (heads + 2 * kv_heads) * d, generator=g)[:, : heads * d].view(n, heads, d)
    else:
        q = torch.randn(n, heads, d, generator=g)
    args = (q, pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices, torch.tensor(prefix),
            torch.tensor(ext), d ** -0.5)
    got = extend_attention_cpu(lib, *args)
    torch.testing.assert_close(got, extend_attention_reference(*args), rtol=2e-5, atol=2e-5)


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (8, 2, 128), (4, 4, 32), (6, 1, 80)])
def test_extend_attention_matches_the_reference(lib, dtype, heads, kv_heads, d):
    # prefixes and extends across the 64-query and 64-key block edges, a zero-length extend, a lone token
    _check_extend(lib, [0, 5, 130, 63, 0, 7], [70, 64, 1, 65, 0, 129], heads, kv_heads, d, dtype)


@needs_native
def test_extend_attention_reads_q_in_place_from_a_fused_projection(lib):
    _check_extend(lib, [0, 40], [33, 100], 9, 3, 64, torch.float32, strided=True)


@needs_native
@settings(max_examples=30, deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(0, 200), st.integers(0, 150)), min_size=1, max_size=6),
       kv_heads=st.sampled_from([1, 2, 3]), group=st.sampled_from([1, 2, 3, 4]), d=st.sampled_from([16, 64, 128]),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), seed=st.integers(0, 1000))
def test_extend_attention_property(pairs, kv_heads, group, d, dtype, seed):
    pairs = [(p, e) for p, e in pairs if p + e > 0] or [(0, 1)]
    _check_extend(native_lib(), [p for p, _ in pairs], [e for _, e in pairs], kv_heads * group, kv_heads, d, dtype,
                  seed=seed)


@needs_native
def test_extend_attention_rejects_bad_metadata(lib):
    from sglpy.kernels.extend_attention_cpu import extend_attention_cpu

    pb = make_paged_batch([10, 20], 1, 16, torch.float32)
    q = torch.randn(12, 2, 16)
    rows = pb.req_pool_indices
    args = (pb.k_cache, pb.v_cache)
    with pytest.raises(ValueError, match=r"sum\(extend_lens\) \(11\) must equal q.shape\[0\] \(12\)"):
        extend_attention_cpu(lib, q, *args, pb.req_to_token, rows, torch.tensor([5, 14]), torch.tensor([5, 6]), 0.3)
    with pytest.raises(ValueError, match=r"prefix_lens\[1\] \+ extend_lens\[1\] = 20 \+ 6 must lie in \[0, 23\]"):
        extend_attention_cpu(lib, q, *args, pb.req_to_token, rows, torch.tensor([4, 20]), torch.tensor([6, 6]), 0.3)
    r2t = pb.req_to_token.clone()
    r2t[rows[0], 2] = 10 ** 7
    with pytest.raises(ValueError, match=r"request 0 \(row \d+\) has a slot id outside"):
        extend_attention_cpu(lib, q, *args, r2t, rows, torch.tensor([4, 14]), torch.tensor([6, 6]), 0.3)


@needs_native
def test_a_library_that_fails_its_self_test_is_not_installed(tmp_path, monkeypatch):
    """A library that would crash the engine (here: a self-test that dies by a signal, as on SIGILL) is refused."""
    assert cpu_native.self_test(native_lib()._name) is None  # the library this process runs passes it
    monkeypatch.setattr(cpu_native, "_SELF_TEST", "import os, signal; os.kill(os.getpid(), signal.SIGILL)")
    # the compile itself is tested above (built once and reused): here it yields the library this process runs
    monkeypatch.setattr(cpu_native, "_compile_and_link",
                        lambda cxx, flags, sources, out: shutil.copyfile(native_lib()._name, out) and None)
    built = build_native(find_compiler(), tmp_path)
    assert built.lib is None and "self-test" in built.detail and f"signal {4}" in built.detail
    assert not list(tmp_path.glob("*.so*"))

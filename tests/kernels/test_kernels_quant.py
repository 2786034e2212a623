"""Weight-only quantized linear kernels against their float32 oracle; packing, dequantization and checks."""

from __future__ import annotations

import pytest
import torch

from sglpy.kernels.cpu_native import find_compiler
from sglpy.kernels.quant_linear import (
    NATIVE_MAX_ROWS,
    PACKED_MAX_ROWS,
    PackedLinear,
    dequantize,
    dequantize_int4,
    pack_linear,
    quant_linear,
    quant_linear_reference,
    quantize_int4,
    quantize_int8,
)


# the native CPU kernels' layout where a compiler can build them, torch's packed layout everywhere
LAYOUTS = [False] + ([True] if find_compiler() is not None else [])


def _weight(n=48, k=96, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, k, generator=g) * 0.05


def test_int8_round_trip_error_is_at_most_half_a_step():
    w = _weight()
    q, scale = quantize_int8(w)
    assert q.dtype == torch.int8 and scale.dtype == torch.bfloat16 and scale.shape == (48,)
    err = (q.float() * scale.float()[:, None] - w).abs()
    # half a step, plus the clipping of a row maximum when its bf16 scale rounded down (< 1% of a step more)
    assert bool((err <= scale.float()[:, None] * 0.51).all())


def test_int4_recovers_weights_already_on_a_q4_1_grid():
    """A GGUF Q4_1-style block (16 levels from the group minimum, bf16 scale/min) comes back exactly."""
    n, k, g = 32, 64, 32
    gen = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (n, k // g, g), generator=gen)
    codes[..., 0], codes[..., 1] = 0, 15  # every group spans the full grid, as a Q4_1 block does
    scale = (torch.rand(n, k // g, 1, generator=gen) * 0.01 + 0.001).bfloat16().float()
    low = (torch.randn(n, k // g, 1, generator=gen) * 0.05).bfloat16().float()
    w = (codes * scale + low).reshape(n, k)
    got_codes, sz = quantize_int4(w, g)
    deq = dequantize_int4(got_codes, sz, g)
    # the kernel's zero point (low + 8 * scale) is a bf16: the grid may shift by half a bf16 ulp of it, no more
    zero = (low + 8 * scale).abs().expand(n, k // g, g).reshape(n, k)
    assert bool(((deq - w).abs() <= zero * 2.0**-8 + 1e-7).all())  # half an ulp (8 mantissa bits)
    assert torch.equal(got_codes.reshape(n, k // g, g), codes.to(torch.int32))


@pytest.mark.parametrize("native", LAYOUTS)
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dense", [torch.float32, torch.bfloat16])
def test_dequantize_matches_the_dense_copy_and_the_codes(kind, dense, native):
    w = _weight()
    p = pack_linear(w, None, kind, 32, dense=dense, native=native)
    assert p.native == native
    deq = dequantize(p)
    assert deq.shape == w.shape and deq.dtype == torch.float32
    assert p.dense.dtype == dense and torch.equal(deq.to(dense), p.dense)
    if kind == "int4":
        codes, sz = quantize_int4(w, 32)
        assert torch.equal(deq, dequantize_int4(codes, sz, 32))
    step = (w.abs().amax(1, keepdim=True) / 127) if kind == "int8" else (w.amax(1, keepdim=True) - w.amin(1, keepdim=True)) / 15
    assert bool(((deq - w).abs() <= step * 0.6).all())


@pytest.mark.parametrize("native", LAYOUTS)
@pytest.mark.parametrize("kind", ["int8", "int4"])
@pytest.mark.parametrize("dense", [None, torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 13, 21])
@pytest.mark.parametrize("with_bias", [False, True])
def test_quant_linear_matches_reference(kind, dense, rows, with_bias, native):
    w = _weight(seed=rows)
    bias = torch.randn(48) if with_bias else None
    p = pack_linear(w, bias, kind, 32, dense=dense, native=native)
    x = torch.randn(rows, 96)
    got = quant_linear(x, p)
    assert got.shape == (rows, 48) and got.dtype == torch.float32
    if native and (dense is None or rows <= NATIVE_MAX_ROWS):
        # the native kernels: the exact dequantized weights, summed in another order, activations float32 or int8
        # per block of 32 (kernels/csrc/q8_dot.h) within the bound the build states
        from sglpy.kernels.cpu_native import native_lib
        from sglpy.kernels.quant_linear import dequantize
        from sglpy.kernels.quant_linear_cpu import native_error_bound

        if native_lib() is None:  # disabled after packing: the reference runs
            torch.testing.assert_close(got, quant_linear_reference(x, p), rtol=1e-5, atol=1e-5)
            return
        err = (got - quant_linear_reference(x, p)).abs()
        assert bool((err <= native_error_bound(native_lib(), x, dequantize(p), p.kind == "int8")).all())
        return
    if dense == torch.float32 and rows > (NATIVE_MAX_ROWS if native else PACKED_MAX_ROWS[torch.float32]):
        # the float32 dense copy: exactly the dequantized weights, float32 activations
        torch.testing.assert_close(got, quant_linear_reference(x, p), rtol=1e-5, atol=1e-5)
        return
    # the kernels read activations as bf16 and return bf16: compare with the oracle on bf16-rounded inputs
    want = quant_linear_reference(x.bfloat16().float(), p)
    tol = 1e-2 * want.abs().max().item()
    torch.testing.assert_close(got, want, rtol=1e-2, atol=tol)


@pytest.mark.skipif(len(LAYOUTS) == 1 or __import__("os").environ.get("SGLPY_DISABLE_CPU_KERNELS", "") not in ("", "0"),
                    reason="no C++ compiler or SGLPY_DISABLE_CPU_KERNELS set: no native kernels")
def test_few_rows_take_the_native_kernel_and_many_rows_the_dense_copy(monkeypatch):
    import sglpy.kernels.quant_linear as ql

    p = pack_linear(_weight(), None, "int4", 32, dense=torch.bfloat16, native=True)
    calls = []
    real_native, real_linear = ql.quant_linear_cpu, ql.F.linear
    monkeypatch.setattr(ql, "quant_linear_cpu", lambda *a: calls.append("native") or real_native(*a))
    monkeypatch.setattr(ql.F, "linear", lambda *a: calls.append("dense") or real_linear(*a))
    for rows in (1, NATIVE_MAX_ROWS, NATIVE_MAX_ROWS + 1, 64):
        quant_linear(torch.randn(rows, 96), p)
    assert calls == ["native", "native", "dense", "dense"]
    calls.clear()
    monkeypatch.setenv("SGLPY_DISABLE_CPU_KERNELS", "1")  # disabled after packing: the reference, still right
    x = torch.randn(3, 96)
    torch.testing.assert_close(quant_linear(x, p), quant_linear_reference(x, p))
    assert calls == []


def test_many_rows_take_the_dense_copy_and_few_rows_the_packed_kernel(monkeypatch):
    import sglpy.kernels.quant_linear as ql

    p = pack_linear(_weight(), None, "int8", 32, dense=torch.float32, native=False)
    calls = []
    real = torch._weight_int8pack_mm
    monkeypatch.setattr(torch, "_weight_int8pack_mm", lambda *a: calls.append("packed") or real(*a))
    real_linear = ql.F.linear
    monkeypatch.setattr(ql.F, "linear", lambda *a: calls.append("dense") or real_linear(*a))
    for rows in (1, PACKED_MAX_ROWS[torch.float32], PACKED_MAX_ROWS[torch.float32] + 1, 64):
        quant_linear(torch.randn(rows, 96), p)
    assert calls == ["packed", "packed", "dense", "dense"]
    with pytest.raises(ValueError, match="dense must be"):
        pack_linear(_weight(), None, "int8", 32, dense=torch.float16)


@pytest.mark.parametrize("native", LAYOUTS)
def test_packed_linear_accounts_bytes_and_rejects_bad_kinds(native):
    p = pack_linear(_weight(), None, "int4", 32, native=native)
    assert p.nbytes == 48 * 96 // 2 + (96 // 32) * 48 * 2 * 2
    with pytest.raises(ValueError, match="kind must be"):
        pack_linear(_weight(), None, "int3")
    with pytest.raises(ValueError, match="kind must be"):
        PackedLinear("fp8", 1, 1, torch.zeros(1), torch.zeros(1), 1)


def test_pack_and_call_reject_bad_shapes():
    with pytest.raises(ValueError, match="multiple of group_size"):
        pack_linear(_weight(k=80), None, "int4", 32, native=False)
    with pytest.raises(ValueError, match="native layout cannot hold int4"):
        pack_linear(_weight(k=80), None, "int4", 32, native=True)
    with pytest.raises(ValueError, match="divisible by 16"):
        pack_linear(_weight(n=40), None, "int4", 32, native=False)
    with pytest.raises(ValueError, match="native layout cannot hold int4"):
        pack_linear(_weight(), None, "int4", 64, native=True)
    with pytest.raises(ValueError, match="group_size must be one of"):
        pack_linear(_weight(), None, "int4", 48)
    p = pack_linear(_weight(), None, "int8")
    with pytest.raises(ValueError, match="x dim 1"):
        quant_linear(torch.randn(2, 95), p)
    with pytest.raises(ValueError, match="x dtype"):
        quant_linear(torch.randn(2, 96).double(), p)
    with pytest.raises(ValueError, match="x must have 2 dims"):
        quant_linear(torch.randn(96), p)
    with pytest.raises(ValueError, match="PackedLinear"):
        quant_linear(torch.randn(2, 96), _weight())

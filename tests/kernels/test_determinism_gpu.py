"""Deterministic inference on a CUDA GPU (skipped without one; docs/determinism.md): Triton decode attention with
fixed split points, Triton extend attention across prefix splits, the zero-padded 64-row GEMM tiles of RowByRowLinear,
and the engine's matrix with the flag (alone vs batched, cached, chunked).

Run: `make gpu-install`, then `$(GPU_ENV) python3 -m pytest -q -p no:cacheprovider -m gpu
tests/kernels/test_determinism_gpu.py` (compiled Triton kernels: TRITON_INTERPRET=0).
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _batch(lens, kv_heads, d, dtype, seed):
    from sglpy.runtime.testing.kernel_cases import make_paged_batch

    pb = make_paged_batch(lens, kv_heads, d, dtype, seed=seed, max_context=max(lens) + 64)
    return [t.cuda() for t in (pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_decode_fixed_splits_batch_invariant(dtype):
    from sglpy.kernels.decode_attention_triton import decode_attention_triton

    lens = [3000, 5, 700, 64, 1, 1500]
    k, v, r2t, rows = _batch(lens, 8, 64, dtype, seed=1)
    q = torch.randn(len(lens), 32, 64, device="cuda").to(dtype)
    sl = torch.tensor(lens, device="cuda")
    batch = decode_attention_triton(q, k, v, r2t, rows, sl, 0.125, batch_invariant=True)
    for i in range(len(lens)):
        alone = decode_attention_triton(q[i:i + 1], k, v, r2t, rows[i:i + 1], sl[i:i + 1], 0.125,
                                        batch_invariant=True)
        assert torch.equal(alone[0], batch[i]), f"request {i} (len {lens[i]}) differs alone vs in the batch"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_triton_extend_same_for_any_prefix_split(dtype):
    from sglpy.kernels.extend_attention import extend_attention

    k, v, r2t, rows = _batch([400, 90], 8, 64, dtype, seed=2)
    q = torch.randn(400, 32, 64, device="cuda").to(dtype)
    t = lambda xs: torch.tensor(xs, device="cuda")  # noqa: E731
    whole = extend_attention(q, k, v, r2t, rows[:1], t([0]), t([400]), 0.125)
    for cut in (1, 37, 64, 100, 399):
        tail = extend_attention(q[cut:], k, v, r2t, rows[:1], t([cut]), t([400 - cut]), 0.125)
        assert torch.equal(tail, whole[cut:]), f"a prefix of {cut} tokens changed the result"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tiled_linear_rows_independent_of_row_count(dtype):
    from sglpy.runtime.model.quantization import RowByRowLinear

    lin = torch.nn.Linear(2048, 8192, bias=False).to("cuda", dtype)
    tiled = RowByRowLinear(lin)
    x = torch.randn(200, 2048, device="cuda").to(dtype)
    with torch.inference_mode():
        full = tiled(x)
        for m in (1, 5, 63, 64, 65, 130):
            assert torch.equal(tiled(x[:m]), full[:m]), f"rows of an M={m} call differ"
        perm = torch.randperm(200, device="cuda")
        assert torch.equal(tiled(x[perm]), full[perm])
        plain = [lin(x[:m])[0] for m in (1, 8, 64, 200)]
    print(f"plain cuBLAS {dtype}: row 0 equal across M=1/8/64/200: {all(torch.equal(plain[0], p) for p in plain)}")


@pytest.fixture(scope="module")
def model_path(tmp_path_factory):
    from sglpy.runtime.testing.tiny_model import make_preset_model

    return make_preset_model(tmp_path_factory.mktemp("det-gpu") / "llama-1b-2l", "llama-1b", num_layers=2)


def test_engine_refuses_the_flag_in_float32_on_cuda(model_path):
    """float32 on CUDA: the H100 matrix gave 2 of 6 seeded requests another token batched than alone."""
    from sglpy.runtime.engine import Engine

    with pytest.raises(ValueError, match="holds in bfloat16 and float16, not in float32"):
        Engine(model_path, dtype="float32", enable_deterministic_inference=True, max_total_tokens=8192)


@pytest.mark.parametrize("dtype", ["bfloat16"])
def test_engine_matrix_cuda(model_path, dtype):
    """6 seeded sampled + 6 greedy requests, each alone vs together, over a cached prefix, chunked 64 (alone and
    together), chunked without the radix cache: ids and logprobs bit-equal (benchmarks/cuda_determinism_probe.py)."""
    import pathlib
    import sys

    sys.path.insert(0, str(pathlib.Path(__file__).parents[2] / "benchmarks"))
    try:
        from cuda_determinism_probe import matrix
    finally:
        sys.path.pop(0)
    report = matrix(model_path, dtype, {})
    bad = {name: [i for i, (ids, first) in enumerate(rows) if not ids or first is not None]
           for name, rows in report.items()}
    print(f"{dtype}: requests that differ from their lone run: {bad}")
    assert not any(bad.values()), bad

"""Compiled Triton kernels on a real CUDA GPU at realistic sizes (skipped without one).

@triton.jit picks interpreter or compiler once per process, and tests/conftest.py turns the interpreter on, so
`test_gpu_suite_compiled` re-runs this file in a child with TRITON_INTERPRET=0; the other tests run only there.
Direct run: TRITON_INTERPRET=0 python -m pytest -m gpu tests/test_kernels_gpu.py
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
import torch

from sglpy.runtime.testing.kernel_cases import make_paged_batch

HAS_CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]
compiled_only = pytest.mark.skipif(INTERPRETED, reason="runs in the TRITON_INTERPRET=0 child")

TOL = {torch.float32: 2e-4, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.skipif(not INTERPRETED, reason="this is the child run already")
def test_gpu_suite_compiled():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


def _close(got, want):
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[want.dtype], rtol=TOL[want.dtype])


def _paged(kv_lens, kv_heads, head_dim, dtype, seed=0):
    pb = make_paged_batch(kv_lens, kv_heads, head_dim, dtype, seed=seed)
    return [t.cuda() for t in (pb.k_cache, pb.v_cache, pb.req_to_token, pb.req_pool_indices)]


@compiled_only
def test_kernels_are_compiled_not_interpreted():
    from triton.runtime.jit import JITFunction

    from sglpy.kernels import _dispatch

    mod = _dispatch.triton_module("decode_attention_triton", torch.zeros(1, device="cuda"))
    assert mod is not None and isinstance(mod._decode_split_kernel, JITFunction)


@compiled_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (32, 8, 128), (32, 32, 128)])
def test_decode_attention_gpu(dtype, heads, kv_heads, head_dim):
    from sglpy.kernels import decode_attention, decode_attention_reference

    g = torch.Generator().manual_seed(0)
    kv_lens = torch.randint(1, 4097, (48,), generator=g).tolist() + [1, 4096]
    kc, vc, r2t, rpi = _paged(kv_lens, kv_heads, head_dim, dtype)
    q = torch.randn(len(kv_lens), heads, head_dim, device="cuda").to(dtype)
    args = (q, kc, vc, r2t, rpi, torch.tensor(kv_lens, device="cuda"), 1 / math.sqrt(head_dim))
    _close(decode_attention(*args), decode_attention_reference(*args))


@compiled_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads,kv_heads,head_dim", [(9, 3, 64), (32, 8, 128)])
def test_extend_attention_gpu(dtype, heads, kv_heads, head_dim):
    from sglpy.kernels import extend_attention, extend_attention_reference

    prefix = [0, 0, 500, 1000, 37, 0]
    ext = [1, 700, 1, 300, 129, 2048]
    kc, vc, r2t, rpi = _paged([p + e for p, e in zip(prefix, ext)], kv_heads, head_dim, dtype)
    q = torch.randn(sum(ext), heads, head_dim, device="cuda").to(dtype)
    args = (q, kc, vc, r2t, rpi, torch.tensor(prefix, device="cuda"), torch.tensor(ext, device="cuda"),
            1 / math.sqrt(head_dim))
    _close(extend_attention(*args), extend_attention_reference(*args))


@compiled_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("window,softcap", [(512, 0.0), (4096, 50.0), (0, 50.0), (1, 0.0)])
def test_window_softcap_attention_gpu(dtype, window, softcap):
    """Gemma-shaped heads (8 / 4, head_dim 256): windows shorter and longer than the requests, soft-caps."""
    from sglpy.kernels import decode_attention, decode_attention_reference, extend_attention, extend_attention_reference

    kv_lens = [1, 511, 513, 2048, 3000]
    kc, vc, r2t, rpi = _paged(kv_lens, 4, 256, dtype, seed=window)
    q = torch.randn(len(kv_lens), 8, 256, device="cuda").to(dtype)
    args = (q, kc, vc, r2t, rpi, torch.tensor(kv_lens, device="cuda"), 1 / 16)
    _close(decode_attention(*args, window=window, softcap=softcap),
           decode_attention_reference(*args, window, softcap))
    prefix, ext = [0, 500, 465, 1535, 2900], [1, 11, 48, 513, 100]  # the same requests: a cached prefix each
    q = torch.randn(sum(ext), 8, 256, device="cuda").to(dtype)
    args = (q, kc, vc, r2t, rpi, torch.tensor(prefix, device="cuda"), torch.tensor(ext, device="cuda"), 1 / 16)
    _close(extend_attention(*args, window=window, softcap=softcap),
           extend_attention_reference(*args, window, softcap))


@compiled_only
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_small_kernels_gpu(dtype):
    from sglpy.kernels import (
        apply_rotary,
        apply_rotary_reference,
        apply_token_bitmask,
        apply_token_bitmask_reference,
        build_rope_cache,
        rmsnorm,
        rmsnorm_reference,
        store_kv,
        store_kv_reference,
    )

    dev = "cuda"
    kc, vc = torch.randn(8192, 8, 128, device=dev).to(dtype), torch.randn(8192, 8, 128, device=dev).to(dtype)
    loc = torch.randperm(8192, device=dev)[:1000]
    k, v = torch.randn(1000, 8, 128, device=dev).to(dtype), torch.randn(1000, 8, 128, device=dev).to(dtype)
    kc2, vc2 = kc.clone(), vc.clone()
    store_kv(kc, vc, loc, k, v)
    store_kv_reference(kc2, vc2, loc, k, v)
    assert torch.equal(kc, kc2) and torch.equal(vc, vc2)

    x, r = torch.randn(300, 4096, device=dev).to(dtype), torch.randn(300, 4096, device=dev).to(dtype)
    w = torch.randn(4096, device=dev).to(dtype)
    got, want = rmsnorm(x, w, 1e-5, r), rmsnorm_reference(x, w, 1e-5, r)
    _close(got.out, want.out)
    assert torch.equal(got.residual, want.residual)

    cache = build_rope_cache(128, 8192, 500000.0, device=dev)
    q, kk = torch.randn(300, 32, 128, device=dev).to(dtype), torch.randn(300, 8, 128, device=dev).to(dtype)
    pos = torch.randint(0, 8192, (300,), device=dev)
    q2, k2 = q.clone(), kk.clone()
    apply_rotary(q, kk, pos, cache)
    apply_rotary_reference(q2, k2, pos, cache)
    _close(q, q2)
    _close(kk, k2)

    logits = torch.randn(64, 128256, device=dev)
    bitmask = torch.randint(-(2**31), 2**31 - 1, (32, 4008), device=dev, dtype=torch.int64).to(torch.int32)
    idx = torch.randperm(64, device=dev)[:32]
    want_logits = logits.clone()
    apply_token_bitmask(logits, bitmask, idx)
    apply_token_bitmask_reference(want_logits, bitmask, idx)
    assert torch.equal(logits, want_logits)


@compiled_only
@pytest.mark.slow
def test_engine_greedy_cuda_equals_cpu(tiny_model_path):
    from sglpy.runtime.engine import Engine

    prompts = ["The capital of France is", "1, 2, 3, 4,", "Write a haiku about the sea:"]
    params = {"max_new_tokens": 24, "temperature": 0}
    outs = {}
    for device in ("cpu", "cuda"):
        # quantization pinned: on CPU "auto" means int8/int4, which changes greedy ids; CUDA runs float32
        eng = Engine(model=tiny_model_path, device=device, dtype="float32", quantization="none")
        try:
            outs[device] = [o["output_ids"] for o in eng.generate(prompt=prompts, sampling_params=params)]
        finally:
            eng.shutdown()
    assert outs["cuda"] == outs["cpu"]

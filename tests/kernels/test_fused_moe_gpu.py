"""The fused MoE Triton kernel compiled on a CUDA GPU against the torch reference at Qwen3-MoE-like sizes (skipped
without one). conftest turns the Triton interpreter on, so `test_gpu_suite_compiled` re-runs this file in a child
with TRITON_INTERPRET=0; the other tests run only there. Direct run:
TRITON_INTERPRET=0 python -m pytest -m gpu tests/kernels/test_fused_moe_gpu.py
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
INTERPRETED = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")]
compiled_only = pytest.mark.skipif(INTERPRETED, reason="runs in the TRITON_INTERPRET=0 child")


@pytest.mark.skipif(not INTERPRETED, reason="this is the child run already")
def test_gpu_suite_compiled():
    env = dict(os.environ, TRITON_INTERPRET="0")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__],
                          env=env, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-8000:] + proc.stderr[-4000:]


@compiled_only
@pytest.mark.parametrize("tokens", [1, 16, 300])
@pytest.mark.parametrize("dtype,experts,hidden,inter,top_k,tol", [
    (torch.bfloat16, 128, 2048, 768, 8, 3e-2),  # Qwen3-30B-A3B's layer shape
    (torch.float32, 8, 1024, 448, 2, 2e-4),     # Mixtral-like routing, odd width, IEEE float32 dots
])
def test_fused_moe_compiled_matches_reference(tokens, dtype, experts, hidden, inter, top_k, tol):
    from sglpy.kernels.fused_moe import fused_moe, fused_moe_reference

    g = torch.Generator(device="cuda").manual_seed(tokens)
    dev = "cuda"
    x = torch.randn(tokens, hidden, device=dev, generator=g).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, device=dev, generator=g) * hidden ** -0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, device=dev, generator=g) * inter ** -0.5).to(dtype)
    w, ids = torch.topk(torch.softmax(torch.randn(tokens, experts, device=dev, generator=g), -1), top_k, dim=-1)
    w = (w / w.sum(-1, keepdim=True)).to(dtype)
    got = fused_moe(x, w1, w2, ids, w)  # CUDA: the Triton kernel
    want = fused_moe_reference(x, w1, w2, ids, w)
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)

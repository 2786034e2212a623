"""The wrappers reject bad input with a ValueError that names the problem; importing them skips triton."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from sglpy.kernels import (
    apply_rotary,
    apply_token_bitmask,
    build_rope_cache,
    decode_attention,
    extend_attention,
    rmsnorm,
    store_kv,
)


def test_importing_kernels_does_not_import_triton():
    code = "import sys, sglpy.kernels; assert 'triton' not in sys.modules, 'triton imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def _decode_args(**over):
    args = dict(
        q=torch.randn(2, 4, 8), k_cache=torch.randn(10, 2, 8), v_cache=torch.randn(10, 2, 8),
        req_to_token=torch.zeros(3, 6, dtype=torch.int32), req_pool_indices=torch.tensor([0, 1]),
        seq_lens=torch.tensor([3, 4]), sm_scale=0.5,
    )
    args.update(over)
    return args


@pytest.mark.parametrize(
    "over,match",
    [
        (dict(q=torch.randn(2, 3, 8)), "multiple of kv_heads"),
        (dict(q=torch.randn(2, 4)), "q must have 3 dims"),
        (dict(q=torch.randn(2, 4, 8, dtype=torch.float64)), "q dtype"),
        (dict(k_cache=torch.randn(10, 2, 8).half()), "share one dtype"),
        (dict(v_cache=torch.randn(11, 2, 8)), "v_cache shape"),
        (dict(k_cache=torch.randn(10, 2, 4), v_cache=torch.randn(10, 2, 4)), "head_dim"),
        (dict(seq_lens=torch.tensor([3])), "seq_lens length"),
        (dict(seq_lens=torch.tensor([0, 4])), "seq_lens must be >= 1"),
        (dict(seq_lens=torch.tensor([3, 7])), r"<= req_to_token.shape\[1\]"),
        (dict(req_pool_indices=torch.tensor([0.0, 1.0])), "req_pool_indices dtype"),
        (dict(q=torch.randn(2, 4, 16)[:, :, ::2]), "contiguous last dim"),
    ],
)
def test_decode_attention_rejects(over, match):
    with pytest.raises(ValueError, match=match):
        decode_attention(**_decode_args(**over))


def test_extend_attention_rejects_lengths_that_disagree_with_q():
    args = _decode_args()
    del args["seq_lens"]
    with pytest.raises(ValueError, match=r"sum\(extend_lens\)"):
        extend_attention(**args, prefix_lens=torch.tensor([0, 1]), extend_lens=torch.tensor([1, 2]))
    with pytest.raises(ValueError, match="prefix_lens must be >= 0"):
        extend_attention(**args, prefix_lens=torch.tensor([-1, 0]), extend_lens=torch.tensor([1, 1]))
    with pytest.raises(ValueError, match="prefix_lens length"):
        extend_attention(**args, prefix_lens=torch.tensor([0]), extend_lens=torch.tensor([1, 1]))


def test_store_kv_rejects_mismatches():
    kc, vc = torch.zeros(4, 2, 8), torch.zeros(4, 2, 8)
    with pytest.raises(ValueError, match="len\\(loc\\)"):
        store_kv(kc, vc, torch.tensor([0, 1]), torch.zeros(3, 2, 8), torch.zeros(3, 2, 8))
    with pytest.raises(ValueError, match="share one dtype"):  # k and v must agree (the caches may differ)
        store_kv(kc, vc, torch.tensor([0]), torch.zeros(1, 2, 8).half(), torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="share one dtype"):
        store_kv(kc, vc.bfloat16(), torch.tensor([0]), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))
    with pytest.raises(ValueError, match="loc dtype"):
        store_kv(kc, vc, torch.tensor([0.0]), torch.zeros(1, 2, 8), torch.zeros(1, 2, 8))


def test_rmsnorm_rejects_mismatches():
    with pytest.raises(ValueError, match="weight length"):
        rmsnorm(torch.randn(2, 8), torch.ones(4), 1e-6)
    with pytest.raises(ValueError, match="residual shape"):
        rmsnorm(torch.randn(2, 8), torch.ones(8), 1e-6, torch.randn(3, 8))
    with pytest.raises(ValueError, match="eps"):
        rmsnorm(torch.randn(2, 8), torch.ones(8), -1.0)


def test_rotary_rejects_mismatches():
    cache = build_rope_cache(8, 16)
    with pytest.raises(ValueError, match="positions must lie"):
        apply_rotary(torch.randn(2, 2, 8), torch.randn(2, 1, 8), torch.tensor([0, 16]), cache)
    with pytest.raises(ValueError, match="cos_sin_cache dim 1"):
        apply_rotary(torch.randn(2, 2, 4), torch.randn(2, 1, 4), torch.tensor([0, 1]), cache)
    with pytest.raises(ValueError, match="unsupported rope scaling"):
        build_rope_cache(8, 16, scaling={"rope_type": "yarn", "factor": 2.0})
    with pytest.raises(ValueError, match="head_dim must be a positive even"):
        build_rope_cache(7, 16)


def test_bitmask_rejects_mismatches():
    with pytest.raises(ValueError, match="bitmask dtype"):
        apply_token_bitmask(torch.randn(2, 40), torch.zeros(2, 2, dtype=torch.int64))
    with pytest.raises(ValueError, match=r"bitmask rows \(2\) must equal len\(indices\) \(1\)"):
        apply_token_bitmask(torch.randn(2, 40), torch.zeros(2, 2, dtype=torch.int32), torch.tensor([0]))
    with pytest.raises(ValueError, match="indices must lie"):
        apply_token_bitmask(torch.randn(2, 40), torch.zeros(1, 2, dtype=torch.int32), torch.tensor([2]))

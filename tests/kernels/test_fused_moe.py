"""Fused MoE: the Triton kernel against the torch reference under TRITON_INTERPRET=1 (set in conftest) on small
ragged routings, the pair alignment, the wrapper's checks, and the reference against a dense every-expert oracle."""

from __future__ import annotations

import os

import pytest
import torch
import torch.nn.functional as F

from sglpy.kernels.fused_moe import align_pairs, fused_moe, fused_moe_reference

F32, BF16, F16 = torch.float32, torch.bfloat16, torch.float16
TOL = {F32: 1e-5, BF16: 3e-2, F16: 3e-3}


def _case(tokens, experts, hidden, inter, top_k, dtype, seed, skip_expert=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, hidden, generator=g).to(dtype)
    w1 = (torch.randn(experts, 2 * inter, hidden, generator=g) * hidden ** -0.5).to(dtype)
    w2 = (torch.randn(experts, hidden, inter, generator=g) * inter ** -0.5).to(dtype)
    logits = torch.randn(tokens, experts, generator=g)
    if skip_expert is not None:
        logits[:, skip_expert] = -1e9  # an expert no token chooses
    w, ids = torch.topk(torch.softmax(logits, -1), top_k, dim=-1)
    return x, w1, w2, ids, (w / w.sum(-1, keepdim=True)).to(dtype)


def _dense(x, w1, w2, ids, w):
    """Every expert on every token, masked to the chosen ones (independent of the reference's grouping)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    xd = x.double()
    for e in range(w1.shape[0]):
        gate, up = (xd @ w1[e].double().t()).chunk(2, -1)
        y = (F.silu(gate) * up) @ w2[e].double().t()
        out += y * (w.double() * (ids == e)).sum(-1, keepdim=True)
    return out


def test_reference_matches_dense_oracle():
    x, w1, w2, ids, w = _case(9, 5, 32, 24, 2, F32, 0, skip_expert=3)
    torch.testing.assert_close(fused_moe_reference(x, w1, w2, ids, w).double(), _dense(x, w1, w2, ids, w),
                               atol=1e-5, rtol=1e-5)


def test_align_pairs_sorts_by_expert_and_pads_blocks():
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]])  # expert 1 chosen by nobody
    a = align_pairs(ids, 4, 4)
    pairs = ids.numel()
    assert a.sorted_pairs.numel() % 4 == 0 and a.sorted_pairs.numel() == a.block_experts.numel() * 4
    used = a.block_experts >= 0
    assert a.block_experts[used].tolist() == [0, 2, 3]  # one padded block per chosen expert, in expert order
    for b, e in enumerate(a.block_experts.tolist()):
        slots = a.sorted_pairs[b * 4:(b + 1) * 4].tolist()
        real = [p for p in slots if p < pairs]
        if e < 0:
            assert not real
        else:
            assert real and all(ids.reshape(-1)[p] == e for p in real) and real == sorted(real)
    assert sorted(p for p in a.sorted_pairs.tolist() if p < pairs) == list(range(pairs))  # every pair once


def test_wrapper_names_bad_arguments():
    x, w1, w2, ids, w = _case(4, 3, 16, 8, 2, F32, 1)
    with pytest.raises(ValueError, match=r"topk_ids must lie in \[0, 3\)"):
        fused_moe(x, w1, w2, ids + 2, w)
    with pytest.raises(ValueError, match=r"w_down dim 2 \(inter"):
        fused_moe(x, w1, w2[:, :, :4], ids, w)
    with pytest.raises(ValueError, match=r"topk_weights shape"):
        fused_moe(x, w1, w2, ids, w[:, :1])
    torch.testing.assert_close(fused_moe(x, w1, w2, ids, w), fused_moe_reference(x, w1, w2, ids, w))


triton_only = pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="needs TRITON_INTERPRET=1")


@triton_only
@pytest.mark.parametrize("tokens,experts,hidden,inter,top_k,dtype,block_m,skip", [
    (7, 4, 32, 24, 2, F32, 16, 1),     # ragged: fewer tokens than a block, an expert with no tokens, odd widths
    (1, 8, 48, 40, 2, F32, 16, None),  # one decode token
    (37, 4, 64, 32, 2, F32, 16, 2),    # an expert's run spanning several blocks
    (20, 6, 32, 32, 3, BF16, 16, 0),   # top-3, bf16
    (12, 3, 32, 16, 1, F16, 32, None),  # top-1, fp16, wider blocks
])
def test_triton_matches_reference(tokens, experts, hidden, inter, top_k, dtype, block_m, skip):
    pytest.importorskip("triton")
    from sglpy.runtime.testing.kernel_cases import patch_interpreter_bf16_dot
    from sglpy.kernels.fused_moe_triton import fused_moe_triton

    patch_interpreter_bf16_dot()
    x, w1, w2, ids, w = _case(tokens, experts, hidden, inter, top_k, dtype, tokens, skip_expert=skip)
    got = fused_moe_triton(x, w1, w2, ids, w, block_m=block_m)
    want = fused_moe_reference(x, w1, w2, ids, w)
    assert got.dtype == dtype and got.shape == x.shape
    torch.testing.assert_close(got.float(), want.float(), atol=TOL[dtype], rtol=TOL[dtype])

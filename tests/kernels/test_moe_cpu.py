"""Native CPU MoE (csrc/moe.cpp) against the Python grouped loop it replaces for decode rows: int8/int4 experts
bit for bit (the same GEMVs and float32 operations), float32 experts within float32 rounding; only chosen experts."""

from __future__ import annotations

import functools
import types

import pytest
import torch

from sglpy.kernels.cpu_native import native_lib
from sglpy.kernels.moe_cpu import float_experts, moe_experts_cpu, packed_experts
from sglpy.runtime.model.moe import MoEBlock, Routing, moe_experts, moe_reference, route

lib = native_lib()
pytestmark = pytest.mark.skipif(lib is None, reason="native CPU kernels unavailable")


@functools.lru_cache(maxsize=None)  # blocks are read-only in these tests: build each once
def _block(mode: str, experts=6, top_k=2, hidden=64, inter=32, seed=0) -> MoEBlock:
    cfg = types.SimpleNamespace(hidden_size=hidden, moe_intermediate_size=inter, intermediate_size=2 * inter,
                                num_experts=experts, num_experts_per_tok=top_k, norm_topk_prob=True)
    torch.manual_seed(seed)
    b = MoEBlock(cfg, "qwen3-moe")
    with torch.no_grad():
        for p in b.parameters():
            p.normal_(0.0, hidden ** -0.5)
    b.fuse()
    if mode != "none":
        b.quantize_experts(mode)
    return b


def _routing(tokens, experts, top_k, skip=None, seed=1) -> Routing:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(tokens, experts, generator=g)
    if skip is not None:
        logits[:, skip] = -1e9
    return route(logits, top_k, True)


@pytest.mark.parametrize("mode", ["int8", "int4"])
@pytest.mark.parametrize("tokens,top_k", [(1, 2), (5, 2), (16, 3), (3, 1)])
def test_packed_experts_equal_python_loop(mode, tokens, top_k):
    b = _block(mode, top_k=top_k)
    r = _routing(tokens, 6, top_k, skip=4)
    x = torch.randn(tokens, 64)
    table = packed_experts([q.packed for q in b.q_gate_up], [q.packed for q in b.q_down])
    assert table is not None and table.kind == mode
    got = moe_experts_cpu(lib, x, r.ids, r.weights, table)
    assert torch.equal(got, moe_experts(x, r, b.q_gate_up, b.q_down))


@pytest.mark.parametrize("tokens,top_k", [(1, 2), (7, 2), (4, 4)])
def test_float_experts_match_reference(tokens, top_k):
    b = _block("none", top_k=top_k, hidden=48, inter=40)  # widths off the 16-lane grid
    r = _routing(tokens, 6, top_k)
    x = torch.randn(tokens, 48)
    got = moe_experts_cpu(lib, x, r.ids, r.weights, float_experts(b.w_gate_up.data, b.w_down.data))
    torch.testing.assert_close(got, moe_reference(x, b.w_gate_up, b.w_down, r), atol=1e-5, rtol=1e-5)


def test_block_uses_native_call_for_decode_rows_only(monkeypatch):
    """MoEBlock takes the native call for <= 16 float32 rows, the Python loop above; both agree."""
    import sglpy.runtime.model.moe as moe

    b = _block("int8")
    calls = []
    real = moe.moe_experts_cpu
    monkeypatch.setattr(moe, "moe_experts_cpu", lambda *a: calls.append(a[1].shape[0]) or real(*a))
    with torch.no_grad():
        x = torch.randn(20, 64)
        many = b(x)
        few = b(x[:3])
    assert calls == [3]
    assert torch.equal(few, many[:3])


def test_bad_expert_ids_are_refused():
    b = _block("int8")
    table = packed_experts([q.packed for q in b.q_gate_up], [q.packed for q in b.q_down])
    x = torch.randn(2, 64)
    with pytest.raises(ValueError, match=r"expert ids must lie in \[0, 6\)"):
        moe_experts_cpu(lib, x, torch.tensor([[0, 6], [1, 2]]), torch.ones(2, 2), table)


def test_native_call_reads_only_the_chosen_experts():
    """Unchosen experts' weights (float) and scales (int8) are NaN: the outputs stay finite and unchanged."""
    r = _routing(4, 6, 2, skip=2)
    x = torch.randn(4, 48)
    chosen = set(r.ids.flatten().tolist())
    b = _block("none", hidden=48, inter=40)
    w1, w2 = b.w_gate_up.data.clone(), b.w_down.data.clone()
    want = moe_experts_cpu(lib, x, r.ids, r.weights, float_experts(w1, w2))
    for e in set(range(6)) - chosen:
        w1[e], w2[e] = float("nan"), float("nan")
    assert torch.equal(moe_experts_cpu(lib, x, r.ids, r.weights, float_experts(w1, w2)), want)
    q = _block("int8", seed=3)  # the native int8 layout wants widths on the 16-lane grid
    gu, dn = [q.packed for q in q.q_gate_up], [q.packed for q in q.q_down]
    x = torch.randn(4, 64)
    want = moe_experts_cpu(lib, x, r.ids, r.weights, packed_experts(gu, dn))
    import dataclasses
    poisoned = [dataclasses.replace(p, scales=torch.full_like(p.scales, float("nan"))) if i not in chosen else p
                for i, p in enumerate(gu)]
    got = moe_experts_cpu(lib, x, r.ids, r.weights, packed_experts(poisoned, dn))
    assert torch.isfinite(got).all() and torch.equal(got, want)


@pytest.mark.parametrize("mode", ["none", "int8", "int4"])
def test_batch_invariant_block_rows_depend_on_their_token_alone(mode):
    """Deterministic inference: a block flagged batch_invariant takes the native call at any row count (here 150
    tokens, so some expert runs past a 64-row block of csrc/moe.cpp), and each token's output equals its output
    alone, bit for bit, as the first row, a middle row or the last of any batch. The router runs as
    make_batch_invariant wraps it (the native GEMV for every row)."""
    from sglpy.runtime.model.quantization import RowByRowLinear

    b = _block(mode)
    gate, b.gate, b.batch_invariant = b.gate, RowByRowLinear(b.gate), True
    try:
        torch.manual_seed(5)
        x = torch.randn(150, 64)
        with torch.no_grad():
            many = b(x)
            alone = torch.cat([b(x[i:i + 1]) for i in range(150)])
            shifted = b(torch.cat([torch.randn(37, 64), x[100:]]))[37:]
    finally:
        b.gate, b.batch_invariant = gate, False
    assert torch.equal(many, alone)
    assert torch.equal(shifted, alone[100:])


def test_batch_invariant_block_without_native_experts_runs_token_by_token(monkeypatch):
    """bf16 experts have no native call: under batch_invariant the tokens run one at a time through the reference,
    so a token's output is its output alone."""
    b = MoEBlock(types.SimpleNamespace(hidden_size=64, moe_intermediate_size=32, intermediate_size=64, num_experts=6,
                                       num_experts_per_tok=2, norm_topk_prob=True), "qwen3-moe")
    b.fuse()
    b = b.to(torch.bfloat16)
    from sglpy.runtime.model.quantization import RowByRowLinear

    b.gate, b.batch_invariant = RowByRowLinear(b.gate), True  # as make_batch_invariant wraps it: row by row
    x = torch.randn(9, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        assert torch.equal(b(x), torch.cat([b(x[i:i + 1]) for i in range(9)]))

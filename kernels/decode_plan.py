"""Decode attention planned once per forward: the native CPU kernel or Triton read K/V in place; the torch path reads
contiguous requests as views and gathers the rest. Under deterministic inference each decode token runs as a one-token
extend (CPU) or with fixed split points (Triton)."""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from ._checks import FLOAT_DTYPES, check_dim, check_tensor
from ._dispatch import on_device, triton_module
from .cpu_native import native_lib
from .decode_attention_cpu import decode_attention_cpu, supports
from .extend_attention_cpu import extend_attention_cpu_packed
from .decode_attention import (_check_seq_len_values, check_decode_attention_args, decode_attention_reference,
                               length_groups, window_softcap)

# A request whose slots form one contiguous run reads its K/V as a view of the pool (one SDPA, no copy, no
# mask); the others are gathered, padded per length group. Measured here (1 thread, 9/3 heads, d 64, ms per
# layer, gather vs views): b=8 L=64 0.20 vs 0.15, L=500 2.2 vs 0.50; b=64 L=64 0.93 vs 1.43, L=200 4.2 vs 2.5,
# L=500 29 vs 7.4, L=2000 118 vs 31. So views always pay up to VIEW_ANY_LEN_BATCH requests, and beyond that
# for requests of at least VIEW_MIN_LEN tokens (below it, one SDPA call per request costs more than a gather).
VIEW_ANY_LEN_BATCH = 8
VIEW_MIN_LEN = 128


@dataclass(frozen=True)
class GatherGroup:
    """Requests read by one padded gather + masked SDPA: their batch positions, slot ids and validity mask."""

    index: torch.Tensor | None  # [g] positions in the batch; None = the whole batch in order
    flat_slots: torch.Tensor  # [g * max_len] int64 (padding points at slot 0 and is masked out)
    mask: torch.Tensor | None  # [g, 1, 1, max_len] bool; None when every request has max_len tokens
    max_len: int


@dataclass(frozen=True)
class DecodePlan:
    """How one forward's decode requests read their K/V; built by plan_decode_attention, shared by all layers."""

    req_to_token: torch.Tensor  # [max_reqs, max_context] (the Triton path reads it directly)
    req_pool_indices: torch.Tensor  # [b]
    seq_lens: torch.Tensor  # [b]
    views: tuple[tuple[int, int, int], ...]  # (batch position, first slot, length) of requests read in place
    groups: tuple[GatherGroup, ...]  # the other requests (CPU), gathered per length group
    native: ctypes.CDLL | None = None  # the native CPU kernels' library: one call reads the whole batch in place
    # deterministic inference: every request's keys in fixed blocks from position 0, whatever the batch (CPU: the
    # extend kernel with one new token, so a token's attention is the same in decode and in extend; Triton: fixed
    # split points). prefix_lens = seq_lens - 1, ones, and each request's q row, for the extend kernel.
    batch_invariant: bool = False
    prefix_lens: torch.Tensor | None = None
    extend_lens: torch.Tensor | None = None
    starts: torch.Tensor | None = None

    @property
    def batch(self) -> int:
        """Number of decode requests."""
        return int(self.req_pool_indices.shape[0])


def _contiguous(req_to_token: torch.Tensor, rows: torch.Tensor, lens: list[int]) -> list[bool]:
    """Per request: do its slots step by exactly one (one run)? One pass over the batch's slot table."""
    max_len = max(lens)
    if max_len == 1:
        return [True] * len(lens)
    tab = req_to_token[rows, :max_len]  # [b, max_len]
    valid = torch.arange(1, max_len, device=tab.device)[None, :] < torch.tensor(lens, device=tab.device)[:, None]
    steps_by_one = (tab[:, 1:] - tab[:, :-1] == 1) | ~valid  # checking the ends alone would accept permutations
    return steps_by_one.all(dim=1).tolist()


def _gather_group(req_to_token, rows: torch.Tensor, seq_lens: torch.Tensor, max_len: int,
                  index: torch.Tensor | None) -> GatherGroup:
    pos = torch.arange(max_len, device=rows.device)
    valid = pos[None, :] < seq_lens[:, None]  # [g, max_len]
    slots = req_to_token[rows, :max_len].long()
    slots = torch.where(valid, slots, torch.zeros_like(slots))  # stale ids past a request's end -> slot 0
    mask = None if bool(valid.all()) else valid[:, None, None, :]
    return GatherGroup(index, slots.reshape(-1), mask, max_len)


def plan_decode_attention(req_to_token: torch.Tensor, req_pool_indices: torch.Tensor,
                          seq_lens: torch.Tensor, batch_invariant: bool = False) -> DecodePlan:
    """Check the decode metadata once and precompute how every layer reads K/V (views, or gathers by length).
    batch_invariant: a request's result must not depend on its batch (deterministic inference; DecodePlan)."""
    check_tensor("req_to_token", req_to_token, 2, (torch.int32, torch.int64), last_dim_contiguous=True)
    check_tensor("req_pool_indices", req_pool_indices, 1, (torch.int32, torch.int64))
    check_tensor("seq_lens", seq_lens, 1, (torch.int32, torch.int64))
    check_dim("seq_lens", seq_lens.shape[0], req_pool_indices.shape[0], "length (= len(req_pool_indices))")
    # the Triton kernel reads lengths on the device; only the torch path (CPU, or CUDA with SGLPY_DISABLE_TRITON=1)
    # needs the views/gathers planned here (testing is_cuda instead left that path with an empty plan)
    if triton_module("decode_attention_triton", req_to_token) is not None or req_pool_indices.numel() == 0:
        return DecodePlan(req_to_token, req_pool_indices, seq_lens, (), (), batch_invariant=batch_invariant)
    lib = native_lib() if req_to_token.device.type == "cpu" else None
    if batch_invariant:
        # the extend kernel (csrc/extend_attention.cpp) reads keys in blocks of 64 from position 0 and never splits
        # a request: the same order in every batch, and the same as when the token was part of an extend
        _check_seq_len_values(seq_lens, req_to_token.shape[1])
        rows, lens = req_pool_indices.to(torch.int64).contiguous(), seq_lens.to(torch.int64).contiguous()
        return DecodePlan(req_to_token, rows, lens, (), (), lib, True, lens - 1, torch.ones_like(lens),
                          torch.arange(lens.shape[0], device=lens.device))
    if lib is not None and req_to_token.dtype == torch.int32 and req_to_token.is_contiguous():
        # the kernel checks lengths, rows and slot ids itself; int64 copies once here, not once per layer
        return DecodePlan(req_to_token, req_pool_indices.to(torch.int64).contiguous(),
                          seq_lens.to(torch.int64).contiguous(), (), (), lib)
    _check_seq_len_values(seq_lens, req_to_token.shape[1])
    rows, lens = req_pool_indices.long(), seq_lens.tolist()
    b = len(lens)
    views, rest = [], []
    for i, ok in enumerate(_contiguous(req_to_token, rows, lens)):
        if ok and (b <= VIEW_ANY_LEN_BATCH or lens[i] >= VIEW_MIN_LEN):
            views.append((i, int(req_to_token[rows[i], 0]), lens[i]))
        else:
            rest.append(i)
    if not rest:
        return DecodePlan(req_to_token, req_pool_indices, seq_lens, tuple(views), ())
    if len(rest) == b and len(length_groups(lens)) == 1:  # the common batched case: one gather, in order
        return DecodePlan(req_to_token, req_pool_indices, seq_lens, (),
                          (_gather_group(req_to_token, rows, seq_lens, max(lens), None),))
    groups = []
    for grp in length_groups([lens[i] for i in rest]):
        idx = [rest[g] for g in grp]
        sel = torch.tensor(idx, device=rows.device)
        groups.append(_gather_group(req_to_token, rows[sel], seq_lens[sel], lens[idx[0]], sel))
    return DecodePlan(req_to_token, req_pool_indices, seq_lens, tuple(views), tuple(groups))


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.float32 else t.to(torch.float32)  # skips the ~1 us of a no-op .to()


def _sdpa_view(q_row: torch.Tensor, k_cache, v_cache, first: int, n: int, sm_scale: float) -> torch.Tensor:
    # q_row: [heads, d]; K/V = pool rows [first, first + n) read in place -> [1, heads, d] float32
    heads, d = q_row.shape
    kv_heads = k_cache.shape[1]
    k = _f32(k_cache[first:first + n]).permute(1, 0, 2)[None]  # [1, kv_heads, n, d], no copy
    v = _f32(v_cache[first:first + n]).permute(1, 0, 2)[None]  # when the pool is float32
    qi = _f32(q_row).view(1, kv_heads, heads // kv_heads, d)
    return F.scaled_dot_product_attention(qi, k, v, scale=sm_scale).view(1, heads, d)


def _sdpa_gathered(q, k_cache, v_cache, g: GatherGroup, sm_scale):
    # q: [g, heads, d] of this group's requests -> [g, heads, d] float32
    n, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    # index_select of 2-D rows is much faster on CPU than of 3-D slabs; .to() converts a 16-bit pool
    k = k_cache.flatten(1).index_select(0, g.flat_slots).view(n, g.max_len, kv_heads, d)
    v = v_cache.flatten(1).index_select(0, g.flat_slots).view(n, g.max_len, kv_heads, d)
    k, v = _f32(k).permute(0, 2, 1, 3), _f32(v).permute(0, 2, 1, 3)
    qf = _f32(q).reshape(n, kv_heads, heads // kv_heads, d)
    return F.scaled_dot_product_attention(qf, k, v, attn_mask=g.mask, scale=sm_scale).reshape(n, heads, d)


def decode_attention_planned(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan,
                             sm_scale: float, window: int | None = None, softcap: float | None = None) -> torch.Tensor:
    """decode_attention over a precomputed plan (same result); per-layer checks are only the cheap shape ones.
    window / softcap: a layer's sliding window and logit soft-cap (kernels/decode_attention.py), run by the native
    and Triton kernels; the torch path without the native kernels then runs the reference."""
    check_tensor("q", q, 3, FLOAT_DTYPES, last_dim_contiguous=True)
    window, softcap = window_softcap(window, softcap)
    check_dim("q", q.shape[0], plan.batch, "dim 0 (batch, = the plan's batch)")
    if q.shape[0] == 0:
        return torch.empty_like(q)
    impl = triton_module("decode_attention_triton", q)
    if impl is not None:
        check_decode_attention_args(q, k_cache, v_cache, plan.req_to_token, plan.req_pool_indices, plan.seq_lens)
        with on_device(q):
            return impl.decode_attention_triton(q, k_cache, v_cache, plan.req_to_token, plan.req_pool_indices,
                                                plan.seq_lens, sm_scale, batch_invariant=plan.batch_invariant,
                                                window=window, softcap=softcap)
    if plan.batch_invariant:
        return _decode_invariant(q, k_cache, v_cache, plan, sm_scale, window, softcap)
    if k_cache.shape[1:] != v_cache.shape[1:] or k_cache.shape[2] != q.shape[2] or q.shape[1] % k_cache.shape[1]:
        raise ValueError(f"q {tuple(q.shape)}, k_cache {tuple(k_cache.shape)}, v_cache {tuple(v_cache.shape)} "
                         "do not fit: head_dim must agree and heads must be a multiple of kv_heads")
    if plan.native is not None:
        if supports(q, k_cache, v_cache, plan.req_to_token):
            return decode_attention_cpu(plan.native, q, k_cache, v_cache, plan.req_to_token, plan.req_pool_indices,
                                        plan.seq_lens, sm_scale, window, softcap)
        _check_seq_len_values(plan.seq_lens, plan.req_to_token.shape[1])  # a layout the kernel cannot read
        return decode_attention_reference(q, k_cache, v_cache, plan.req_to_token, plan.req_pool_indices,
                                          plan.seq_lens, sm_scale, window, softcap)
    if window or softcap:  # the views and gathers below are full causal attention: the reference masks and caps
        return decode_attention_reference(q, k_cache, v_cache, plan.req_to_token, plan.req_pool_indices,
                                          plan.seq_lens, sm_scale, window, softcap)
    if len(plan.views) == 1 and not plan.groups:  # one request alone: no output buffer either
        _, first, n = plan.views[0]
        o = _sdpa_view(q[0], k_cache, v_cache, first, n, sm_scale)
        return o if o.dtype == q.dtype else o.to(q.dtype)
    if not plan.views and len(plan.groups) == 1 and plan.groups[0].index is None:
        o = _sdpa_gathered(q, k_cache, v_cache, plan.groups[0], sm_scale)
        return o if o.dtype == q.dtype else o.to(q.dtype)
    o = torch.empty_like(q)
    for i, first, n in plan.views:
        o[i] = _sdpa_view(q[i], k_cache, v_cache, first, n, sm_scale)[0]
    for g in plan.groups:
        o[g.index] = _sdpa_gathered(q[g.index], k_cache, v_cache, g, sm_scale).to(q.dtype)
    return o


def _decode_invariant(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, plan: DecodePlan,
                      sm_scale: float, window: int = 0, softcap: float = 0.0) -> torch.Tensor:
    """Deterministic inference on CPU: each decode token as a one-token extend (the native extend kernel), or,
    without the native kernels, one reference call per request (its result then depends on that request alone)."""
    # q: [b, heads, d] -> [b, heads, d]
    if plan.native is not None and supports(q, k_cache, v_cache, plan.req_to_token):
        return extend_attention_cpu_packed(plan.native, q, k_cache, v_cache, plan.req_to_token,
                                           plan.req_pool_indices, plan.prefix_lens, plan.extend_lens, plan.starts,
                                           sm_scale, window, softcap)
    return torch.cat([decode_attention_reference(q[i:i + 1], k_cache, v_cache, plan.req_to_token,
                                                 plan.req_pool_indices[i:i + 1], plan.seq_lens[i:i + 1], sm_scale,
                                                 window, softcap)
                      for i in range(q.shape[0])])

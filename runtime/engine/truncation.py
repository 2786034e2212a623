"""Top-k / top-p / min-p sampling without a full-vocabulary sort: candidates first, the sort only where they fall short.

The semantics are those of a descending sort of the whole row (SGLang's): divide by the temperature; keep the
top_k most likely tokens (-1: all); over what is kept, keep the smallest prefix whose mass reaches top_p (the
most likely token always stays); drop tokens whose probability is below min_p times the most likely one's;
draw from what is left by inverse CDF with the request's uniform, in descending order.

Only the K most likely tokens of a row can be kept when the row's top_k is K, so the work runs on those K
candidates. A row with top_k -1 (top_p or min_p alone) takes CANDIDATES of them and is exact on them when
the cut already falls inside: their mass exceeds top_p of the whole row's mass (a sum over the row, no sort),
or the last candidate is below min_p. Rows where it does not are sampled by `sorted_sample`, the full sort.

The candidates come from `top_candidates`, a grouped top-k: the maximum of each group of c tokens, the K
groups with the best maxima, then a top-k within them. It is exact: the K best maxima are K distinct elements
at least as large as the K-th best element, so every one of the K best elements lies in one of those groups.
`greedy` finds the argmax from the maxima of contiguous column groups (torch's CPU argmax is several times
slower than a max reduction). Where the native CPU kernels are loaded, both run one native pass over each float32
row instead (kernels/select_cpu.py; same results, equal top-k values ordered by column).
"""

from __future__ import annotations

import torch

from sglpy.kernels.select_cpu import argmax_rows, sample_rows, select_lib, topk_rows

CANDIDATES = 256  # candidates of a top_p / min_p row without top_k


def _group_size(vocab: int, k: int) -> int:
    """Tokens per group for the grouped top-k (about sqrt(vocab / k), a power of two dividing vocab); 0: none."""
    c = 1
    while (2 * c) ** 2 * k <= vocab and vocab % (2 * c) == 0:
        c *= 2
    return c if c >= 4 else 0


def top_candidates(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row of x [n, vocab], descending, and their column ids ([n, k] each)."""
    n, vocab = x.shape
    if not x.is_cuda:
        lib = select_lib(x)
        return topk_rows(lib, x, k) if lib is not None else _pyramid_top(x.contiguous(), k)
    c = _group_size(vocab, k)
    if not c:
        return x.topk(k, dim=-1)
    x = x.contiguous()
    stride = vocab // c  # group g holds columns g, g + stride, g + 2 * stride, ...: a vectorised max over c rows
    group_max = x.view(n, c, stride).amax(dim=1)  # [n, stride]
    groups = group_max.topk(k, dim=-1).indices  # [n, k]
    cols = (groups[:, :, None] + torch.arange(c, device=x.device) * stride).view(n, k * c)
    vals, j = x.gather(1, cols).topk(k, dim=-1)  # [n, k]
    return vals, cols.gather(1, j)


# torch's CPU topk costs ~8x more per element on rows wider than ~500 than on narrow ones, so on CPU every topk
# runs on a narrow row: a pyramid of group maxima, walked down from its top
PYRAMID_TOP = 384  # a level at most this wide (or 2k) is the pyramid's top
FIRST_FACTOR = 8  # columns per group of the first level (a strided max over the logits: one pass)
FACTOR = 4  # groups per group of the levels above


def _pyramid_top(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """top_candidates on CPU for a contiguous x [n, vocab].

    Level i+1 holds the maxima of level i's groups (group g: columns g, g + w, g + 2w, ... of the first f * w;
    the few columns past them are candidates of their own). The k best of a level lie in the groups of the k best
    maxima of the level above (or its extra columns), so each step down is a topk over k * f candidates."""
    n = x.shape[0]
    levels, factors, f = [x], [], FIRST_FACTOR
    while levels[-1].shape[1] > max(PYRAMID_TOP, 2 * k) and levels[-1].shape[1] // f >= k:
        a = levels[-1]
        w = a.shape[1] // f
        levels.append(a[:, :f * w].view(n, f, w).amax(dim=1))  # [n, w]
        factors.append(f)
        f = FACTOR
    vals, idx = levels[-1].topk(k, dim=-1)  # [n, k]
    for a, f in zip(reversed(levels[:-1]), reversed(factors)):
        width = a.shape[1]
        w = width // f
        cols = (idx[:, :, None] + torch.arange(f) * w).view(n, k * f)
        if f * w < width:
            cols = torch.cat([cols, torch.arange(f * w, width).expand(n, -1)], dim=1)
        vals, j = a.gather(1, cols).topk(k, dim=-1)  # [n, k]
        idx = cols.gather(1, j)
    return vals, idx


GREEDY_GROUP = 128  # columns per group in greedy's max pass: long enough for a vectorised contiguous reduction


def greedy(x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for x [n, vocab] (the first maximum, NaN counting as the largest), one pass on CPU.

    The maxima of contiguous column groups (one vectorised reduction, at memory speed), the first group holding
    the row's maximum (it holds the row's first maximum: the groups are in column order), the argmax within it."""
    n, vocab = x.shape
    lib = select_lib(x)
    if lib is not None:
        return argmax_rows(lib, x)
    c = GREEDY_GROUP
    if x.is_cuda or n < 4 or vocab < 4 * c:  # a few rows: the grouped pass's extra small ops cost more than it saves
        return x.argmax(dim=-1)
    x = x.contiguous()
    full = vocab // c
    group_max = x[:, :full * c].view(n, full, c).amax(dim=-1)  # [n, full]
    if full * c < vocab:  # the last columns: one shorter group
        group_max = torch.cat([group_max, x[:, full * c:].amax(dim=-1, keepdim=True)], dim=1)
    g = group_max.argmax(dim=-1)  # [n]
    cols = (g[:, None] * c + torch.arange(c, device=x.device)).clamp_(max=vocab - 1)  # [n, c] ascending columns
    return cols.gather(1, x.gather(1, cols).argmax(dim=-1, keepdim=True))[:, 0]


def inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Column sampled from each row of unnormalised weights [n, m] with uniforms u [n]."""
    cdf = weights.cumsum(dim=-1)
    target = (u * cdf[:, -1]).unsqueeze(1)
    idx = torch.searchsorted(cdf, target, right=True)[:, 0]
    return idx.clamp_(max=weights.shape[1] - 1)


def sorted_sample(logits: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor, min_p: torch.Tensor,
                  u: torch.Tensor, stable: bool = False) -> torch.Tensor:
    """The full-sort sampler (the fallback, and the semantics): logits [n, vocab] already divided by the
    temperature; top_k [n] int64 (vocab for all), top_p, min_p, u [n] float32 -> [n] token ids.
    stable: tied logits keep their vocabulary order (deterministic inference: how a sort orders ties otherwise
    depends on the number of rows, and a tie's order decides which token an inverse-CDF draw lands on)."""
    sorted_l, idx = logits.sort(dim=-1, descending=True, stable=stable)
    rank = torch.arange(sorted_l.shape[1], device=logits.device)[None, :]
    sorted_l = sorted_l.masked_fill(rank >= top_k[:, None], float("-inf"))
    probs = torch.softmax(sorted_l, dim=-1)
    probs = probs.masked_fill((probs.cumsum(-1) - probs) > top_p[:, None], 0.0)
    probs = probs.masked_fill(probs < (min_p[:, None] * probs[:, :1]), 0.0)
    return idx.gather(1, inverse_cdf(probs, u)[:, None])[:, 0]


def candidate_sample(logits: torch.Tensor, temp: torch.Tensor, top_k: torch.Tensor, top_p: torch.Tensor,
                     min_p: torch.Tensor, u: torch.Tensor, k: int, whole_row: bool,
                     rules: tuple[bool, bool, bool] = (True, True, True)) -> tuple[torch.Tensor, torch.Tensor]:
    """Sample rows of logits [n, vocab] (not yet divided by temp [n]) from their k best candidates.

    top_k [n] int64 is each row's own top_k (<= k) or k; with whole_row (rows without top_k) top_p is measured
    against the whole row's mass. Returns (token ids [n], exact [n] bool): rows not exact need sorted_sample.
    rules: whether some row's top_k is below k, some top_p below 1, some min_p above 0, as the caller knows from
    the host; a rule no row has is skipped (its mask would keep every candidate: the same result, fewer ops).
    """
    some_k, some_p, some_min_p = rules
    vals, cols = top_candidates(logits, k)  # [n, k]: dividing by a positive temperature keeps the order
    scaled = vals / temp[:, None]
    if some_k:
        rank = torch.arange(k, device=logits.device)[None, :]
        scaled = scaled.masked_fill(rank >= top_k[:, None], float("-inf"))
    w = torch.exp(scaled - scaled[:, :1])  # [n, k] probabilities relative to the best candidate (1.0)
    lib = None if whole_row else select_lib(w)
    if lib is not None:  # the cuts and the draw in one native call (the same arithmetic: kernels/select_cpu.py)
        pos = sample_rows(lib, w, top_p if some_p else None, min_p if some_min_p else None, u)
        if pos is not None:
            return cols.gather(1, pos[:, None])[:, 0], torch.ones(vals.shape[0], dtype=torch.bool)
    cum = w.cumsum(dim=-1)
    if whole_row:
        # [n]: the whole row's mass relative to the best token; summed in float64 so that how torch splits the
        # sum (which can depend on the number of rows) does not show in float32
        mass = torch.exp(logits / temp[:, None] - scaled[:, :1]).sum(dim=-1, dtype=torch.float64).float()
    else:
        mass = cum[:, -1]
    # top_p 1 keeps everything (no mass comparison that rounding could tip)
    limit = torch.where(top_p < 1.0, top_p * mass, torch.full_like(mass, float("inf"))) if some_p or whole_row else None
    if whole_row:
        exact = (cum[:, -1] > limit) | (w[:, -1] < min_p)
    else:
        exact = torch.ones(vals.shape[0], dtype=torch.bool, device=logits.device)
    if some_p:
        w = w.masked_fill((cum - w) > limit[:, None], 0.0)
    if some_min_p:
        w = w.masked_fill(w < min_p[:, None], 0.0)
    return cols.gather(1, inverse_cdf(w, u)[:, None])[:, 0], exact

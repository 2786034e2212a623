"""Row-wise argmax and top-k of float32 logits, and the draw from top-k candidates, on CPU (csrc/select_rows.cpp),
beside their torch references.

The sampler's hot spots on CPU (runtime/engine/truncation.py): torch's CPU argmax runs several times slower than a
max reduction over the same row, and its topk slower still on wide rows; the native kernels make one pass over each
row. Results equal the references: argmax the first maximum (NaN counting as the largest), top-k the k largest values
descending with their columns (equal values by ascending column, where torch.topk leaves their order open). The
draw from candidates makes the top-p / min-p cuts and the inverse-CDF step in one call instead of ~10 small torch ops,
in the same float32 arithmetic (torch's CPU cumsum keeps a double running sum): the same positions, bit for bit.
"""

from __future__ import annotations

import ctypes
import functools

import torch

from .cpu_native import bind_signatures, native_lib

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
# typed here, on first use, rather than in cpu_native.SIGNATURES: the entry points only this module calls
_SIGNATURES = {
    "sglpy_argmax_rows": (_I64, [_P, _I64, _I64, _I64, _P, _I32]),
    "sglpy_topk_rows": (_I64, [_P, _I64, _I64, _I64, _I64, _P, _P, _I32]),
    "sglpy_sample_rows": (_I64, [_P, _I64, _I64, _P, _P, _P, _P]),
}


@functools.lru_cache(maxsize=None)
def _typed(lib: ctypes.CDLL) -> ctypes.CDLL:
    return bind_signatures(lib, _SIGNATURES)


def select_lib(x: torch.Tensor) -> ctypes.CDLL | None:
    """The native library when it can read x (float32 [n, vocab] on CPU, unit column stride), else None."""
    if x.device.type != "cpu" or x.dtype != torch.float32 or x.dim() != 2 or x.shape[1] < 1 or x.stride(1) != 1:
        return None
    lib = native_lib()
    return _typed(lib) if lib is not None else None


def argmax_rows(lib: ctypes.CDLL, x: torch.Tensor) -> torch.Tensor:
    """x.argmax(dim=-1) for x accepted by select_lib -> [n] int64."""
    n, vocab = x.shape
    out = torch.empty(n, dtype=torch.int64)
    if lib.sglpy_argmax_rows(x.data_ptr(), n, vocab, x.stride(0), out.data_ptr(), torch.get_num_threads()) != 0:
        raise ValueError(f"argmax over rows of {vocab} columns")
    return out


def topk_rows(lib: ctypes.CDLL, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k largest values of each row of x (accepted by select_lib), descending, and their columns ([n, k] each)."""
    n, vocab = x.shape
    if not 1 <= k <= vocab:
        raise ValueError(f"top-k of rows of {vocab} columns needs 1 <= k <= {vocab}, got k={k}")
    vals = torch.empty((n, k), dtype=torch.float32)
    idx = torch.empty((n, k), dtype=torch.int64)
    lib.sglpy_topk_rows(x.data_ptr(), n, vocab, x.stride(0), k, vals.data_ptr(), idx.data_ptr(),
                        torch.get_num_threads())
    return vals, idx


def topk_rows_reference(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The oracle: torch.topk (its order among equal values is unspecified; the kernel's is by column)."""
    return x.topk(k, dim=-1)


def _f32_rows(t: torch.Tensor | None, n: int) -> bool:
    return t is None or (t.device.type == "cpu" and t.dtype == torch.float32 and t.shape == (n,) and t.is_contiguous())


def sample_rows(lib: ctypes.CDLL, w: torch.Tensor, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
                u: torch.Tensor) -> torch.Tensor | None:
    """sample_rows_reference in one native pass: w float32 [n, k] (accepted by select_lib, contiguous), top_p /
    min_p (None: no such cut) and u float32 [n] -> [n] int64 candidate positions; None where the kernel declines
    (a NaN in w, or inputs it cannot read): the caller runs the reference."""
    n, k = w.shape
    if not (w.is_contiguous() and _f32_rows(top_p, n) and _f32_rows(min_p, n) and _f32_rows(u, n)):
        return None
    out = torch.empty(n, dtype=torch.int64)
    ok = lib.sglpy_sample_rows(w.data_ptr(), n, k, None if top_p is None else top_p.data_ptr(),
                               None if min_p is None else min_p.data_ptr(), u.data_ptr(), out.data_ptr())
    return out if ok == 0 else None


def sample_rows_reference(w: torch.Tensor, top_p: torch.Tensor | None, min_p: torch.Tensor | None,
                          u: torch.Tensor) -> torch.Tensor:
    """The oracle (the sampler's torch ops): cut w [n, k] (descending candidates' weights) to the smallest prefix
    whose mass reaches top_p of the row's and to weights >= min_p, then the inverse-CDF position for u [n]."""
    cum = w.cumsum(dim=-1)
    if top_p is not None:
        mass = cum[:, -1]
        limit = torch.where(top_p < 1.0, top_p * mass, torch.full_like(mass, float("inf")))
        w = w.masked_fill((cum - w) > limit[:, None], 0.0)
    if min_p is not None:
        w = w.masked_fill(w < min_p[:, None], 0.0)
    cdf = w.cumsum(dim=-1)
    idx = torch.searchsorted(cdf, (u * cdf[:, -1]).unsqueeze(1), right=True)[:, 0]
    return idx.clamp_(max=w.shape[1] - 1)

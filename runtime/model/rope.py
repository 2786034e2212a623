"""Rotary tables of the non-Llama families: one per layer type (Gemma 3's local and global bases), partial
rotary (Phi-4-mini), and the scalings the kernels' build_rope_cache lacks (LongRoPE, YaRN) via transformers'
own inverse-frequency functions; plus the torch rotation the decoder applies."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglpy.kernels import build_rope_cache

_KERNEL_TYPES = ("default", "linear", "llama3")
_HF_TYPES = ("longrope", "yarn")


@dataclass(frozen=True)
class RopeTable:
    """cos/sin rows per position: cache [max_pos, rot_dim] (cos in the first half, sin in the second)."""

    cache: torch.Tensor
    rot_dim: int  # rotated leading dims of each head (head_dim unless partial rotary)


def _params(config, layer_type: str | None) -> dict:
    params = dict(getattr(config, "rope_parameters", None) or {})
    if layer_type is not None and layer_type in params:
        params = dict(params[layer_type])
    if "rope_theta" not in params:
        params["rope_theta"] = getattr(config, "rope_theta", 10000.0)
    params.setdefault("rope_type", params.get("type", "default"))
    return params


def layer_rope_keys(config) -> list[str | None]:
    """Which table each layer reads: its layer type when the config gives per-type rope parameters."""
    params = getattr(config, "rope_parameters", None) or {}
    types = getattr(config, "layer_types", None) or [None] * config.num_hidden_layers
    return [t if t is not None and isinstance(params.get(t), dict) else None for t in types]


def _table(config, layer_type: str | None, head_dim: int, max_pos: int) -> RopeTable:
    p = _params(config, layer_type)
    partial = float(p.get("partial_rotary_factor", getattr(config, "partial_rotary_factor", 1.0) or 1.0))
    rd = int(head_dim * partial)
    kind = p["rope_type"]
    if kind in _KERNEL_TYPES:
        scaling = None if kind == "default" else p
        return RopeTable(build_rope_cache(rd, max_pos, float(p["rope_theta"]), scaling), rd)
    if kind not in _HF_TYPES:
        raise ValueError(f"unsupported rope type {kind!r} for {type(config).__name__} "
                         f"(supported: {_KERNEL_TYPES + _HF_TYPES})")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    init = ROPE_INIT_FUNCTIONS[kind]
    inv, factor = init(config, None, layer_type=layer_type) if layer_type else init(config, None)
    pos = torch.arange(max_pos, dtype=torch.float32)
    freqs = torch.outer(pos, inv.float())
    if kind == "longrope":
        # positions past the original context use the long factors (as SGLang does; HF switches every position
        # to them once a sequence passes that length)
        orig = int(p.get("original_max_position_embeddings") or config.original_max_position_embeddings)
        kw = dict(layer_type=layer_type) if layer_type else {}
        inv_long, _ = init(config, None, seq_len=orig + 1, **kw)
        freqs[orig:] = torch.outer(pos[orig:], inv_long.float())
    return RopeTable(torch.cat([freqs.cos() * factor, freqs.sin() * factor], dim=-1), rd)


def rope_tables(config, head_dim: int, max_pos: int) -> dict[str | None, RopeTable]:
    """One table per distinct layer rope key (see layer_rope_keys)."""
    return {key: _table(config, key, head_dim, max_pos) for key in dict.fromkeys(layer_rope_keys(config))}


@dataclass(frozen=True)
class RopeRows:
    """One forward's cos/sin rows for its positions: [tokens, 1, rot_dim // 2] each."""

    cos: torch.Tensor
    sin: torch.Tensor


def gather_rows(table: RopeTable, positions: torch.Tensor) -> RopeRows:
    """cos/sin of `positions` (checked against the table's length on CPU; on CUDA the check would sync with the host,
    which a CUDA-graph capture forbids: the scheduler keeps positions inside the context, as for Llama's Triton
    rotary)."""
    if positions.numel() and not positions.is_cuda:
        lo, hi = int(positions.min()), int(positions.max())
        if lo < 0 or hi >= table.cache.shape[0]:
            raise ValueError(f"positions must lie in [0, {table.cache.shape[0]}), got min {lo} max {hi}")
    half = table.rot_dim // 2
    cs = table.cache[positions.long()].to(torch.float32)[:, None, :]
    return RopeRows(cs[..., :half], cs[..., half:])


def rotate(x: torch.Tensor, rows: RopeRows) -> torch.Tensor:
    """HF's x * cos + rotate_half(x) * sin on the leading rot_dim dims of each head; x: [tokens, heads, head_dim]."""
    half = rows.cos.shape[-1]
    xf = x.to(torch.float32)
    x1, x2, rest = xf[..., :half], xf[..., half:2 * half], xf[..., 2 * half:]
    out = torch.cat([x1 * rows.cos - x2 * rows.sin, x2 * rows.cos + x1 * rows.sin, rest], dim=-1)
    return out.to(x.dtype)

"""Qwen2-VL's multimodal rotary positions (M-RoPE): each token has a (time, row, column) position; text tokens
advance all three together, an image's tokens take their grid coordinates after the text before them. The head's
rotary frequencies are split into three sections, each rotated by one of the three positions."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .rope import RopeRows


@dataclass(frozen=True)
class MRopePositions:
    """A prompt's positions [3, prompt_len] and the offset of every later token (its index + delta)."""

    positions: torch.Tensor  # [3, prompt_len] int64, on the host
    delta: int


def mrope_positions(prompt_len: int, spans: list[tuple[int, int]], grids: list[tuple[int, int, int]],
                    merge: int) -> MRopePositions:
    """Positions of a prompt whose image tokens fill `spans` ([start, end) each, in order) for the images of
    `grids` (t, h, w in patches), as transformers' get_rope_index computes them."""
    parts, cur, at = [], 0, 0
    for (start, end), (t, h, w) in zip(spans, grids):
        if start > at:
            parts.append(torch.arange(start - at).expand(3, -1) + cur)
            cur += start - at
        gh, gw = h // merge, w // merge
        if t * gh * gw != end - start:
            raise ValueError(f"an image's grid {t}x{gh}x{gw} does not fit its {end - start} tokens")
        tt, hh, ww = torch.meshgrid(torch.arange(t), torch.arange(gh), torch.arange(gw), indexing="ij")
        parts.append(torch.stack([tt, hh, ww]).reshape(3, -1) + cur)
        cur += max(gh, gw)
        at = end
    if prompt_len > at:
        parts.append(torch.arange(prompt_len - at).expand(3, -1) + cur)
        cur += prompt_len - at
    pos = torch.cat(parts, dim=1).long() if parts else torch.zeros(3, 0, dtype=torch.long)
    return MRopePositions(pos, int(pos.max()) + 1 - prompt_len if prompt_len else 0)


def mrope_sections(section: list[int], half: int) -> torch.Tensor:
    """Which of the three positions rotates each of the head's `half` frequencies: [half] int64."""
    if sum(section) != half:
        raise ValueError(f"mrope_section {section} must sum to head_dim / 2 = {half}")
    return torch.cat([torch.full((n,), i % 3, dtype=torch.long) for i, n in enumerate(section)])


def mrope_rows(cache: torch.Tensor, positions: torch.Tensor, sections: torch.Tensor) -> RopeRows:
    """cos/sin rows [tokens, 1, half] of positions [3, tokens] from a rope cache [max_pos, 2 * half]."""
    half = sections.shape[0]
    if positions.numel() and not positions.is_cuda:
        hi = int(positions.max())
        if int(positions.min()) < 0 or hi >= cache.shape[0]:
            raise ValueError(f"positions must lie in [0, {cache.shape[0]}), got max {hi}")
    rows = cache[positions.long()].to(torch.float32)  # [3, tokens, 2 * half]
    pick = sections.to(rows.device)[None, None, :].expand(1, rows.shape[1], half)
    cos = rows[..., :half].gather(0, pick)[0]
    sin = rows[..., half:].gather(0, pick)[0]
    return RopeRows(cos[:, None, :], sin[:, None, :])

"""One forward's multimodal inputs: which packed rows are image tokens and their embeddings (the vision encoder's
output, cached by image content hash, bounded), and M-RoPE positions for models that rotate by them."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class MultimodalBatch:
    """What a vision model's forward reads beyond the token ids."""

    rows: torch.Tensor  # [k] int64 packed rows that are image tokens
    embeds: torch.Tensor  # [k, hidden] their embeddings
    mrope: torch.Tensor | None  # [3, tokens] int64 M-RoPE positions, or None (plain positions)


@dataclass
class EncoderStats:
    """Counters of the encoder cache (reported in server info and read by tests and the benchmark)."""

    images_encoded: int = 0  # images the vision encoder ran on
    cache_hits: int = 0  # images served from the cache


class EncoderCache:
    """Vision encoder outputs by image content hash, least recently used dropped past `max_tokens` tokens."""

    def __init__(self, max_tokens: int):
        self.max_tokens = max_tokens
        self._items: OrderedDict[int, torch.Tensor] = OrderedDict()
        self._tokens = 0
        self.stats = EncoderStats()

    def get(self, key: int) -> torch.Tensor | None:
        out = self._items.get(key)
        if out is not None:
            self._items.move_to_end(key)
            self.stats.cache_hits += 1
        return out

    def put(self, key: int, value: torch.Tensor) -> None:
        if key in self._items or value.shape[0] > self.max_tokens:
            return
        self._items[key] = value
        self._tokens += value.shape[0]
        while self._tokens > self.max_tokens:
            _, old = self._items.popitem(last=False)
            self._tokens -= old.shape[0]

    def clear(self) -> None:
        self._items.clear()
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._items)


def _entry_len(e) -> int:
    return 1 + len(e.draft) if e.draft else e.extend_len


def build_mm_batch(model, cache: EncoderCache, entries, positions: list[int], device) -> MultimodalBatch | None:
    """The image rows of this forward (embedded from the cache or one encoder call over the missing images) and
    M-RoPE positions; None when no entry carries images."""
    if not any(e.req.mm is not None for e in entries):
        return None
    spans, found, need = [], {}, {}  # spans: (packed row, image, its first token in the span, count)
    offset = 0
    for e in entries:
        mm, n = e.req.mm, _entry_len(e)
        if mm is not None:
            lo, hi = e.prefix_len, e.prefix_len + n
            for im in mm.images:
                a, b = max(lo, im.start), min(hi, im.end)
                if a < b:  # this forward computes some of the image's tokens (a chunk may hold part of it)
                    spans.append((offset + a - lo, im, a - im.start, b - a))
                    if im.key not in found and im.key not in need:
                        hit = cache.get(im.key)
                        if hit is not None:
                            found[im.key] = hit
                        else:
                            need[im.key] = im
        offset += n
    if need:  # one encoder call for every image this forward misses
        todo = list(need.values())
        for im, out in zip(todo, model.encode(todo)):
            cache.stats.images_encoded += 1
            cache.put(im.key, out)
            found[im.key] = out
    rows, embeds = [], []
    for row, im, first, count in spans:
        rows.append(torch.arange(row, row + count))
        embeds.append(found[im.key][first:first + count])
    hidden = model.model.embed_tokens.weight.shape[1]
    rows_t = torch.cat(rows).to(device) if rows else torch.zeros(0, dtype=torch.int64, device=device)
    embeds_t = torch.cat(embeds) if embeds else torch.zeros(0, hidden, device=device)
    return MultimodalBatch(rows_t, embeds_t, _mrope(entries, positions, device) if model.mrope else None)


def _mrope(entries, positions: list[int], device) -> torch.Tensor:
    """[3, tokens]: a prompt token's precomputed position, every later token its index + the request's delta."""
    pos = torch.tensor(positions, dtype=torch.int64).expand(3, -1).clone()
    offset = 0
    for e in entries:
        n, mm = _entry_len(e), e.req.mm
        if mm is not None and mm.mrope is not None:
            kv = torch.tensor(positions[offset:offset + n], dtype=torch.int64)
            prompt = mm.mrope.positions
            inside = kv < prompt.shape[1]
            seg = (kv + mm.mrope.delta).expand(3, -1).clone()
            if inside.any():
                seg[:, inside] = prompt[:, kv[inside]]
            pos[:, offset:offset + n] = seg
        offset += n
    return pos.to(device)

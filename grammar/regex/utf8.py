"""Code-point sets (sorted disjoint intervals) and their UTF-8 byte-range sequences."""

from __future__ import annotations

import functools
import re
from typing import Iterator

MAX_CP = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Intervals = tuple[tuple[int, int], ...]


def normalize(intervals) -> Intervals:
    """Sort and merge overlapping/adjacent intervals; surrogates are removed (not encodable)."""
    out: list[list[int]] = []
    for lo, hi in sorted(intervals):
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    res = []
    for lo, hi in out:
        if hi < SURROGATES[0] or lo > SURROGATES[1]:
            res.append((lo, hi))
            continue
        if lo < SURROGATES[0]:
            res.append((lo, SURROGATES[0] - 1))
        if hi > SURROGATES[1]:
            res.append((SURROGATES[1] + 1, hi))
    return tuple(res)


def complement(intervals: Intervals) -> Intervals:
    """All encodable code points not in `intervals`."""
    out = []
    prev = 0
    for lo, hi in normalize(intervals):
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CP:
        out.append((prev, MAX_CP))
    return normalize(out)


@functools.lru_cache(maxsize=None)
def _all_chars() -> str:
    return "".join(map(chr, range(SURROGATES[0]))) + "".join(map(chr, range(SURROGATES[1] + 1, MAX_CP + 1)))


@functools.lru_cache(maxsize=None)
def category(name: str, ascii_only: bool) -> Intervals:
    """Code points matched by Python `re` for \\d, \\w or \\s (unicode unless ascii_only)."""
    pattern = {"digit": r"\d+", "word": r"\w+", "space": r"\s+"}[name]
    text = _all_chars()
    flags = re.ASCII if ascii_only else 0
    spans = []
    for m in re.finditer(pattern, text, flags):
        lo, hi = m.start(), m.end() - 1
        # indices past the surrogate gap are shifted in _all_chars()
        spans.append((_idx_to_cp(lo), _idx_to_cp(hi)))
    return normalize(spans)


_PROPERTY_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*(?:=[A-Za-z0-9_]+)?")


@functools.lru_cache(maxsize=256)
def unicode_property(name: str) -> Intervals:
    """Code points of an ECMA-262 / Perl Unicode property escape `\\p{name}`: a General_Category (`L`, `Letter`,
    `Lu`, `gc=Nd`), a script (`Script=Greek`, `sc=Latn`, `scx=...`) or a binary property (`Alphabetic`,
    `White_Space`, `ASCII`, `Any`), as the `regex` package's Unicode tables define them. ValueError if unknown."""
    import regex  # a dependency of the project (its Unicode property tables)

    if not _PROPERTY_NAME.fullmatch(name):
        raise ValueError(f"invalid Unicode property name {name!r}")
    try:
        pat = regex.compile(r"\p{" + name + "}+")
    except regex.error as e:
        raise ValueError(f"unknown Unicode property {name!r} ({e})") from None
    spans = [(_idx_to_cp(m.start()), _idx_to_cp(m.end() - 1)) for m in pat.finditer(_all_chars())]
    return normalize(spans)


def _idx_to_cp(i: int) -> int:
    return i if i < SURROGATES[0] else i + (SURROGATES[1] - SURROGATES[0] + 1)


@functools.lru_cache(maxsize=4096)
def set_sequences(intervals: Intervals) -> tuple[tuple[tuple[int, int], ...], ...]:
    """All byte-range sequences of a code-point set (memoised: JSON regexes repeat the same classes)."""
    return tuple(seq for lo, hi in intervals for seq in byte_sequences(lo, hi))


_LEN_BOUNDS = ((0, 0x7F), (0x80, 0x7FF), (0x800, 0xFFFF), (0x10000, MAX_CP))


def byte_sequences(lo: int, hi: int) -> Iterator[tuple[tuple[int, int], ...]]:
    """Split a code-point range into sequences of byte ranges whose product is its UTF-8 encoding."""
    for plo, phi in normalize([(lo, hi)]):
        for blo, bhi in _LEN_BOUNDS:
            a, b = max(plo, blo), min(phi, bhi)
            if a <= b:
                yield from _split_same_length(a, b)


def _split_same_length(lo: int, hi: int) -> Iterator[tuple[tuple[int, int], ...]]:
    n = len(chr(lo).encode("utf-8"))
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m != 0:
                yield from _split_same_length(lo, lo | m)
                yield from _split_same_length((lo | m) + 1, hi)
                return
            if hi & m != m:
                yield from _split_same_length(lo, (hi & ~m) - 1)
                yield from _split_same_length(hi & ~m, hi)
                return
    a, b = chr(lo).encode("utf-8"), chr(hi).encode("utf-8")
    yield tuple(zip(a, b))

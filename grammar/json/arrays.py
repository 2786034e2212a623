"""JSON arrays: items / prefixItems / min-maxItems, contains with min-maxContains, uniqueItems on finite domains."""

from __future__ import annotations

import json
from dataclasses import replace

from ..errors import GrammarError, is_fatal
from . import automata
from .normal import Norm, Sub

MAX_UNIQUE_VALUES = 8  # uniqueItems: distinct item values we can track (2^n subsets)


def _positions(conv, n: Norm):
    """Subschemas per leading position, the subschemas of every later position, and how many lead."""
    lead = max([len(n.prefix)] + [k for k, _ in n.items])
    pos = [(n.prefix[i] if i < len(n.prefix) else []) + [s for k, s in n.items if k <= i] for i in range(lead)]
    rest = [s for _, s in n.items]
    return pos, rest, lead


def _item(conv, subs: list[Sub], level: int, mode: str) -> str | None:
    if not subs:
        return conv.free_value(level) if mode == "under" else automata.loose(conv)
    if mode == "under":
        return conv.under_subs(subs)
    return conv.over_norm(conv.norm(subs), subs[0].ctx)


def array_under(conv, n: Norm, ctx) -> str | None:
    return _array(conv, n, ctx, "under")


def array_over(conv, n: Norm, ctx) -> str | None:
    return _array(conv, n, ctx, "over")


def _array(conv, n: Norm, ctx, mode: str) -> str | None:
    lo, hi = n.min_items, n.max_items
    if hi is not None and hi < lo:
        return None
    pos, rest, lead = _positions(conv, n)
    uneval = [s for k, s in n.uneval if k == "unevaluatedItems"]
    if uneval and mode == "under":
        if n.contains:
            conv.refuse("unevaluatedItems", "next to contains")
        elif not rest:
            rest = uneval
    pre = [_item(conv, p, ctx.level + 1, mode) for p in pos]
    # the item is written twice, and maxItems copies it: as one module it is called, not copied
    many = hi is not None and hi > 2 and not conv.plain_text
    item = automata.compact(conv, _item(conv, rest, ctx.level + 1, mode), "items", 0 if many else 200)
    out = _sequence(conv, pre, item, lo, hi)
    for c, cmin, cmax in n.contains:
        if out is None:
            return None
        out = automata.combine(conv, out, _contains_filter(conv, c, cmin, cmax, rest, mode), "and", "contains")
    if n.unique and mode == "under" and out is not None and (hi is None or hi > 1):
        if not _unique_trackable(conv, pre, item, hi) and lo <= 1:
            # distinctness is not regular here; arrays of at most one item are unique (a sound subset)
            conv.narrowed.add("uniqueItems: arrays of at most 1 item (the items' domain is unbounded)")
            return _array(conv, replace(n, max_items=1), ctx, mode)
        out = _unique(conv, pre, item, lo, hi, out)
    return out


def _sequence(conv, pre: list, item: str | None, lo: int, hi: int | None) -> str | None:
    """`[` prefix items then repeated `item`, with lo..hi elements in all (None entries admit nothing)."""
    usable = next((i for i, p in enumerate(pre) if p is None), len(pre))
    cut = usable < len(pre)
    pre = pre[:usable]
    cap = hi
    if cut or item is None:
        cap = usable if cap is None else min(cap, usable)
    if cap is not None and cap < lo:
        return None
    c, oa, ca = conv.comma, conv.open_arr, conv.close_arr
    alts = []
    for k in range(lo, len(pre) + 1):
        if cap is not None and k > cap:
            break
        alts.append(oa + c.join(pre[:k]) + ca)
    if item is not None and (cap is None or cap > len(pre)):
        k_lo = max(lo - len(pre), 1)
        k_hi = None if cap is None else cap - len(pre)
        if pre:
            alts.append(oa + c.join(pre) + _repeat(c + item, k_lo, k_hi) + ca)
        else:
            alts.append(oa + item + _repeat(c + item, k_lo - 1, None if k_hi is None else k_hi - 1) + ca)
    alts = list(dict.fromkeys(alts))
    if not alts:
        return None
    return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"


def _contains_filter(conv, c: Sub, cmin: int, cmax: int | None, rest: list, mode: str) -> str | None:
    """Arrays (any items) with between cmin and cmax items valid under `c` (over: at least cmin)."""
    if mode == "over":
        cmax = None
    if cmax is not None and cmax < cmin:
        return None
    inside = _item(conv, rest + [c], c.ctx.level, mode) if mode == "under" else conv.over(c)
    loose = automata.loose(conv)
    if cmax is None:
        if cmin == 0:
            return _sequence(conv, [], loose, 0, None)
        other = loose
    else:
        other = automata.combine(conv, loose, conv.over(c), "diff", "contains")
    if inside is None and cmin > 0:
        return None
    cm, oa, ca = conv.comma, conv.open_arr, conv.close_arr
    alts = []
    if cmin == 0 and other is not None:
        alts.append(oa + f"(?:{other}(?:{cm}{other})*)?" + ca)
    elif cmin == 0:
        alts.append(oa + ca)
    if inside is not None and (cmax is None or cmax >= 1):
        lead = f"(?:{other}{cm})*" if other is not None else ""
        tail = f"(?:{cm}{other})*" if other is not None else ""
        first = max(cmin, 1) - 1
        more = _repeat(f"{cm}{lead}{inside}", first, None if cmax is None else cmax - 1)
        alts.append(oa + lead + inside + more + tail + ca)
    return "(?:" + "|".join(alts) + ")" if alts else None


def _unique_trackable(conv, pre: list, item: str | None, hi: int | None) -> bool:
    """uniqueItems can be enforced exactly: no tuple items, a small finite item domain."""
    if pre:
        return False
    try:
        texts = _finite_texts(conv, item)
    except GrammarError as e:
        if is_fatal(e):
            raise
        return False
    if texts is None:
        return False
    values: list = []
    for t in texts:
        v = json.loads(t)
        if not any(conv.json_eq(u, v) for u in values):
            values.append(v)
    return len(values) <= MAX_UNIQUE_VALUES or (hi is not None and hi <= 2)


def _unique(conv, pre: list, item: str | None, lo: int, hi: int | None, base: str) -> str | None:
    """uniqueItems over a finite item domain: sequences of distinct values (one state per used set)."""
    if pre:
        conv.refuse("uniqueItems", "with prefixItems / tuple items")
        return base
    try:
        texts = _finite_texts(conv, item)
    except GrammarError as e:
        if is_fatal(e):
            raise
        texts = None  # too large to enumerate: not a small finite domain
    if texts is None:
        conv.refuse("uniqueItems", "the items can take unboundedly many values (distinctness is not regular; "
                                   "give the items an enum or a finite domain)")
        return base
    groups: list[tuple] = []  # (value, [texts])
    for t in texts:
        v = json.loads(t)
        for g in groups:
            if conv.json_eq(g[0], v):
                g[1].append(t)
                break
        else:
            groups.append((v, [t]))
    if len(groups) > MAX_UNIQUE_VALUES and (hi is None or hi > 2):
        conv.refuse("uniqueItems", f"{len(groups)} distinct item values (limit {MAX_UNIQUE_VALUES})")
        return base
    import re

    value_re = ["(?:" + "|".join(re.escape(t) for t in ts) + ")" for _, ts in groups]
    top = len(groups) if hi is None else min(hi, len(groups))
    memo: dict[frozenset, str | None] = {}

    def rest_of(used: frozenset) -> str | None:
        if used in memo:
            return memo[used]
        alts = ["" if len(used) >= lo else None]
        if len(used) < top:
            for i, vr in enumerate(value_re):
                if i not in used:
                    r = rest_of(used | {i})
                    if r is not None:
                        alts.append(conv.comma + vr + r)
        alts = [a for a in alts if a is not None]
        out = None if not alts else automata.atom(conv, automata.to_dfa(conv, "(?:" + "|".join(alts) + ")", "uniqueItems"))
        memo[used] = out
        return out

    firsts = []
    if lo == 0:
        firsts.append("")
    for i, vr in enumerate(value_re):
        r = rest_of(frozenset({i}))
        if r is not None:
            firsts.append(vr + r)
    if not firsts:
        return None
    uniq = conv.open_arr + "(?:" + "|".join(firsts) + ")" + conv.close_arr
    return automata.combine(conv, base, uniq, "and", "uniqueItems")


def _finite_texts(conv, item: str | None, limit: int = 64) -> list[str] | None:
    """All texts of a finite item language (None if infinite or larger than `limit`)."""
    if item is None:
        return []
    d = automata.to_dfa(conv, item, "items")
    out: list[str] = []
    stack = [(d.initial, b"", frozenset())]
    while stack:
        s, text, seen = stack.pop()
        if s in seen:
            return None  # a cycle: infinitely many texts
        if d.accepting[s]:
            out.append(text.decode("utf-8", "replace"))
            if len(out) > limit:
                return None
        row = d.trans[s]
        for b in range(256):
            t = int(row[b])
            if t:
                stack.append((t, text + bytes([b]), seen | {s}))
        if len(stack) > 50_000:
            return None
    return out


def _repeat(unit: str, lo: int, hi: int | None) -> str:
    if hi is not None and hi <= 0:
        return ""
    if hi is None:
        return f"(?:{unit}){{{lo},}}" if lo else f"(?:{unit})*"
    return f"(?:{unit}){{{lo},{hi}}}"


"""JSON objects: properties in schema order, pattern/additional/unevaluated extras, names, counts, dependencies.

Generated objects list the named properties first (schema order), then free-form keys; free-form keys are
only generated where the schema gives them a schema (patternProperties, a non-trivial additionalProperties)
or the object has no named properties at all. The over-approximation is order-insensitive and reads
duplicate keys as `json.loads` does (the last one wins).
"""

from __future__ import annotations

import json
import re
from itertools import combinations

from . import formats as F
from ..errors import GrammarError
from . import automata, strings
from .normal import Norm
from ..regex.nfa import OptionalSlots
from ..rtn.program import Program

MAX_PATTERN_REGIONS = 3  # patterns whose every combination gets its own key region
MAX_OVER_FILTERS = 6  # over-approximation: constraints kept per object (the rest dropped: still a superset)


# ---- shared pieces --------------------------------------------------------------------------------
def _key(conv, name: str) -> str:
    return '"' + automata.atom(conv, strings.key_body_dfa(conv, name)) + '"'


def _lp(conv) -> str:
    return F.STRING + conv.colon + automata.loose(conv)


def _loose_obj(conv, pair: str | None = None) -> str:
    p = pair or _lp(conv)
    return conv.open_obj + f"(?:{p}(?:{conv.comma}{p})*)?" + conv.close_obj


def _has(conv, name: str) -> str:
    lp, c = _lp(conv), conv.comma
    return conv.open_obj + f"(?:{lp}{c})*{_key(conv, name)}{conv.colon}{automata.loose(conv)}(?:{c}{lp})*" + conv.close_obj


def lacks_key(conv, name: str) -> str | None:
    """Every generated text that is not an object holding `name`."""
    return automata.combine(conv, automata.loose(conv), _has(conv, name), "diff", "dependentSchemas")


def key_matches(conv, pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except re.error as e:
        raise GrammarError(f"patternProperties: invalid pattern {pattern!r}: {e}") from None


def _name_ok(conv, name: str, names: list) -> bool:
    text = json.dumps(name, ensure_ascii=False).encode()
    for sub in names:
        r = conv.under(sub)
        if r is None or not Program(automata.module(conv, r, "propertyNames")).fullmatch(text):
            return False
    return True

# ---- under-approximation ---------------------------------------------------------------------------
def object_under(conv, n: Norm, ctx) -> str | None:
    if n.max_props is not None and n.max_props < n.min_props:
        return None
    uneval = [s for k, s in n.uneval if k == "unevaluatedProperties"]
    names = list(n.props) + [r for r in n.required if r not in n.props]
    slots = []
    for name in names:
        subs, evaluated = list(n.props.get(name, [])), name in n.props
        for own, pats, addl, explicit in n.groups:
            hit = [s for p, s in pats.items() if key_matches(conv, p, name)]
            subs += hit
            if name not in own and not hit:
                if addl is not None:
                    subs.append(addl)
                evaluated = evaluated or explicit
            evaluated = evaluated or bool(hit)
        if not evaluated:
            subs += uneval
        ok = not n.names or _name_ok(conv, name, n.names)
        value = None
        if ok:
            value = conv.under_subs(subs) if subs else conv.free_value(ctx.level + 1)
        if value is None:
            if name in n.required:
                return None
            continue
        value = automata.compact(conv, value, f"property {name!r}", 200)  # optional slots are written more than once
        slots.append((re.escape(json.dumps(name, ensure_ascii=False)) + conv.colon + value, name in n.required))
    extra = _extra_pair(conv, n, names, uneval, ctx)
    many = n.min_props < 2  # duplicate free-form keys would not count twice after json.loads
    out = conv.open_obj + _members(conv, slots, extra, many) + conv.close_obj
    if len(slots) > 2 and not conv.plain_text:  # its own module: text length no longer tells its size
        out = automata.compact(conv, out, "an object", 0)
    if n.min_props or n.max_props is not None:
        out = automata.combine(conv, out, _count_filter(conv, n.min_props, n.max_props), "and", "minProperties/maxProperties")
    return out  # dependentRequired was split on the key's presence before (schema.py, _under_norm)


def _members(conv, slots: list, extra: str | None, many: bool) -> str:
    """Slots in order (optional ones may be skipped), then free-form pairs; commas well placed."""
    c = conv.comma
    more = "" if extra is None else (f"(?:{c}{extra})*" if many else f"(?:{c}{extra})?")
    lone = "" if extra is None else (f"(?:{extra}(?:{c}{extra})*)?" if many else f"(?:{extra})?")
    if not slots:
        return lone
    req = [i for i, (_, r) in enumerate(slots) if r]
    if req:
        last, out = req[-1], ""
        for i, (f, r) in enumerate(slots):
            if i < last:
                out += f"{f}{c}" if r else f"(?:{f}{c})?"
            elif i == last:
                out += f
            else:
                out += f"(?:{c}{f})?"
        return out + more
    if not conv.plain_text:  # linear automaton instead of n^2 regex text
        key = ("slots", tuple(f for f, _ in slots), c, more, lone if extra is not None else "")
        got = conv.dfa_cache.get(key)
        if got is None:
            got = conv.dfa_cache[key] = automata.atom(conv, OptionalSlots(list(key[1]), c, key[3], key[4]))
        return got
    firsts = []
    for i, (f, _) in enumerate(slots):
        firsts.append(f + "".join(f"(?:{c}{g})?" for g, _ in slots[i + 1:]))
    nonempty = "(?:" + "|".join(firsts) + ")"
    if extra is None:
        return f"(?:{nonempty})?"
    return f"(?:{nonempty}{more}|{lone})"


def _extra_pair(conv, n: Norm, names: list, uneval: list, ctx) -> str | None:
    """Regex for one free-form `"key": value` pair (keys not among the named slots), or None."""
    pats = list(dict.fromkeys(p for _, ps, _, _ in n.groups for p in ps))
    explicit_addl = any(g[2] is not None for g in n.groups)
    free = not n.props and not n.required
    regions = [frozenset(q) for k in range(len(pats) + 1) for q in combinations(pats, k)] \
        if len(pats) <= MAX_PATTERN_REGIONS else [frozenset()] + [frozenset([p]) for p in pats]
    if not pats and not (explicit_addl or free):
        return None
    body = automata.atom(conv, automata.to_dfa(conv, F.STRING_CHAR + "*", "property names"))
    pairs = []
    for q in regions:
        if not q and not (explicit_addl or free):
            continue
        subs, evaluated = [], False
        for _, ps, addl, explicit in n.groups:
            hit = [ps[p] for p in q if p in ps]
            subs += hit
            if not hit and addl is not None:
                subs.append(addl)
            evaluated = evaluated or bool(hit) or explicit
        if not evaluated:
            subs += uneval
        value = conv.under_subs(subs) if subs else conv.free_value(ctx.level + 1)
        if value is None:
            continue
        key_body = body
        for p in pats:
            m = strings.pattern_key_atom(conv, p, "under" if p in q else "over")
            if m is None:
                if p in q:
                    key_body = None
                continue
            key_body = automata.combine(conv, key_body, m, "and" if p in q else "diff", "patternProperties")
            if key_body is None:
                break
        if names and key_body is not None:  # one difference with all named keys (a trie), not one per name
            named = "(?:" + "|".join(automata.atom(conv, strings.key_body_dfa(conv, k)) for k in names) + ")"
            key_body = automata.combine(conv, key_body, named, "diff", "property names")
        if key_body is None:
            continue
        key = '"' + key_body + '"'
        for sub in n.names:
            key = automata.combine(conv, key, conv.under(sub), "and", "propertyNames")
        if key is not None:
            pairs.append(key + conv.colon + value)
    if not pairs:
        return None
    return pairs[0] if len(pairs) == 1 else "(?:" + "|".join(pairs) + ")"


def _count_filter(conv, lo: int, hi: int | None) -> str:
    lp, c = _lp(conv), conv.comma
    if hi == 0:
        return conv.open_obj + conv.close_obj
    body = lp + (f"(?:{c}{lp}){{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}")
    return conv.open_obj + (body if lo > 0 else f"(?:{body})?") + conv.close_obj

# ---- over-approximation ----------------------------------------------------------------------------
def object_over(conv, n: Norm, ctx) -> str | None:
    if n.max_props is not None and n.max_props < n.min_props:
        return None
    # Filters are intersected most telling first (required discriminators: const/enum), and one is dropped
    # when it would grow the automaton past OVER_MAX_STATES: per-key "last occurrence" filters multiply
    # (3 states each), and dropping a filter keeps a superset.
    filters: list[tuple[int, str]] = []
    lp, c, cl, loose = _lp(conv), conv.comma, conv.colon, automata.loose(conv)
    names = list(n.props) + [r for r in n.required if r not in n.props]
    for name in names[:MAX_OVER_FILTERS * 2]:
        req = name in n.required
        subs = n.props.get(name)
        norm = conv.norm(subs) if subs else None
        x = conv.over_norm(norm, subs[0].ctx) if subs else loose
        if x == loose:
            if req:
                filters.append((1, _has(conv, name)))
            continue  # any value: no constraint on this property
        key = _key(conv, name)
        other = '"' + automata.atom(conv, _not_key_body(conv, name)) + '"' + cl + loose
        last = f"(?:{lp}{c})*{key}{cl}{x}(?:{c}{other})*" if x is not None else None
        none = f"(?:{other}(?:{c}{other})*)?"
        if req:
            body = last
        else:
            body = f"(?:{last}|{none})" if last else none
        if body is None:
            return None  # required, but no value can satisfy it
        disc = norm is not None and norm.enum is not None
        filters.append(((0 if disc else 1) if req else (2 if disc else 3), conv.open_obj + body + conv.close_obj))
    extra: list[str] = []
    for own, pats, addl, _ in n.groups:
        if addl is None or addl.schema is not False:
            continue
        allowed = [strings.key_body_dfa(conv, k) for k in own]
        keys = [automata.atom(conv, d) for d in allowed] + [strings.pattern_key_atom(conv, p, "over") for p in pats]
        if any(k is None for k in keys):
            continue
        pair = ('"(?:' + "|".join(keys) + ')"' + cl + loose) if keys else None
        extra.append(_loose_obj(conv, pair) if pair else conv.open_obj + conv.close_obj)
    for sub in n.names:
        key = conv.over(sub)
        extra.append(_loose_obj(conv, key + cl + loose) if key is not None else conv.open_obj + conv.close_obj)
    if n.min_props:
        extra.append(_count_filter(conv, n.min_props, None))
    for name, deps in n.dep_required:
        need = _loose_obj(conv)
        for d in deps:
            need = automata.combine(conv, need, _has(conv, d), "and", "dependentRequired")
        extra.append(automata.combine(conv, lacks_key(conv, name), need, "or", "dependentRequired"))
    filters += [(3, f) for f in extra]
    filters.sort(key=lambda pf: pf[0])
    if filters and filters[0][0] == 0:  # required discriminators (const/enum) tell objects apart cheaply
        filters = [pf for pf in filters if pf[0] == 0]
    out = _loose_obj(conv)
    for _, f in filters[:MAX_OVER_FILTERS + 2]:
        out = automata.narrow(conv, out, f, "an object's keywords")
        if out is None:
            return None
    return out


def _not_key_body(conv, name: str):
    key = ("notkey", name)
    got = conv.dfa_cache.get(key)
    if got is None:
        from ..regex.fsa import product

        body = automata.to_dfa(conv, F.STRING_CHAR + "*", "property names")
        got = conv.dfa_cache[key] = product(body, strings.key_body_dfa(conv, name), "diff", conv.max_states,
                                            conv.budget, "property names")
    return got

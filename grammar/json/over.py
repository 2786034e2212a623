"""Over-approximations of subschemas: supersets of the valid texts, for negations, oneOf and if/else.

Every valid text the converter can generate is accepted; where a constraint is not cheap to express it is
dropped (still a superset)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import GrammarError, is_fatal
from .normal import TYPES, Ctx, Norm, Sub, alt, is_json_type
from . import arrays, automata, negation, numbers, objects, strings

ANY_DEPTH = 2  # nesting of unconstrained values ({} / true / missing items) below where they start
OVER_LEVELS = 2  # over-approximations look this many nesting levels below where the negation applies


def over(conv, sub: Sub) -> str | None:
    """A superset of the texts valid under `sub`, cached per subschema: its depth cut-offs only loosen it,
    so the first one computed is sound at every position ($ref'd definitions are negated once)."""
    if sub.schema is True:
        return automata.loose(conv)
    key = ("over", id(sub.schema), sub.ctx.base, sub.ctx.scope)
    got = conv.sub_cache.get(key)
    if got is None:
        got = conv.sub_cache[key] = (sub.schema, _over(conv, sub))  # the schema pins its id
    return got[1]


def _over(conv, sub: Sub) -> str | None:
    if conv._over_origin is not None:
        return over_norm(conv, conv.norm([sub]), sub.ctx)
    conv._over_origin = sub.ctx.level
    try:
        return over_norm(conv, conv.norm([sub]), sub.ctx)
    finally:
        conv._over_origin = None


def over_norm(conv, n: Norm, ctx: Ctx) -> str | None:
    if n.false:
        return None
    if n.cut or ctx.level > conv.max_level + ANY_DEPTH or n == Norm():
        return automata.loose(conv)
    if conv._over_origin is not None and ctx.level > conv._over_origin + OVER_LEVELS:
        return automata.loose(conv)  # deeper detail only sharpens the superset; it costs products
    try:
        out = typed_over(conv, n, ctx)
    except GrammarError as e:
        if is_fatal(e):
            raise
        out = automata.loose(conv)
    for kind, payload in n.apps:
        if out is None:
            return None
        if kind in ("anyOf", "oneOf"):
            other = alt([over(conv, b) for b in payload])
        elif kind == "not":
            neg = negation.negation(conv, payload)
            other = safe_diff(conv, automata.loose(conv), payload) if neg is None else alt([over(conv, s) for s in neg])
        elif kind == "if":
            cond, then, els = payload
            yes = automata.combine(conv, over(conv, cond), over(conv, then), "and", "if/then")
            no = automata.combine(conv, safe_diff(conv, automata.loose(conv), cond), over(conv, els), "and", "if/else")
            other = alt([yes, no])
        else:  # dependentSchemas: the name is absent, or the dependent schema holds
            name, dep = payload
            other = alt([objects.lacks_key(conv, name), over(conv, dep)])
        out = automata.narrow(conv, out, other, kind)
    return automata.compact(conv, out, "a subschema")


def safe_diff(conv, universe: str, sub: Sub) -> str | None:
    """universe minus under(sub); when under(sub) is refused, the whole universe (still a superset)."""
    try:
        u = conv.under(sub)
    except GrammarError as e:
        if is_fatal(e):
            raise
        return universe
    return automata.combine(conv, universe, u, "diff", "not")


def typed_over(conv, n: Norm, ctx: Ctx) -> str | None:
    types = TYPES if n.types is None else [t for t in TYPES if t in n.types]
    if n.enum is not None:
        vals = [v for v in n.enum if any(_may_have_type(v, t, conv.draft) for t in types)]
        return alt([const_over(conv, v, ctx) for v in vals])
    return conv.typed_alt(n, ctx, types, "over")


def _may_have_type(v: Any, t: str, draft: str) -> bool:
    """Some text equal to v has type t (draft 4: 1.0 is no integer, but the text 1 equals it)."""
    if t == "integer" and isinstance(v, float) and not isinstance(v, bool) and v.is_integer():
        return True
    return is_json_type(v, t, draft)


def const_over(conv, v: Any, ctx: Ctx) -> str | None:
    """Every generated text equal to `v` after json.loads (key order and duplicate keys included)."""
    if isinstance(v, bool) or v is None:
        return re.escape(json.dumps(v))
    if isinstance(v, (int, float)):
        return numbers.number_equal(conv, v)
    if isinstance(v, str):
        return '"' + automata.atom(conv, strings.key_body_dfa(conv, v)) + '"'
    if isinstance(v, list):
        n = Norm(types={"array"}, min_items=len(v), max_items=len(v),
                 prefix=[[Sub({"const": x}, ctx)] for x in v])
        return arrays.array_over(conv, n, ctx)
    n = Norm(types={"object"}, props={k: [Sub({"const": x}, ctx)] for k, x in v.items()},
             required=dict.fromkeys(v), groups=[(frozenset(v), {}, Sub(False, ctx), True)])
    return objects.object_over(conv, n, ctx)

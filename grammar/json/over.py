"""Over-approximations of subschemas: supersets of the valid texts, for negations, oneOf and if/else.

Every valid text the converter can generate is accepted; where a constraint is not cheap to express it is
dropped (still a superset)."""

from __future__ import annotations

import json
import re
from typing import Any

from ..errors import GrammarError, is_fatal
from .normal import TYPES, Ctx, Norm, Sub, alt, is_json_type
from .numbers import ANY_NUMBER_RE
from .universe import loose_module

ANY_DEPTH = 2  # nesting of unconstrained values ({} / true / missing items) below where they start
OVER_LEVELS = 2  # over-approximations look this many nesting levels below where the negation applies


class OverMixin:
    """`over(sub)` for the schema converter (needs under, norm, the per-type *_over methods)."""

    def over(self, sub: Sub) -> str | None:
        """A superset of the texts valid under `sub`, cached per subschema: its depth cut-offs only loosen it,
        so the first one computed is sound at every position ($ref'd definitions are negated once)."""
        if sub.schema is True:
            return self.loose()
        key = ("over", id(sub.schema), sub.ctx.base, sub.ctx.scope)
        got = self.sub_cache.get(key)
        if got is None:
            got = self.sub_cache[key] = (sub.schema, self._over(sub))  # the schema pins its id
        return got[1]

    def _over(self, sub: Sub) -> str | None:
        if self._over_origin is not None:
            return self.over_norm(self.norm([sub]), sub.ctx)
        self._over_origin = sub.ctx.level
        try:
            return self.over_norm(self.norm([sub]), sub.ctx)
        finally:
            self._over_origin = None

    def loose(self) -> str:
        """Every text the converter can generate (and more: any nesting; brackets not matched by kind)."""
        return f"(?:{self.atom(loose_module(self._layout()))}|{ANY_NUMBER_RE})"

    def over_norm(self, n: Norm, ctx: Ctx) -> str | None:
        if n.false:
            return None
        if n.cut or ctx.level > self.max_level + ANY_DEPTH or n == Norm():
            return self.loose()
        if self._over_origin is not None and ctx.level > self._over_origin + OVER_LEVELS:
            return self.loose()  # deeper detail only sharpens the superset; it costs products
        try:
            out = self.typed_over(n, ctx)
        except GrammarError as e:
            if is_fatal(e):
                raise
            out = self.loose()
        for kind, payload in n.apps:
            if out is None:
                return None
            if kind in ("anyOf", "oneOf"):
                other = alt([self.over(b) for b in payload])
            elif kind == "not":
                other = self.safe_diff(self.loose(), payload)
            elif kind == "if":
                cond, then, els = payload
                yes = self.combine(self.over(cond), self.over(then), "and", "if/then")
                no = self.combine(self.safe_diff(self.loose(), cond), self.over(els), "and", "if/else")
                other = alt([yes, no])
            else:  # dependentSchemas: the name is absent, or the dependent schema holds
                name, dep = payload
                other = alt([self.lacks_key(name), self.over(dep)])
            out = self.narrow(out, other, kind)
        return self.compact(out, "a subschema")

    def safe_diff(self, universe: str, sub: Sub) -> str | None:
        """universe minus under(sub); when under(sub) is refused, the whole universe (still a superset)."""
        try:
            u = self.under(sub)
        except GrammarError as e:
            if is_fatal(e):
                raise
            return universe
        return self.combine(universe, u, "diff", "not")

    def typed_over(self, n: Norm, ctx: Ctx) -> str | None:
        types = TYPES if n.types is None else [t for t in TYPES if t in n.types]
        if n.enum is not None:
            vals = [v for v in n.enum if any(is_json_type(v, t, self.draft) for t in types)]
            return alt([self.const_over(v, ctx) for v in vals])
        return self.typed_alt(n, ctx, types, "over")

    def const_over(self, v: Any, ctx: Ctx) -> str | None:
        """Every generated text equal to `v` after json.loads (key order and duplicate keys included)."""
        if isinstance(v, bool) or v is None:
            return re.escape(json.dumps(v))
        if isinstance(v, (int, float)):
            return self.number_equal(v)
        if isinstance(v, str):
            return '"' + self.atom(self.key_body_dfa(v)) + '"'
        if isinstance(v, list):
            n = Norm(types={"array"}, min_items=len(v), max_items=len(v),
                     prefix=[[Sub({"const": x}, ctx)] for x in v])
            return self.array_over(n, ctx)
        n = Norm(types={"object"}, props={k: [Sub({"const": x}, ctx)] for k, x in v.items()},
                 required=dict.fromkeys(v), groups=[(frozenset(v), {}, Sub(False, ctx), True)])
        return self.object_over(n, ctx)

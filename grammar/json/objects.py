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
from .normal import Norm
from ..regex.nfa import OptionalSlots
from ..rtn.program import Program

MAX_PATTERN_REGIONS = 3  # patterns whose every combination gets its own key region
MAX_OVER_FILTERS = 6  # over-approximation: constraints kept per object (the rest dropped: still a superset)
OVER_MAX_STATES = 1500  # over-approximation: a filter that would grow the object's automaton past this is dropped


class ObjectsMixin:
    """Object typing for the schema converter."""

    # ---- shared pieces --------------------------------------------------------------------------------
    def _key(self, name: str) -> str:
        return '"' + self.atom(self.key_body_dfa(name)) + '"'

    def _lp(self) -> str:
        return F.STRING + self.colon + self.loose()

    def _loose_obj(self, pair: str | None = None) -> str:
        p = pair or self._lp()
        return self.open_obj + f"(?:{p}(?:{self.comma}{p})*)?" + self.close_obj

    def _has(self, name: str) -> str:
        lp, c = self._lp(), self.comma
        return self.open_obj + f"(?:{lp}{c})*{self._key(name)}{self.colon}{self.loose()}(?:{c}{lp})*" + self.close_obj

    def lacks_key(self, name: str) -> str | None:
        """Every generated text that is not an object holding `name`."""
        return self.combine(self.loose(), self._has(name), "diff", "dependentSchemas")

    def key_matches(self, pattern: str, name: str) -> bool:
        try:
            return re.search(pattern, name) is not None
        except re.error as e:
            raise GrammarError(f"patternProperties: invalid pattern {pattern!r}: {e}") from None

    def _name_ok(self, name: str, names: list) -> bool:
        text = json.dumps(name, ensure_ascii=False).encode()
        for sub in names:
            r = self.under(sub)
            if r is None or not Program(self.module(r, "propertyNames")).fullmatch(text):
                return False
        return True

    # ---- under-approximation ---------------------------------------------------------------------------
    def object_under(self, n: Norm, ctx) -> str | None:
        if n.max_props is not None and n.max_props < n.min_props:
            return None
        uneval = [s for k, s in n.uneval if k == "unevaluatedProperties"]
        names = list(n.props) + [r for r in n.required if r not in n.props]
        slots = []
        for name in names:
            subs, evaluated = list(n.props.get(name, [])), name in n.props
            for own, pats, addl, explicit in n.groups:
                hit = [s for p, s in pats.items() if self.key_matches(p, name)]
                subs += hit
                if name not in own and not hit:
                    if addl is not None:
                        subs.append(addl)
                    evaluated = evaluated or explicit
                evaluated = evaluated or bool(hit)
            if not evaluated:
                subs += uneval
            ok = not n.names or self._name_ok(name, n.names)
            value = None
            if ok:
                value = self.under_subs(subs) if subs else self.free_value(ctx.level + 1)
            if value is None:
                if name in n.required:
                    return None
                continue
            value = self.compact(value, f"property {name!r}", 200)  # optional slots are written more than once
            slots.append((re.escape(json.dumps(name, ensure_ascii=False)) + self.colon + value, name in n.required))
        extra = self._extra_pair(n, names, uneval, ctx)
        many = n.min_props < 2  # duplicate free-form keys would not count twice after json.loads
        out = self.open_obj + self._members(slots, extra, many) + self.close_obj
        if len(slots) > 2 and not self.plain_text:  # its own module: text length no longer tells its size
            out = self.compact(out, "an object", 0)
        if n.min_props or n.max_props is not None:
            out = self.combine(out, self._count_filter(n.min_props, n.max_props), "and", "minProperties/maxProperties")
        for name, deps in n.dep_required:
            need = self._loose_obj()
            for d in deps:
                need = self.combine(need, self._has(d), "and", "dependentRequired")
            out = self.combine(out, self.combine(self.lacks_key(name), need, "or", "dependentRequired"), "and",
                               "dependentRequired")
        return out

    def _members(self, slots: list, extra: str | None, many: bool) -> str:
        """Slots in order (optional ones may be skipped), then free-form pairs; commas well placed."""
        c = self.comma
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
        if not self.plain_text:  # linear automaton instead of n^2 regex text
            key = ("slots", tuple(f for f, _ in slots), c, more, lone if extra is not None else "")
            got = self.dfa_cache.get(key)
            if got is None:
                got = self.dfa_cache[key] = self.atom(OptionalSlots(list(key[1]), c, key[3], key[4]))
            return got
        firsts = []
        for i, (f, _) in enumerate(slots):
            firsts.append(f + "".join(f"(?:{c}{g})?" for g, _ in slots[i + 1:]))
        nonempty = "(?:" + "|".join(firsts) + ")"
        if extra is None:
            return f"(?:{nonempty})?"
        return f"(?:{nonempty}{more}|{lone})"

    def _extra_pair(self, n: Norm, names: list, uneval: list, ctx) -> str | None:
        """Regex for one free-form `"key": value` pair (keys not among the named slots), or None."""
        pats = list(dict.fromkeys(p for _, ps, _, _ in n.groups for p in ps))
        explicit_addl = any(g[2] is not None for g in n.groups)
        free = not n.props and not n.required
        regions = [frozenset(q) for k in range(len(pats) + 1) for q in combinations(pats, k)] \
            if len(pats) <= MAX_PATTERN_REGIONS else [frozenset()] + [frozenset([p]) for p in pats]
        if not pats and not (explicit_addl or free):
            return None
        body = self.atom(self.to_dfa(F.STRING_CHAR + "*", "property names"))
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
            value = self.under_subs(subs) if subs else self.free_value(ctx.level + 1)
            if value is None:
                continue
            key_body = body
            for p in pats:
                m = self.pattern_key_atom(p, "under" if p in q else "over")
                if m is None:
                    if p in q:
                        key_body = None
                    continue
                key_body = self.combine(key_body, m, "and" if p in q else "diff", "patternProperties")
                if key_body is None:
                    break
            for k in names:
                key_body = self.combine(key_body, self.atom(self.key_body_dfa(k)), "diff", "property names")
            if key_body is None:
                continue
            key = '"' + key_body + '"'
            for sub in n.names:
                key = self.combine(key, self.under(sub), "and", "propertyNames")
            if key is not None:
                pairs.append(key + self.colon + value)
        if not pairs:
            return None
        return pairs[0] if len(pairs) == 1 else "(?:" + "|".join(pairs) + ")"

    def _count_filter(self, lo: int, hi: int | None) -> str:
        lp, c = self._lp(), self.comma
        if hi == 0:
            return self.open_obj + self.close_obj
        body = lp + (f"(?:{c}{lp}){{{max(lo - 1, 0)},{'' if hi is None else hi - 1}}}")
        return self.open_obj + (body if lo > 0 else f"(?:{body})?") + self.close_obj

    # ---- over-approximation ----------------------------------------------------------------------------
    def object_over(self, n: Norm, ctx) -> str | None:
        if n.max_props is not None and n.max_props < n.min_props:
            return None
        # Filters are intersected most telling first (required discriminators: const/enum), and one is dropped
        # when it would grow the automaton past OVER_MAX_STATES: per-key "last occurrence" filters multiply
        # (3 states each), and dropping a filter keeps a superset.
        filters: list[tuple[int, str]] = []
        lp, c, cl, loose = self._lp(), self.comma, self.colon, self.loose()
        names = list(n.props) + [r for r in n.required if r not in n.props]
        for name in names[:MAX_OVER_FILTERS * 2]:
            req = name in n.required
            subs = n.props.get(name)
            norm = self.norm(subs) if subs else None
            x = self.over_norm(norm, subs[0].ctx) if subs else loose
            if x == loose:
                if req:
                    filters.append((1, self._has(name)))
                continue  # any value: no constraint on this property
            key = self._key(name)
            other = '"' + self.atom(self._not_key_body(name)) + '"' + cl + loose
            last = f"(?:{lp}{c})*{key}{cl}{x}(?:{c}{other})*" if x is not None else None
            none = f"(?:{other}(?:{c}{other})*)?"
            if req:
                body = last
            else:
                body = f"(?:{last}|{none})" if last else none
            if body is None:
                return None  # required, but no value can satisfy it
            disc = norm is not None and norm.enum is not None
            filters.append(((0 if disc else 1) if req else (2 if disc else 3), self.open_obj + body + self.close_obj))
        extra: list[str] = []
        for own, pats, addl, _ in n.groups:
            if addl is None or addl.schema is not False:
                continue
            allowed = [self.key_body_dfa(k) for k in own]
            keys = [self.atom(d) for d in allowed] + [self.pattern_key_atom(p, "over") for p in pats]
            if any(k is None for k in keys):
                continue
            pair = ('"(?:' + "|".join(keys) + ')"' + cl + loose) if keys else None
            extra.append(self._loose_obj(pair) if pair else self.open_obj + self.close_obj)
        for sub in n.names:
            key = self.over(sub)
            extra.append(self._loose_obj(key + cl + loose) if key is not None else self.open_obj + self.close_obj)
        if n.min_props:
            extra.append(self._count_filter(n.min_props, None))
        for name, deps in n.dep_required:
            need = self._loose_obj()
            for d in deps:
                need = self.combine(need, self._has(d), "and", "dependentRequired")
            extra.append(self.combine(self.lacks_key(name), need, "or", "dependentRequired"))
        filters += [(3, f) for f in extra]
        filters.sort(key=lambda pf: pf[0])
        if filters and filters[0][0] == 0:  # required discriminators (const/enum) tell objects apart cheaply
            filters = [pf for pf in filters if pf[0] == 0]
        out = self._loose_obj()
        for _, f in filters[:MAX_OVER_FILTERS + 2]:
            out = self.narrow(out, f, "an object's keywords")
            if out is None:
                return None
        return out

    def _not_key_body(self, name: str):
        key = ("notkey", name)
        got = self.dfa_cache.get(key)
        if got is None:
            from ..regex.fsa import product

            body = self.to_dfa(F.STRING_CHAR + "*", "property names")
            got = self.dfa_cache[key] = product(body, self.key_body_dfa(name), "diff", self.max_states,
                                                self.budget, "property names")
        return got


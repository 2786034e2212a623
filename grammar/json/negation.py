"""Negations the keywords give directly: `not S` as a few alternatives of plain subschemas, instead of a
difference of automata (under(rest) - over(S)), which grows with everything the position holds.

- `{required: [k1..kn]}` (maybe typed object): not S = an object without k1, or ..., or without kn (or a
  non-object when S was typed object; otherwise every non-object satisfies S);
- `{properties: {k: S_k, ...}}` (maybe typed object): not S = an object that has some k with a value outside
  S_k (the negation moves down to that value, where its automata are small);
- `{not: X}`: not S = X.

Each alternative is exact, so distributing over them keeps `under` exact; the alternatives may overlap (their
union is what counts). They carry annotations a failed subschema does not give, so positions with
unevaluatedProperties / unevaluatedItems keep the difference. Used by `not` (under), oneOf exclusivity and if/else (schema.py), and `over`.
"""

from __future__ import annotations

from dataclasses import replace

from .normal import TYPES, Ctx, Norm, Sub
from .vocab import VOCABULARY

MAX_CHOICES = 16  # oneOf exclusivity through negations only while their alternatives multiply to at most this
_HARMLESS = {"$comment", "$schema", "$defs", "definitions"}  # core keywords that change nothing at this position


def negation(conv, sub: Sub) -> list[Sub] | None:
    """Subschemas whose union is exactly the instances not valid under `sub`, or None (no cheap form)."""
    if not isinstance(sub.schema, dict):
        return None
    key = ("negation", id(sub.schema), sub.ctx.base, sub.ctx.scope)
    got = conv.sub_cache.get(key)
    if got is None:
        got = conv.sub_cache[key] = (sub.schema, _negation(conv, sub))  # the schema pins its id
    return got[1]


def _negation(conv, sub: Sub) -> list[Sub] | None:
    schema, ctx = sub.schema, sub.ctx
    vocab = VOCABULARY[conv.draft]
    keys = {k for k in schema if vocab.get(k) not in (None, "annotate") and k not in _HARMLESS}
    typed = schema.get("type") == "object" or schema.get("type") == ["object"]
    if "type" in keys and not typed:
        return None
    keys.discard("type")
    others = [Sub({"type": [t for t in TYPES if t != "object"]}, ctx)] if typed else []
    if keys == {"not"} and not typed:
        return [Sub(schema["not"], ctx)]
    if keys == {"required"}:
        names = schema["required"]
        if not isinstance(names, list) or not names or not all(isinstance(k, str) for k in names):
            return None
        return [Sub({"type": "object", "properties": {k: False}}, ctx) for k in dict.fromkeys(names)] + others
    if keys == {"properties"} and isinstance(schema["properties"], dict):
        return [Sub({"type": "object", "required": [k], "properties": {k: {"not": s}}}, ctx)
                for k, s in schema["properties"].items() if s is not True] + others
    return None


def choices(conv, head: Norm, sub: Sub) -> list[Sub] | None:
    """negation(sub) without the alternatives that cannot hold next to `head` (the rest of the position): a key
    it requires cannot be absent; a key's value cannot be outside a schema that already holds for it."""
    alts = negation(conv, sub)
    if alts is None:
        return None
    return [a for a in alts if _may_hold(conv, head, a)]


def _may_hold(conv, head: Norm, alt: Sub) -> bool:
    """False only for the two shapes negation() builds (an object without k / with k outside a schema)."""
    a = alt.schema
    if not isinstance(a, dict) or a.get("type") != "object" or not isinstance(a.get("properties"), dict) \
            or len(a["properties"]) != 1 or set(a) not in ({"type", "properties"}, {"type", "required", "properties"}):
        return True
    (k, value), = a["properties"].items()
    if "required" not in a:
        return value is not False or k not in head.required
    if a["required"] != [k]:
        return True
    if conv.forbids(head, k):
        return False
    mine = head.props.get(k)
    if not mine:
        return True
    return conv.under_subs(list(mine) + [Sub(value, alt.ctx._replace(level=alt.ctx.level + 1))]) is not None


def rewrite_nots(conv, n: Norm, ctx: Ctx) -> Norm:
    """`not` applicators with a cheap negation become anyOf applicators over its alternatives (one alternative
    is merged in as a part: no distributed branch)."""
    if n.uneval or not any(kind == "not" and negation(conv, p) is not None for kind, p in n.apps):
        return n  # unevaluated* would see the alternatives' annotations, which a failed `not` does not give
    apps, parts = [], []
    for kind, p in n.apps:
        alts = choices(conv, n, p) if kind == "not" else None
        if alts is not None and len(alts) == 1:
            parts.append(alts[0])
        else:
            apps.append((kind, p) if alts is None else ("anyOf", alts))
    return conv.extend(replace(n, apps=apps), parts)


def with_negation(conv, n: Norm, alts: list[Sub]) -> Norm:
    """n and the union of `alts` (a negation): one alternative merged in, several as an anyOf applicator."""
    if len(alts) == 1:
        return conv.extend(n, alts)
    m = conv.extend(n, [])
    m.apps.append(("anyOf", alts))
    return m


def negatable(conv, head: Norm, payload: list, others: list) -> dict:
    """{index: alternatives} of the other oneOf branches whose negations the keywords give (pruned next to
    `head`, this branch and the rest), while they multiply to at most MAX_CHOICES (each combination is one
    distributed branch); else none of them."""
    keyed = {j: got for j in others if (got := choices(conv, head, payload[j])) is not None}
    ways = 1
    for alts in keyed.values():
        ways *= max(1, len(alts))
    return keyed if ways <= MAX_CHOICES else {}


_SCALAR_KEYS = {"const", "enum", "type", "not"}


def hopeless(conv, n: Norm) -> bool:
    """A cheap proof that nothing is valid under n at an object-only position: a required key that n forbids,
    or whose value schemas (const / enum / type / not of those) contradict each other."""
    if n.types is None or not n.types <= {"object"}:
        return False
    for k in n.required:
        if conv.forbids(n, k):
            return True
        subs = n.props.get(k, ())
        if len(subs) >= 2 and all(_scalar(conv, s.schema) for s in subs) and conv.under_subs(list(subs)) is None:
            return True
    return False


def _scalar(conv, schema) -> bool:
    if not isinstance(schema, dict):
        return True
    vocab = VOCABULARY[conv.draft]
    keys = {k for k in schema if vocab.get(k) not in (None, "annotate")}
    return keys <= _SCALAR_KEYS and ("not" not in keys or _scalar(conv, schema["not"]))

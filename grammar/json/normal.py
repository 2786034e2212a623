"""Normal form of the schemas applying at one instance position: $ref / allOf parts merged keyword by keyword.

Every subschema kept inside a Norm is a `Sub` (schema, context) pair, so parts coming from different
resources keep their own base URI. Keywords the draft does not define, and annotations, are collected in
`ignored`; keywords that cannot be merged are kept as applicators (`apps`) for the automaton stage.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ..errors import GrammarError
from .vocab import VOCABULARY, ref_overrides_siblings

TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class Ctx(NamedTuple):
    """Where a subschema sits: its base URI, the dynamic scope (resources entered), $ref chain, instance depth."""

    base: str
    scope: tuple
    refs: tuple
    level: int


class Sub(NamedTuple):
    schema: Any
    ctx: Ctx


@dataclass
class Norm:
    """Conjunction of keyword constraints at one position (None = unconstrained)."""

    types: set | None = None
    enum: list | None = None
    num_lo: list = field(default_factory=list)  # (bound, exclusive)
    num_hi: list = field(default_factory=list)
    multiple_of: list = field(default_factory=list)
    min_len: int = 0
    max_len: int | None = None
    patterns: list = field(default_factory=list)
    formats: list = field(default_factory=list)
    min_items: int = 0
    max_items: int | None = None
    prefix: list = field(default_factory=list)  # [[Sub, ...] per position]
    items: list = field(default_factory=list)  # [(n_prefix, Sub)]: applies to positions >= n_prefix
    contains: list = field(default_factory=list)  # [(Sub, min, max)]
    unique: bool = False
    props: dict = field(default_factory=dict)  # name -> [Sub]
    groups: list = field(default_factory=list)  # [(own names, {pattern: Sub}, additional Sub | None, explicit)]
    required: dict = field(default_factory=dict)  # ordered set
    names: list = field(default_factory=list)  # propertyNames Subs
    min_props: int = 0
    max_props: int | None = None
    dep_required: list = field(default_factory=list)  # (name, [names])
    apps: list = field(default_factory=list)  # (kind, payload) for anyOf / oneOf / not / if / dependentSchemas
    false: bool = False  # some part is the false schema
    cut: bool = False  # a $ref recursed past max_recursion_depth here (under: nothing, over: anything)
    uneval: list = field(default_factory=list)  # (keyword, Sub) unevaluatedProperties / unevaluatedItems
    seen_apps: set = field(default_factory=set, compare=False, repr=False)  # (kind, id(schema)) of apps


def count(name: str, v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GrammarError(f"{name} must be a non-negative integer, got {v!r}")
    return v


def number(name: str, v: Any):
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
        raise GrammarError(f"{name} must be a finite number, got {v!r}")
    return v


def add_part(conv, norm: Norm, schema: Any, ctx: Ctx, top: bool = True) -> None:
    """Merge one schema (following $ref / allOf, recording ignored keywords) into `norm`.

    top: the schema is the one being converted (not a $ref / allOf part or a distributed branch), so its
    unevaluatedProperties/Items see every annotation merged here.
    """
    conv.budget.check("the JSON schema")
    if schema is True:
        return
    if schema is False:
        norm.false = True
        return
    if not isinstance(schema, dict):
        raise GrammarError(f"a schema must be an object or boolean, got {json.dumps(schema)[:60]}")
    draft = conv.draft
    vocab = VOCABULARY[draft]
    ctx = conv.enter(schema, ctx)
    if "$ref" in schema and ref_overrides_siblings(draft):
        conv.ignore(k for k in schema if k != "$ref")
        target, tctx = conv.follow(schema, "$ref", ctx)
        if target is None:
            norm.cut = True
        else:
            add_part(conv, norm, target, tctx, False)
        return
    for key in ("$ref", "$dynamicRef", "$recursiveRef"):
        if key in schema and (key == "$ref" or vocab.get(key) == "apply"):
            target, tctx = conv.follow(schema, key, ctx)
            if target is None:
                norm.cut = True
            else:
                # a reference whose siblings evaluate nothing: the target's subtree is all this position sees
                alone = top and not any(k != key and k in schema for k in _ANNOTATING)
                add_part(conv, norm, target, tctx, alone)
    for key, value in schema.items():
        kind = vocab.get(key)
        if kind is None or kind == "annotate":
            conv.ignore([key])
            continue
        if kind == "core" or key in ("$ref", "$dynamicRef", "$recursiveRef"):
            continue
        _keyword(conv, norm, schema, key, value, ctx, top)


def _subs(value, ctx, what) -> list:
    if not isinstance(value, list) or not value:
        raise GrammarError(f"{what} must be a non-empty array of schemas")
    return [Sub(v, ctx) for v in value]


def _keyword(conv, n: Norm, s: dict, key: str, v: Any, ctx: Ctx, top: bool) -> None:
    draft = conv.draft
    child = ctx._replace(level=ctx.level + 1)
    if key == "type":
        ts = {v} if isinstance(v, str) else set(v) if isinstance(v, list) else None
        if not ts or any(t not in TYPES for t in ts):
            raise GrammarError(f"invalid 'type' {v!r}: expected one of {', '.join(TYPES)}")
        if "number" in ts:
            ts.add("integer")
        n.types = ts if n.types is None else n.types & ts
    elif key in ("enum", "const"):
        vals = [v] if key == "const" else v
        if not isinstance(vals, list):
            raise GrammarError("'enum' must be an array")
        n.enum = vals if n.enum is None else [x for x in n.enum if any(conv.json_eq(x, y) for y in vals)]
    elif key in ("minimum", "exclusiveMinimum", "maximum", "exclusiveMaximum"):
        if isinstance(v, bool) and draft == "4":
            return  # draft-04 boolean form: handled with its minimum/maximum
        lo = key in ("minimum", "exclusiveMinimum")
        excl = key.startswith("exclusive") or (draft == "4" and s.get("exclusive" + key.capitalize()) is True)
        (n.num_lo if lo else n.num_hi).append((number(key, v), excl))
    elif key == "multipleOf":
        if number(key, v) <= 0:
            raise GrammarError(f"multipleOf must be > 0, got {v!r}")
        n.multiple_of.append(v)
    elif key == "minLength":
        n.min_len = max(n.min_len, count(key, v))
    elif key == "maxLength":
        c = count(key, v)
        n.max_len = c if n.max_len is None else min(n.max_len, c)
    elif key == "pattern":
        if not isinstance(v, str):
            raise GrammarError("pattern must be a string")
        n.patterns.append(v)
    elif key == "format":
        if isinstance(v, str):
            n.formats.append(v)
    elif key == "minItems":
        n.min_items = max(n.min_items, count(key, v))
    elif key == "maxItems":
        c = count(key, v)
        n.max_items = c if n.max_items is None else min(n.max_items, c)
    elif key == "prefixItems" or (key == "items" and isinstance(v, list)):
        if not isinstance(v, list):
            raise GrammarError(f"{key} must be an array of schemas")
        for i, sub in enumerate(v):
            while len(n.prefix) <= i:
                n.prefix.append([])
            n.prefix[i].append(Sub(sub, child))
        rest = s.get("additionalItems" if key == "items" else "items", True)
        if key == "prefixItems" and isinstance(rest, list):
            rest = True
        if rest is not True:
            n.items.append((len(v), Sub(rest, child)))
    elif key == "items":
        if "prefixItems" not in s:
            n.items.append((0, Sub(v, child)))
    elif key == "additionalItems":
        return  # only meaningful next to an array-form items (handled there)
    elif key == "contains":
        lo = count("minContains", s.get("minContains", 1)) if draft in ("2019-09", "2020-12") else 1
        hi = s.get("maxContains") if draft in ("2019-09", "2020-12") else None
        n.contains.append((Sub(v, child), lo, None if hi is None else count("maxContains", hi)))
    elif key in ("minContains", "maxContains"):
        return  # read with contains (without contains they do nothing)
    elif key == "uniqueItems":
        n.unique = n.unique or v is True
    elif key == "properties":
        if not isinstance(v, dict):
            raise GrammarError("properties must be an object")
        for name, sub in v.items():
            n.props.setdefault(name, []).append(Sub(sub, child))
    elif key in ("patternProperties", "additionalProperties"):
        if key == "additionalProperties" or "additionalProperties" not in s:
            pats = s.get("patternProperties", {})
            if not isinstance(pats, dict):
                raise GrammarError("patternProperties must be an object")
            addl = s.get("additionalProperties", True)
            n.groups.append((frozenset(s.get("properties", {}) if isinstance(s.get("properties"), dict) else ()),
                             {p: Sub(x, child) for p, x in pats.items()},
                             None if addl is True or addl == {} else Sub(addl, child),
                             "additionalProperties" in s))
    elif key == "required":
        if isinstance(v, bool) and draft == "4":
            return
        if not isinstance(v, list) or not all(isinstance(r, str) for r in v):
            raise GrammarError("required must be an array of strings")
        n.required.update(dict.fromkeys(v))
    elif key == "propertyNames":
        n.names.append(Sub(v, child))
    elif key == "minProperties":
        n.min_props = max(n.min_props, count(key, v))
    elif key == "maxProperties":
        c = count(key, v)
        n.max_props = c if n.max_props is None else min(n.max_props, c)
    elif key in ("dependentRequired", "dependentSchemas", "dependencies"):
        if not isinstance(v, dict):
            raise GrammarError(f"{key} must be an object")
        for name, dep in v.items():
            if isinstance(dep, list):
                if not all(isinstance(x, str) for x in dep):
                    raise GrammarError(f"{key}: {name!r} must list property names")
                n.dep_required.append((name, dep))
            else:
                _apply(n, "dependentSchemas", (name, Sub(dep, ctx)), dep)
    elif key == "allOf":
        for sub in _subs(v, ctx, "allOf"):
            add_part(conv, n, sub.schema, sub.ctx, False)
    elif key in ("anyOf", "oneOf"):
        _apply(n, key, _subs(v, ctx, key), v)
    elif key == "not":
        _apply(n, "not", Sub(v, ctx), v)
    elif key == "if":
        then, els = s.get("then", True), s.get("else", True)
        if then is not True or els is not True:
            _apply(n, "if", (Sub(v, ctx), Sub(then, ctx), Sub(els, ctx)), s)
    elif key in ("then", "else"):
        return
    elif key in ("unevaluatedProperties", "unevaluatedItems"):
        if v is True:
            return
        if not top and not _local_unevaluated(conv, n, s, key, v, child):
            # it would only see its own subtree's annotations, which merging loses
            conv.refuse(key, "inside a $ref / allOf / anyOf / oneOf / if part whose own in-place applicators "
                             "could evaluate more (supported: next to the keywords it sees, or in a part without "
                             "in-place applicators)")
            return
        if top:
            n.uneval.append((key, Sub(v, child)))
    else:
        raise GrammarError(f"unsupported JSON-schema keyword {key!r}")


# keywords whose subschemas evaluate properties or items of the instance (for unevaluated*)
_ANNOTATING = ("properties", "patternProperties", "additionalProperties", "items", "prefixItems", "additionalItems",
               "contains", "allOf", "anyOf", "oneOf", "if", "dependentSchemas", "dependencies", "unevaluatedProperties",
               "unevaluatedItems", "$ref", "$dynamicRef", "$recursiveRef")
_IN_PLACE = ("allOf", "anyOf", "oneOf", "if", "dependentSchemas", "$ref", "$dynamicRef", "$recursiveRef")


def _local_unevaluated(conv, n: Norm, s: dict, key: str, v: Any, child: Ctx) -> bool:
    """unevaluated* in a merged part `s` (an allOf / $ref part, a branch, one of several subschemas at a position)
    sees the annotations of `s`'s subtree only. Without in-place applicators in `s` (`not` keeps none) those are
    `s`'s own keywords, so it is exactly an additionalProperties next to `s`'s properties / patternProperties,
    or an items after `s`'s prefixItems: merged as such. False where an applicator could evaluate more."""
    vocab = VOCABULARY[conv.draft]
    if any(k in s and vocab.get(k) == "apply" for k in _IN_PLACE):
        return False
    if key == "unevaluatedProperties":
        props, pats = s.get("properties", {}), s.get("patternProperties", {})
        if not isinstance(props, dict) or not isinstance(pats, dict):
            return False
        if "additionalProperties" not in s:  # with it, every property is evaluated inside `s`
            n.groups.append((frozenset(props), {p: Sub(True, child) for p in pats}, Sub(v, child), True))
        return True
    if conv.draft == "2020-12":
        if "contains" in s:  # contains evaluates the items it matches: not a fixed set of positions
            return False
        if "items" in s:
            return True
        first = s.get("prefixItems", [])
    else:  # 2019-09: items as an array, then additionalItems
        items = s.get("items", [])
        if not isinstance(items, list) or "additionalItems" in s:
            return True
        first = items
    if not isinstance(first, list):
        return False
    n.items.append((len(first), Sub(v, child)))
    return True


def _apply(n: Norm, kind: str, payload, source) -> None:
    """Add an applicator once: a definition reached along several $ref / allOf paths is one conjunct (A and A
    is A; the copies differ at most in their recursion cut-offs, and either is sound), not 2^k combinations."""
    key = (kind, id(source))
    if key not in n.seen_apps:
        n.seen_apps.add(key)
        n.apps.append((kind, payload))


def alt(parts: list[str]) -> str | None:
    """Regex alternation of the distinct non-None parts (None when there are none)."""
    parts = list(dict.fromkeys(p for p in parts if p is not None))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else "(?:" + "|".join(parts) + ")"


def is_json_type(v: Any, t: str, draft: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if isinstance(v, bool):
        return False
    if t == "integer":
        return isinstance(v, int) or (draft != "4" and isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float))
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    return isinstance(v, dict)

"""JSON-schema helpers: keyword tables, type checks, and the sound schema intersection used for allOf/$ref."""

from __future__ import annotations

import copy
import json
from typing import Any, Protocol

from .errors import GrammarError

# Keywords that only annotate: they never change which documents are valid.
ANNOTATIONS = {
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated", "readOnly",
    "writeOnly", "contentMediaType", "contentEncoding", "contentSchema", "$defs", "definitions", "discriminator",
    "$anchor", "example", "nullable_annotation",
}
SUPPORTED = {
    "type", "properties", "required", "additionalProperties", "enum", "const", "anyOf", "oneOf", "allOf", "$ref",
    "items", "prefixItems", "minItems", "maxItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "minProperties", "maxProperties",
}
TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")


class _Resolver(Protocol):
    def resolve(self, ref: str) -> Any: ...


def check_count(name: str, v: Any) -> int:
    if isinstance(v, float) and v.is_integer():
        v = int(v)
    if isinstance(v, bool) or not isinstance(v, int) or v < 0:
        raise GrammarError(f"{name} must be a non-negative integer, got {v!r}")
    return v


def tightest(bounds: dict, incl: str, excl: str, pick) -> tuple[float | None, bool]:
    """Combine an inclusive and an exclusive bound into (value, exclusive)."""
    a, b = bounds.get(incl), bounds.get(excl)
    if a is None and b is None:
        return None, False
    if a is None:
        return b, True
    if b is None:
        return a, False
    # on a tie the exclusive bound is the tighter one
    return (b, True) if pick(a, b) == b else (a, False)


def infer_types(s: dict) -> list[str]:
    if any(k in s for k in ("properties", "required", "additionalProperties", "minProperties", "maxProperties")):
        return ["object"]
    if any(k in s for k in ("items", "prefixItems", "minItems", "maxItems")):
        return ["array"]
    if any(k in s for k in ("minLength", "maxLength", "pattern", "format")):
        return ["string"]
    if any(k in s for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")):
        return ["number"]
    return list(TYPES)


def is_type(v: Any, t: str) -> bool:
    if t == "null":
        return v is None
    if t == "boolean":
        return isinstance(v, bool)
    if t == "integer":
        return isinstance(v, int) and not isinstance(v, bool) or (isinstance(v, float) and v.is_integer())
    if t == "number":
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    if t == "string":
        return isinstance(v, str)
    if t == "array":
        return isinstance(v, list)
    return isinstance(v, dict)


def json_eq(a: Any, b: Any) -> bool:
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True) and type(a) is type(b) or (
        not isinstance(a, bool) and not isinstance(b, bool) and isinstance(a, (int, float))
        and isinstance(b, (int, float)) and a == b
    )


def intersects(a, b) -> bool:
    """Whether two byte DFAs accept a common string (product BFS)."""
    seen = {(a.initial, b.initial)}
    stack = [(a.initial, b.initial)]
    while stack:
        x, y = stack.pop()
        if a.accepting[x] and b.accepting[y]:
            return True
        nx, ny = a.trans[x], b.trans[y]
        for byte in range(256):
            p, q = int(nx[byte]), int(ny[byte])
            if p and q and (p, q) not in seen:
                seen.add((p, q))
                stack.append((p, q))
    return False


def merge(parts: list, conv: _Resolver) -> dict:
    """Sound intersection of schemas for allOf/$ref siblings; a conflict that cannot be merged is an error."""
    out: dict = {}
    processed: list[dict] = []
    for p in parts:
        if p is True or p == {}:
            continue
        if p is False:
            raise GrammarError("allOf contains false: no document is valid")
        if not isinstance(p, dict):
            raise GrammarError("allOf entries must be schemas")
        p = {k: v for k, v in p.items() if k not in ANNOTATIONS}
        if "$ref" in p:
            p = dict(p)
            target = conv.resolve(p.pop("$ref"))
            p = merge([target, p], conv)
        if "allOf" in p:
            p = dict(p)
            p = merge([{k: v for k, v in p.items() if k != "allOf"}] + list(p["allOf"]), conv)
        processed.append(p)
        for k, v in p.items():
            if k in ("items", "prefixItems"):
                continue
            if k not in out:
                out[k] = copy.deepcopy(v)
                continue
            cur = out[k]
            if k == "type":
                a = {cur} if isinstance(cur, str) else set(cur)
                b = {v} if isinstance(v, str) else set(v)
                if "number" in a and "integer" in b:
                    a.add("integer")
                if "number" in b and "integer" in a:
                    b.add("integer")
                both = [t for t in TYPES if t in a and t in b]
                if not both:
                    raise GrammarError(f"allOf: types {sorted(a)} and {sorted(b)} do not intersect")
                out[k] = both
            elif k == "properties":
                for name, sub in v.items():
                    cur[name] = merge([cur[name], sub], conv) if name in cur else copy.deepcopy(sub)
            elif k == "required":
                out[k] = list(dict.fromkeys(cur + v))
            elif k in ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties"):
                out[k] = max(cur, v)
            elif k in ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties"):
                out[k] = min(cur, v)
            elif k == "enum":
                out[k] = [x for x in cur if any(json_eq(x, y) for y in v)]
                if not out[k]:
                    raise GrammarError("allOf: enum values do not intersect")
            elif k in ("items", "additionalProperties") and isinstance(cur, dict) and isinstance(v, dict):
                out[k] = merge([cur, v], conv)
            elif k == "additionalProperties" and (cur is False or v is False):
                out[k] = False
            elif k in ("anyOf", "oneOf"):
                out[k] = [merge([x, y], conv) for x in cur for y in v]
            elif json.dumps(cur, sort_keys=True) != json.dumps(v, sort_keys=True):
                raise GrammarError(f"allOf: cannot merge two different values of {k!r}")
    # items apply only after the same schema's prefixItems: intersect position by position
    arr = [p for p in processed if "items" in p or "prefixItems" in p]
    if len(arr) == 1:
        out.update({k: copy.deepcopy(arr[0][k]) for k in ("items", "prefixItems") if k in arr[0]})
    elif arr:
        n = max(len(p.get("prefixItems", [])) for p in arr)

        def at(p, i):
            pre = p.get("prefixItems", [])
            return pre[i] if i < len(pre) else p.get("items", True)

        if n:
            out["prefixItems"] = [merge([at(p, i) for p in arr], conv) for i in range(n)]
        items = [p.get("items", True) for p in arr]
        if any(x is False for x in items):
            out["items"] = False
        elif any(x is not True for x in items):
            out["items"] = merge(items, conv)
    # additionalProperties: false in one part forbids the other parts' extra properties
    if out.get("additionalProperties") is False:
        allowed = None
        for p in parts:
            if isinstance(p, dict) and p.get("additionalProperties") is False:
                names = set(p.get("properties", {}))
                allowed = names if allowed is None else allowed & names
        if allowed is not None and "properties" in out:
            for name in list(out["properties"]):
                if name not in allowed:
                    if name in out.get("required", []):
                        raise GrammarError(f"allOf: required property {name!r} is forbidden by additionalProperties")
                    del out["properties"][name]
    return out

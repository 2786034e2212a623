"""JSON Schema -> regex (fixed property order). Unsupported keywords are errors naming them, never ignored."""

from __future__ import annotations

import json
import math
import re
import urllib.parse
import warnings
from typing import Any

from . import json_formats as F
from .errors import GrammarError
from .json_schema_util import (
    ANNOTATIONS, SUPPORTED, TYPES, check_count, infer_types, intersects, is_type, json_eq, merge, tightest,
)

ANY_DEPTH = 2  # nesting budget of unconstrained values ({} / true / missing items)


def normalize_schema(schema: Any) -> Any:
    """Accept a dict, a JSON string, a bool, or a pydantic model class / instance; return plain JSON data."""
    if hasattr(schema, "model_json_schema"):
        schema = schema.model_json_schema()
    elif isinstance(schema, (str, bytes)):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise GrammarError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, (dict, bool)):
        raise GrammarError(f"json_schema must be an object or boolean, got {type(schema).__name__}")
    return schema


def schema_to_regex(
    schema: Any,
    whitespace_pattern: str | None = None,
    strict: bool = True,
    max_recursion_depth: int = 3,
) -> str:
    """Regex for JSON texts valid under `schema`.

    whitespace_pattern None: compact `json.dumps` layout (", " and ": ", no other whitespace);
    otherwise the pattern (e.g. "[ ]?" or "[\\n ]{0,8}") is allowed at every structural position.
    """
    schema = normalize_schema(schema)
    out = _Converter(schema, whitespace_pattern, strict, max_recursion_depth).convert(schema, ())
    if out is None:
        raise GrammarError(
            f"json_schema admits no document (false subschemas, or $ref recursion deeper than {max_recursion_depth})"
        )
    return out


class _Converter:
    def __init__(self, root, ws: str | None, strict: bool, max_depth: int):
        self.root, self.strict, self.max_depth = root, strict, max_depth
        if ws is None:
            self.open_obj, self.close_obj, self.open_arr, self.close_arr = r"\{", r"\}", r"\[", r"\]"
            self.comma, self.colon = ", ", ": "
        else:
            try:
                re.compile(ws)
            except re.error as e:
                raise GrammarError(f"invalid whitespace_pattern {ws!r}: {e}") from None
            w = f"(?:{ws})"
            self.open_obj, self.close_obj = r"\{" + w, w + r"\}"
            self.open_arr, self.close_arr = r"\[" + w, w + r"\]"
            self.comma, self.colon = w + "," + w, w + ":" + w

    # ---- helpers -------------------------------------------------------------------------------------
    def unsupported(self, keyword: str, detail: str = "") -> None:
        msg = f"unsupported JSON-schema keyword {keyword!r}" + (f": {detail}" if detail else "")
        if self.strict:
            raise GrammarError(msg + " (strict=False ignores it with a warning)")
        warnings.warn(msg + " (ignored: output may violate it)", stacklevel=4)

    def resolve(self, ref: str) -> Any:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise GrammarError(f"unsupported $ref {ref!r}: only local references ('#/...') are supported")
        node = self.root
        for part in ref[1:].split("/")[1:] if ref != "#" else []:
            part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
            if isinstance(node, dict) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                raise GrammarError(f"$ref {ref!r} does not resolve")
        return node

    def const(self, value: Any) -> str:
        """Regex for one JSON value in this converter's layout."""
        if isinstance(value, dict):
            if not value:
                return self.open_obj + self.close_obj
            items = [re.escape(json.dumps(k, ensure_ascii=False)) + self.colon + self.const(v)
                     for k, v in value.items()]
            return self.open_obj + self.comma.join(items) + self.close_obj
        if isinstance(value, list):
            if not value:
                return self.open_arr + self.close_arr
            return self.open_arr + self.comma.join(self.const(v) for v in value) + self.close_arr
        if isinstance(value, float) and value.is_integer() and not math.isinf(value):
            return "(?:" + re.escape(json.dumps(int(value))) + "|" + re.escape(json.dumps(value)) + ")"
        return re.escape(json.dumps(value, ensure_ascii=False))

    def any_value(self, depth: int) -> str:
        alts = [F.STRING, F.NUMBER, F.BOOLEAN, F.NULL]
        if depth > 0:
            inner = self.any_value(depth - 1)
            alts.append(self.open_arr + f"(?:{inner}(?:{self.comma}{inner})*)?" + self.close_arr)
            pair = F.STRING + self.colon + inner
            alts.append(self.open_obj + f"(?:{pair}(?:{self.comma}{pair})*)?" + self.close_obj)
        return "(?:" + "|".join(alts) + ")"

    # ---- dispatch ------------------------------------------------------------------------------------
    def convert(self, schema: Any, refs: tuple) -> str | None:
        """Regex for `schema`, or None when it admits no document (e.g. recursion depth exhausted)."""
        if schema is True or schema == {}:
            return self.any_value(ANY_DEPTH)
        if schema is False:
            return None
        if not isinstance(schema, dict):
            raise GrammarError(f"a schema must be an object or boolean, got {json.dumps(schema)[:60]}")
        for k in schema:
            if k not in SUPPORTED and k not in ANNOTATIONS:
                if k.startswith("x-"):
                    continue
                self.unsupported(k)
        if "$ref" in schema:
            ref = schema["$ref"]
            if refs.count(ref) >= self.max_depth:
                return None
            target = self.resolve(ref)
            rest = {k: v for k, v in schema.items() if k != "$ref" and k not in ANNOTATIONS}
            merged = merge([target, rest], self) if rest else target
            return self.convert(merged, refs + (ref,))
        if "allOf" in schema:
            parts = schema["allOf"]
            if not isinstance(parts, list) or not parts:
                raise GrammarError("allOf must be a non-empty array")
            rest = {k: v for k, v in schema.items() if k != "allOf"}
            resolved = [self._deref(p, refs) for p in parts]
            if any(p is None for p in resolved):
                return None
            merged = merge([rest] + [p for p, _ in resolved], self)
            new_refs = refs + tuple(r for _, r in resolved if r)
            return self.convert(merged, new_refs)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                return self.alternatives(schema, key, refs)
        if "enum" in schema or "const" in schema:
            return self.enum(schema)
        types = schema.get("type")
        if types is None:
            types = infer_types(schema)
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list) or not types or any(t not in TYPES for t in types):
            raise GrammarError(f"invalid 'type' {schema.get('type')!r}: expected one of {', '.join(TYPES)}")
        alts = [r for r in (self.typed(t, schema, refs) for t in dict.fromkeys(types)) if r is not None]
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    def _deref(self, schema, refs):
        """Inline a top-level $ref of an allOf part; returns (schema, ref) or None at the depth limit."""
        if isinstance(schema, dict) and "$ref" in schema:
            ref = schema["$ref"]
            if refs.count(ref) >= self.max_depth:
                return None
            rest = {k: v for k, v in schema.items() if k != "$ref"}
            target = self.resolve(ref)
            return (merge([target, rest], self) if rest else target), ref
        return schema, None

    def alternatives(self, schema: dict, key: str, refs: tuple) -> str | None:
        branches = schema[key]
        if not isinstance(branches, list) or not branches:
            raise GrammarError(f"{key} must be a non-empty array")
        rest = {k: v for k, v in schema.items() if k != key and k not in ANNOTATIONS}
        parts = []
        for b in branches:
            sub = merge([rest, b], self) if rest and b is not True else (b if not rest else rest)
            r = self.convert(sub, refs)
            if r is not None:
                parts.append(r)
        if not parts:
            return None
        if key == "oneOf" and len(parts) > 1:
            from .dfa import regex_to_dfa

            dfas = [regex_to_dfa(p) for p in parts]
            for i in range(len(dfas)):
                for j in range(i + 1, len(dfas)):
                    if intersects(dfas[i], dfas[j]):
                        self.unsupported("oneOf", f"branches {i} and {j} overlap, so exclusivity cannot be enforced")
        return "(?:" + "|".join(parts) + ")"

    def enum(self, schema: dict) -> str:
        values = [schema["const"]] if "const" in schema else schema["enum"]
        if "const" in schema and "enum" in schema:
            values = [v for v in schema["enum"] if json_eq(v, schema["const"])]
        if not isinstance(values, list) or not values:
            raise GrammarError("enum must be a non-empty array")
        types = schema.get("type")
        if types is not None:
            types = [types] if isinstance(types, str) else types
            values = [v for v in values if any(is_type(v, t) for t in types)]
        extra = set(schema) - {"enum", "const", "type"} - ANNOTATIONS
        if extra:
            self.unsupported(sorted(extra)[0], "next to enum/const")
        if not values:
            raise GrammarError("enum/const: no value matches the schema's 'type'")
        return "(?:" + "|".join(self.const(v) for v in values) + ")"

    # ---- types ---------------------------------------------------------------------------------------
    def typed(self, t: str, s: dict, refs: tuple) -> str | None:
        if t == "string":
            return self.string(s)
        if t == "integer":
            return self.integer(s)
        if t == "number":
            return self.number(s)
        if t == "boolean":
            return F.BOOLEAN
        if t == "null":
            return F.NULL
        if t == "array":
            return self.array(s, refs)
        return self.object(s, refs)

    def string(self, s: dict) -> str:
        lo = check_count("minLength", s.get("minLength", 0))
        hi = s.get("maxLength")
        if hi is not None:
            hi = check_count("maxLength", hi)
            if hi < lo:
                raise GrammarError(f"maxLength {hi} < minLength {lo}")
        has_len = "minLength" in s or "maxLength" in s
        content = None
        if "format" in s:
            fmt = s["format"]
            if fmt not in F.FORMATS:
                self.unsupported("format", f"{fmt!r} (supported: {', '.join(F.FORMATS)})")
            else:
                if "pattern" in s:
                    self.unsupported("format", "combined with pattern")
                content = F.FORMATS[fmt]
        if content is None and "pattern" in s:
            content = self.pattern(s["pattern"])
        if content is not None:
            if has_len and not _lengths_within(content, lo, hi):
                self.unsupported("minLength/maxLength", "with a pattern/format whose matches are not all within "
                                 "the length bounds (a regex cannot intersect them)")
            return '"' + content + '"'
        count = f"{{{lo},{'' if hi is None else hi}}}"
        if count == "{0,}":
            count = "*"
        return '"' + F.STRING_CHAR + count + '"'

    def pattern(self, pat: str) -> str:
        """A JSON-schema (ECMA, unanchored search) pattern as the raw content of a JSON string."""
        if not isinstance(pat, str):
            raise GrammarError("pattern must be a string")
        from .dfa import regex_to_dfa

        core = pat
        lead = core.startswith("^")
        trail = core.endswith("$") and not core.endswith("\\$")
        core = core[1 if lead else 0 : len(core) - (1 if trail else 0)]
        body = f"(?a:{core})"
        try:
            dfa = regex_to_dfa(body)
        except GrammarError as e:
            raise GrammarError(f"pattern {pat!r}: {e}") from None
        needs_escape = list(b'"\\') + list(range(0x20))
        live = dfa.trans[1:, needs_escape] != 0
        if live.any():
            self.unsupported("pattern", f"{pat!r} can match characters JSON must escape (quote, backslash, control)")
        head = "" if lead else F.STRING_CHAR + "*"
        tail = "" if trail else F.STRING_CHAR + "*"
        return head + body + tail

    def number(self, s: dict) -> str:
        """Unbounded: any JSON number. Bounded: decimals without exponent inside the bounds (sound subset)."""
        bounds = {k: s[k] for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum") if k in s}
        if not bounds:
            return F.NUMBER
        for k, v in bounds.items():
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GrammarError(f"{k} must be a finite number, got {v!r}")
        lo, lo_excl = tightest(bounds, "minimum", "exclusiveMinimum", max)
        hi, hi_excl = tightest(bounds, "maximum", "exclusiveMaximum", min)
        return F.number_range(lo, lo_excl, hi, hi_excl)

    def integer(self, s: dict) -> str:
        lo = hi = None
        for key, adj, is_lo in (("minimum", 0, True), ("exclusiveMinimum", 1, True),
                                ("maximum", 0, False), ("exclusiveMaximum", -1, False)):
            if key not in s:
                continue
            v = s[key]
            if isinstance(v, bool) or not isinstance(v, (int, float)):
                raise GrammarError(f"{key} must be a number, got {v!r}")
            if is_lo:
                b = math.ceil(v) if adj == 0 else math.floor(v) + 1
                lo = b if lo is None else max(lo, b)
            else:
                b = math.floor(v) if adj == 0 else math.ceil(v) - 1
                hi = b if hi is None else min(hi, b)
        return F.integer_range(lo, hi)

    def array(self, s: dict, refs: tuple) -> str | None:
        lo = check_count("minItems", s.get("minItems", 0))
        hi = s.get("maxItems")
        if hi is not None:
            hi = check_count("maxItems", hi)
        prefix = s.get("prefixItems", [])
        if not isinstance(prefix, list):
            raise GrammarError("prefixItems must be an array")
        items = s.get("items", True)
        if isinstance(items, list):
            raise GrammarError("'items' as an array (draft-04 tuples): use prefixItems")
        item_re = self.convert(items, refs) if items is not True else self.any_value(ANY_DEPTH - 1)
        pre = [self.convert(p, refs) for p in prefix]
        # a prefix position that admits nothing caps the length just before it
        usable = len(pre)
        for i, p in enumerate(pre):
            if p is None:
                usable = i
                break
        pre = pre[:usable]
        cap_hi = hi
        if usable < len(prefix):
            cap_hi = usable if cap_hi is None else min(cap_hi, usable)
        elif item_re is None:
            cap_hi = len(pre) if cap_hi is None else min(cap_hi, len(pre))
        if cap_hi is not None and cap_hi < lo:
            return None
        alts = []
        # lengths served by the prefix alone (n <= len(pre))
        for n in range(lo, len(pre) + 1):
            if cap_hi is not None and n > cap_hi:
                break
            if n == 0:
                alts.append(self.open_arr + self.close_arr)
            elif n < len(pre) or item_re is None or (cap_hi is not None and cap_hi == n):
                alts.append(self.open_arr + self.comma.join(pre[:n]) + self.close_arr)
        # lengths > len(pre): the whole prefix, then items
        if item_re is not None and (cap_hi is None or cap_hi > len(pre)):
            k_lo = max(lo - len(pre), 1)
            k_hi = None if cap_hi is None else cap_hi - len(pre)
            if pre:
                rep = self._repeat(self.comma + item_re, k_lo, k_hi)
                alts.append(self.open_arr + self.comma.join(pre) + rep + self.close_arr)
                if lo <= len(pre):  # the prefix alone is also fine
                    alts.append(self.open_arr + self.comma.join(pre) + self.close_arr)
            else:
                rep = item_re + self._repeat(self.comma + item_re, k_lo - 1, None if k_hi is None else k_hi - 1)
                alts.append(self.open_arr + rep + self.close_arr)
        alts = list(dict.fromkeys(alts))
        if not alts:
            return None
        return alts[0] if len(alts) == 1 else "(?:" + "|".join(alts) + ")"

    @staticmethod
    def _repeat(unit: str, lo: int, hi: int | None) -> str:
        if hi is not None and hi <= 0:
            return ""
        if hi is None:
            return f"(?:{unit}){{{lo},}}" if lo else f"(?:{unit})*"
        return f"(?:{unit}){{{lo},{hi}}}"

    def object(self, s: dict, refs: tuple) -> str | None:
        props = s.get("properties", {})
        if not isinstance(props, dict):
            raise GrammarError("properties must be an object")
        required = s.get("required", [])
        if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
            raise GrammarError("required must be an array of strings")
        addl = s.get("additionalProperties", True)
        if not props and not required:
            return self.free_object(s, addl, refs)
        if "minProperties" in s or "maxProperties" in s:
            self.unsupported("minProperties/maxProperties", "only supported on objects without 'properties'")
        names = list(props)
        for r in required:  # required but not described: value per additionalProperties
            if r not in props:
                if addl is False:
                    raise GrammarError(f"required property {r!r} is forbidden by additionalProperties: false")
                names.append(r)
        req = set(required)
        frags = []
        for name in names:
            sub = props.get(name, addl if isinstance(addl, dict) else True)
            v = self.convert(sub, refs)
            if v is None:
                if name in req:
                    return None
                continue
            frags.append((re.escape(json.dumps(name, ensure_ascii=False)) + self.colon + v, name in req))
        if not frags:
            return self.open_obj + self.close_obj
        return self.open_obj + self._property_list(frags) + self.close_obj

    def _property_list(self, frags: list[tuple[str, bool]]) -> str:
        """Properties in schema order; optional ones may be skipped, commas stay well-placed."""
        c = self.comma
        req_idx = [i for i, (_, r) in enumerate(frags) if r]
        if req_idx:
            last = req_idx[-1]
            out = ""
            for i, (f, r) in enumerate(frags):
                if i < last:
                    out += f"{f}{c}" if r else f"(?:{f}{c})?"
                elif i == last:
                    out += f
                else:
                    out += f"(?:{c}{f})?"
            return out
        # none required: the first present property starts the list, later ones each add ", p"
        alts = []
        for i, (f, _) in enumerate(frags):
            tail = "".join(f"(?:{c}{g})?" for g, _ in frags[i + 1 :])
            alts.append(f + tail)
        return "(?:" + "|".join(alts) + ")?"

    def free_object(self, s: dict, addl: Any, refs: tuple) -> str:
        lo = check_count("minProperties", s.get("minProperties", 0))
        hi = s.get("maxProperties")
        if hi is not None:
            hi = check_count("maxProperties", hi)
        if addl is False:
            if lo > 0:
                raise GrammarError("minProperties > 0 with no allowed properties")
            return self.open_obj + self.close_obj
        v = self.any_value(ANY_DEPTH - 1) if addl is True else self.convert(addl, refs)
        if v is None:
            return self.open_obj + self.close_obj
        pair = F.STRING + self.colon + v
        if hi == 0:
            return self.open_obj + self.close_obj
        body = pair + self._repeat(self.comma + pair, max(lo - 1, 0), None if hi is None else hi - 1)
        return self.open_obj + (body if lo > 0 else f"(?:{body})?") + self.close_obj


def _lengths_within(content: str, lo: int, hi: int | None) -> bool:
    """Whether every string of `content` has between lo and hi characters (then the bounds are implied)."""
    from .dfa import char_length_range, regex_to_dfa

    shortest, longest = char_length_range(regex_to_dfa(content))
    return shortest >= lo and (hi is None or (longest is not None and longest <= hi))

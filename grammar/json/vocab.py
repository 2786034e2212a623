"""JSON Schema vocabularies per draft: which keywords assert, apply subschemas, identify, or only annotate."""

from __future__ import annotations

from typing import Any

DRAFTS = ("4", "6", "7", "2019-09", "2020-12")
DEFAULT_DRAFT = "2020-12"

_SCHEMA_URIS = {
    "draft-04": "4", "draft-06": "6", "draft-07": "7", "draft/2019-09": "2019-09", "draft/2020-12": "2020-12",
}

# Keywords whose value is one subschema / an array of subschemas / an object of subschemas.
_ONE = {"additionalProperties", "not", "propertyNames", "contains", "if", "then", "else", "additionalItems",
        "unevaluatedItems", "unevaluatedProperties", "items"}
_LIST = {"allOf", "anyOf", "oneOf", "prefixItems"}
_MAP = {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}

_COMMON_ASSERT = {
    "type", "enum", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum", "maxLength",
    "minLength", "pattern", "maxItems", "minItems", "uniqueItems", "maxProperties", "minProperties", "required",
    "format",
}
_COMMON_APPLY = {"allOf", "anyOf", "oneOf", "not", "items", "additionalItems", "properties", "patternProperties",
                 "additionalProperties", "dependencies", "$ref"}
_ANNOTATIONS = {"title", "description", "default", "examples", "readOnly", "writeOnly", "deprecated", "$comment",
                "contentMediaType", "contentEncoding", "contentSchema"}


def _table(assertions: set, applicators: set, core: set) -> dict[str, str]:
    t = {k: "annotate" for k in _ANNOTATIONS}
    t.update({k: "core" for k in core})
    t.update({k: "assert" for k in assertions})
    t.update({k: "apply" for k in applicators})
    return t


VOCABULARY: dict[str, dict[str, str]] = {
    "4": _table(_COMMON_ASSERT, _COMMON_APPLY, {"id", "$schema", "definitions"}),
    "6": _table(_COMMON_ASSERT | {"const"}, _COMMON_APPLY | {"contains", "propertyNames"},
                {"$id", "$schema", "definitions"}),
    "7": _table(_COMMON_ASSERT | {"const"}, _COMMON_APPLY | {"contains", "propertyNames", "if", "then", "else"},
                {"$id", "$schema", "definitions"}),
    "2019-09": _table(
        _COMMON_ASSERT | {"const", "dependentRequired", "minContains", "maxContains"},
        (_COMMON_APPLY - {"dependencies"}) | {"contains", "propertyNames", "if", "then", "else", "dependentSchemas",
                                              "unevaluatedItems", "unevaluatedProperties", "$recursiveRef"},
        {"$id", "$schema", "$defs", "definitions", "$anchor", "$recursiveAnchor", "$vocabulary"}),
    "2020-12": _table(
        _COMMON_ASSERT | {"const", "dependentRequired", "minContains", "maxContains"},
        (_COMMON_APPLY - {"dependencies", "additionalItems"}) | {
            "contains", "propertyNames", "if", "then", "else", "dependentSchemas", "unevaluatedItems",
            "unevaluatedProperties", "prefixItems", "$dynamicRef"},
        {"$id", "$schema", "$defs", "definitions", "$anchor", "$dynamicAnchor", "$vocabulary"}),
}
# 2019-09 and 2020-12 validators still honour "definitions" for $ref lookups (it is only a JSON pointer target).


def detect_draft(schema: Any, default: str = DEFAULT_DRAFT) -> str:
    """The draft named by the root's `$schema` (draft-04/06/07, 2019-09, 2020-12); `default` otherwise."""
    if isinstance(schema, dict):
        uri = schema.get("$schema")
        if isinstance(uri, str):
            for key, draft in _SCHEMA_URIS.items():
                if key in uri:
                    return draft
    return default


def subschema_slots(key: str, value: Any, draft: str) -> list[tuple[str, Any]]:
    """(path-part, subschema) pairs for the subschemas a keyword holds in this draft (none for other keywords)."""
    kind = VOCABULARY[draft].get(key)
    if kind not in ("apply", "core") and key not in ("definitions", "$defs"):
        return []
    if key == "items" and isinstance(value, list) and draft in ("4", "6", "7", "2019-09"):
        return [(str(i), v) for i, v in enumerate(value)]
    if key == "dependencies" and isinstance(value, dict):
        return [(k, v) for k, v in value.items() if isinstance(v, (dict, bool))]
    if key in _ONE and isinstance(value, (dict, bool)):
        return [("", value)]
    if key in _LIST and isinstance(value, list):
        return [(str(i), v) for i, v in enumerate(value)]
    if key in _MAP and isinstance(value, dict):
        return list(value.items())
    return []


def id_keyword(draft: str) -> str:
    return "id" if draft == "4" else "$id"


def ref_overrides_siblings(draft: str) -> bool:
    """Drafts 4-7: every keyword next to `$ref` is ignored."""
    return draft in ("4", "6", "7")

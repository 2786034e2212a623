"""Schema resources and references: $id / id / $anchor / $dynamicAnchor indexing, $ref and $dynamicRef lookup."""

from __future__ import annotations

import urllib.parse
from typing import Any

from ..errors import GrammarError
from .vocab import id_keyword, ref_overrides_siblings, subschema_slots

ROOT_URI = "https://sglpy.invalid/root.json"  # base URI of a root schema without $id
MAX_SCHEMA_DEPTH = 200  # nesting of the schema document itself (not of instances)


def _join(base: str, ref: str) -> str:
    if base.startswith("urn:") and ref.startswith("#"):
        return base.split("#", 1)[0] + ref
    return urllib.parse.urljoin(base, ref)


def _pointer(doc: Any, frag: str, ref: str) -> Any:
    node = doc
    for part in frag.split("/")[1:]:
        part = urllib.parse.unquote(part).replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise GrammarError(f"$ref {ref!r} does not resolve")
    return node


class SchemaRegistry:
    """Every schema resource of one root document, its anchors, and the base URI of each subschema."""

    def __init__(self, root: Any, draft: str):
        self.draft = draft
        self.resources: dict[str, Any] = {}
        self.duplicates: dict[str, list] = {}  # later resources with an $id already taken
        self.anchors: dict[str, Any] = {}
        self.dynamic: dict[str, dict[str, Any]] = {}  # resource URI -> {$dynamicAnchor name -> subschema}
        self.recursive: set[str] = set()  # resources whose root has $recursiveAnchor: true
        self.base_of: dict[int, str] = {}
        self.depth = 0  # deepest subschema nesting of the document
        self.ref_count = 0  # $ref / $dynamicRef / $recursiveRef occurrences
        self._walk(root)

    def _walk(self, root: Any) -> None:
        idk = id_keyword(self.draft)
        self.resources[ROOT_URI] = root
        stack: list[tuple[Any, str, int]] = [(root, ROOT_URI, 0)]
        while stack:
            node, base, depth = stack.pop()
            if depth > MAX_SCHEMA_DEPTH:
                raise GrammarError(f"json_schema is nested too deeply (more than {MAX_SCHEMA_DEPTH} levels)")
            if not isinstance(node, dict):
                continue
            self.depth = max(self.depth, depth)
            self.ref_count += sum(k in node for k in ("$ref", "$dynamicRef", "$recursiveRef"))
            ident = node.get(idk)
            if isinstance(ident, str) and not ("$ref" in node and ref_overrides_siblings(self.draft)):
                full = _join(base, ident)
                uri, frag = urllib.parse.urldefrag(full)
                if ident.startswith("#") and frag and self.draft in ("4", "6", "7"):
                    self.anchors[f"{base}#{frag}"] = node  # location-independent identifier
                elif uri:
                    base = uri
                    if self.resources.setdefault(uri, node) is not node:  # an $id used twice (invalid, seen)
                        self.duplicates.setdefault(uri, []).append(node)
            self.base_of[id(node)] = base
            for key in ("$anchor", "$dynamicAnchor"):
                name = node.get(key)
                if isinstance(name, str) and self.draft in ("2019-09", "2020-12"):
                    self.anchors[f"{base}#{name}"] = node
                    if key == "$dynamicAnchor":
                        self.dynamic.setdefault(base, {})[name] = node
            if node.get("$recursiveAnchor") is True and self.resources.get(base) is node:
                self.recursive.add(base)
            for key, value in node.items():
                for _, sub in subschema_slots(key, value, self.draft):
                    stack.append((sub, base, depth + 1))

    def base(self, node: Any, default: str) -> str:
        return self.base_of.get(id(node), default) if isinstance(node, dict) else default

    def resolve(self, ref: Any, base: str) -> tuple[Any, str]:
        """(target subschema, its base URI) for a $ref relative to `base`; GrammarError if remote or missing."""
        if not isinstance(ref, str):
            raise GrammarError(f"$ref must be a string, got {ref!r}")
        uri, frag = urllib.parse.urldefrag(_join(base, ref))
        doc = self.resources.get(uri)
        if doc is None:
            raise GrammarError(f"unsupported $ref {ref!r}: remote references are not supported "
                               "(only references into this document, by JSON pointer, $id or $anchor)")
        if not frag:
            return doc, uri
        if frag.startswith("/"):
            for other in self.duplicates.get(uri, []):  # a pointer into whichever resource has that path
                try:
                    _pointer(doc, frag, ref)
                    break
                except GrammarError:
                    doc = other
            node = _pointer(doc, frag, ref)
            return node, self.base(node, uri)
        node = self.anchors.get(f"{uri}#{frag}")
        if node is None:
            raise GrammarError(f"$ref {ref!r} does not resolve (no anchor {frag!r})")
        return node, self.base(node, uri)

    def resolve_dynamic(self, ref: Any, base: str, scope: tuple[str, ...]) -> tuple[Any, str]:
        """$dynamicRef: the outermost resource in the dynamic scope with a matching $dynamicAnchor wins."""
        node, nbase = self.resolve(ref, base)
        frag = urllib.parse.urldefrag(_join(base, ref))[1]
        if frag and not frag.startswith("/") and isinstance(node, dict) and node.get("$dynamicAnchor") == frag:
            for res in scope:
                hit = self.dynamic.get(res, {}).get(frag)
                if hit is not None:
                    return hit, self.base(hit, res)
        return node, nbase

    def resolve_recursive(self, ref: Any, base: str, scope: tuple[str, ...]) -> tuple[Any, str]:
        """$recursiveRef (2019-09): with $recursiveAnchor the outermost such resource in scope wins."""
        node, nbase = self.resolve(ref, base)
        if isinstance(node, dict) and node.get("$recursiveAnchor") is True:
            for res in scope:
                if res in self.recursive:
                    return self.resources[res], res
        return node, nbase

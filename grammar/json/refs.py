"""Schema resources and references: $id / id / $anchor / $dynamicAnchor indexing, $ref and $dynamicRef lookup."""

from __future__ import annotations

import urllib.parse
from typing import Any, Mapping

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
    """Every schema resource of one root document (and of the documents its $refs reach), its anchors, and the
    base URI of each subschema.

    documents: pre-loaded schemas for remote references, retrieval URI -> schema (never fetched); those reached
    from the root (transitively) are indexed as if they had been retrieved from that URI."""

    def __init__(self, root: Any, draft: str, documents: Mapping[str, Any] | None = None):
        self.draft = draft
        self.resources: dict[str, Any] = {}
        self.duplicates: dict[str, list] = {}  # later resources with an $id already taken
        self.anchors: dict[str, Any] = {}
        self.dynamic: dict[str, dict[str, Any]] = {}  # resource URI -> {$dynamicAnchor name -> subschema}
        self.recursive: set[str] = set()  # resources whose root has $recursiveAnchor: true
        self.base_of: dict[int, str] = {}
        self.depth = 0  # deepest subschema nesting of the document
        self.ref_count = 0  # $ref / $dynamicRef / $recursiveRef occurrences
        self.loaded: list[str] = []  # documents reached from the root, in the order they were indexed
        self._refs: list[tuple[Any, str]] = []  # (reference, base URI) met by the walks
        self._walk(root, ROOT_URI)
        docs = {urllib.parse.urldefrag(k)[0]: v for k, v in (documents or {}).items()}
        for key, doc in list(docs.items()):  # a document is also found by its own root $id
            ident = doc.get(id_keyword(draft)) if isinstance(doc, dict) else None
            if isinstance(ident, str):
                docs.setdefault(urllib.parse.urldefrag(_join(key, ident))[0], doc)
        while self._refs:  # index each document a reference points into, until no new one is reached
            ref, base = self._refs.pop()
            uri = urllib.parse.urldefrag(_join(base, ref))[0] if isinstance(ref, str) else None
            if uri in docs and uri not in self.resources:
                if not isinstance(docs[uri], (dict, bool)):
                    raise GrammarError(f"schema document {uri!r} must be an object or boolean")
                self.loaded.append(uri)
                self._walk(docs[uri], uri)

    def _walk(self, root: Any, uri: str) -> None:
        idk = id_keyword(self.draft)
        self.resources[uri] = root
        stack: list[tuple[Any, str, int]] = [(root, uri, 0)]
        while stack:
            node, base, depth = stack.pop()
            if depth > MAX_SCHEMA_DEPTH:
                raise GrammarError(f"json_schema is nested too deeply (more than {MAX_SCHEMA_DEPTH} levels)")
            if not isinstance(node, dict):
                continue
            self.depth = max(self.depth, depth)
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
            for key in ("$ref", "$dynamicRef", "$recursiveRef"):
                if key in node:
                    self.ref_count += 1
                    self._refs.append((node[key], base))
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
            raise GrammarError(f"unsupported $ref {ref!r}: remote reference to {uri!r}, which is not among the "
                               "schema documents handed to the compiler (documents=...; nothing is fetched)")
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

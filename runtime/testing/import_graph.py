"""Import graphs read from source (ast), imports inside functions included: circles among a package's modules."""

from __future__ import annotations

import ast
import pathlib


def module_names(folder: pathlib.Path, package: str) -> dict[str, pathlib.Path]:
    """Dotted name -> file for every module under `folder`, installed as `package` (an __init__ is its package)."""
    out = {}
    for path in sorted(folder.rglob("*.py")):
        parts = list(path.relative_to(folder).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join([package, *parts])] = path
    return out


def _runs(node: ast.AST) -> bool:
    """False for `if TYPE_CHECKING:` blocks: their imports never execute."""
    if isinstance(node, ast.If):
        test = node.test
        name = test.id if isinstance(test, ast.Name) else test.attr if isinstance(test, ast.Attribute) else None
        return name != "TYPE_CHECKING"
    return True


def _imports(tree: ast.AST):
    stack = [tree]
    while stack:
        node = stack.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        if isinstance(node, ast.If) and not _runs(node):
            stack.extend(node.orelse)
            continue
        stack.extend(ast.iter_child_nodes(node))


def import_edges(folder: pathlib.Path, package: str) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (anywhere in its body, functions included)."""
    names = module_names(folder, package)
    edges: dict[str, set[str]] = {m: set() for m in names}
    for mod, path in names.items():
        here = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
        for node in _imports(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                if node.level:
                    base = here.rsplit(".", node.level - 1)[0] if node.level > 1 else here
                    src = f"{base}.{node.module}" if node.module else base
                else:
                    src = node.module or ""
                subs = [f"{src}.{a.name}" for a in node.names if f"{src}.{a.name}" in names]
                targets = subs + ([src] if len(subs) < len(node.names) else [])  # a name, not a submodule: src's own
            for t in targets:  # importing a.b.c runs a and a.b first, except the importer's own enclosing packages
                parts = t.split(".")
                for i in range(len(parts), 0, -1):
                    dep = ".".join(parts[:i])
                    if dep in names and dep != mod and not mod.startswith(dep + "."):
                        edges[mod].add(dep)
    return edges


def import_cycles(folder: pathlib.Path, package: str) -> list[list[str]]:
    """Every set of modules that import each other in a circle (strongly connected, size > 1), sorted."""
    edges = import_edges(folder, package)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    on_stack: set[str] = set()
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:  # Tarjan; recursion depth is bounded by the module count
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return sorted(found)

"""Import graphs read from source (ast), and the circles in them: a reusable helper for tests/test_import_cycles.py.

`module_graph(folder, package)` maps every module of a source folder (installed as `package`) to the modules of
the same project it imports, at the top or inside functions alike (imports under `if TYPE_CHECKING:` never run
and are left out). `cycles(graph)` lists the strongly connected components with more than one module, each
sorted: an empty list means no import circle. Extend a check to another folder by merging its graph in.
"""

from __future__ import annotations

import ast
import pathlib


def _module_name(path: pathlib.Path, folder: pathlib.Path, package: str) -> str:
    parts = list(path.relative_to(folder).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join([package, *parts])


def _is_type_checking(node: ast.If) -> bool:
    t = node.test
    return (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING") or (
        isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, module: str, is_package: bool) -> set[tuple[str, tuple[str, ...]]]:
    """What `module` imports: (module, ()) for `import module`, (X, names) for `from X import names`."""
    out: set[tuple[str, tuple[str, ...]]] = set()
    base = module.split(".") if is_package else module.split(".")[:-1]

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.update((a.name, ()) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                anchor = base[: len(base) - node.level + 1]
                src = ".".join(anchor + ([node.module] if node.module else []))
            else:
                src = node.module or ""
            out.add((src, tuple(a.name for a in node.names)))
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def module_graph(folder: pathlib.Path, package: str) -> dict[str, set[tuple[str, tuple[str, ...]]]]:
    """Module -> its imports (see _imports), over every .py file under `folder` (installed as `package`)."""
    files = {_module_name(p, folder, package): p for p in sorted(folder.rglob("*.py"))}
    return {name: _imports(ast.parse(p.read_text(), str(p)), name, p.name == "__init__.py")
            for name, p in files.items()}


def merge(*graphs: dict[str, set[tuple[str, tuple[str, ...]]]]) -> dict[str, set[str]]:
    """One module graph of several folders: `from X import y` is an edge to X.y where that is a module, else to X;
    edges to modules outside every folder are dropped."""
    raw: dict[str, set[tuple[str, tuple[str, ...]]]] = {}
    for graph in graphs:
        raw.update(graph)
    g: dict[str, set[str]] = {}
    for m, imports in raw.items():
        targets = set()
        for src, names in imports:
            subs = {f"{src}.{n}" for n in names if f"{src}.{n}" in raw}
            targets |= subs
            if not names or len(subs) < len(names):
                targets.add(src)
        g[m] = {t for t in targets if t in raw and t != m}
    return g


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph.get(nxt, ())))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                comp = []
                while True:
                    m = stack.pop()
                    on_stack.discard(m)
                    comp.append(m)
                    if m == node:
                        break
                if len(comp) > 1:
                    found.append(sorted(comp))
    return found

"""No import circle in sglpy/ or runtime/, counting imports inside functions (read from the source by ast)."""

import pathlib

from import_graph import cycles, merge, module_graph

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_no_import_circle_in_the_frontend_and_the_runtime():
    graph = merge(module_graph(ROOT / "sglpy", "sglpy"), module_graph(ROOT / "runtime", "sglpy.runtime"))
    assert len(graph) > 100  # both folders were read
    assert cycles(graph) == []


def test_the_cycle_finder_finds_circles_through_function_level_imports(tmp_path):
    pkg = tmp_path / "p"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from .b import x\n")
    (pkg / "b.py").write_text("def f():\n    from . import c\n")
    (pkg / "c.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import f\n"
                              "import p.a\n")
    (pkg / "d.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import x\n")
    assert cycles(merge(module_graph(pkg, "p"))) == [["p.a", "p.b", "p.c"]]

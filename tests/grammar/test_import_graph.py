"""grammar/ has no import circle, counting imports inside functions (read from the source with ast)."""

import pathlib

from sglpy.runtime.testing.import_graph import import_cycles, import_edges

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_grammar_has_no_import_circle():
    assert import_cycles(ROOT / "grammar", "sglpy.grammar") == []


def _package(tmp_path, files: dict[str, str]) -> pathlib.Path:
    for name, text in files.items():
        path = tmp_path / "pkg" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return tmp_path / "pkg"


def test_a_circle_closed_inside_a_function_is_found(tmp_path):
    pkg = _package(tmp_path, {
        "__init__.py": "from .a import f\n",
        "a.py": "from .sub.b import g\n\ndef f():\n    return g()\n",
        "sub/__init__.py": "",
        "sub/b.py": "def g():\n    from ..a import f\n    return f\n",
        "c.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .a import f\nfrom . import d\n",
        "d.py": "import pkg.c\n",
    })
    edges = import_edges(pkg, "pkg")
    assert edges["pkg.sub.b"] == {"pkg.a"}
    assert edges["pkg.a"] == {"pkg.sub", "pkg.sub.b"}  # importing pkg.sub.b runs pkg.sub's __init__ first
    assert edges["pkg.c"] == {"pkg.d"}  # TYPE_CHECKING imports never run; `from . import d` is the submodule
    assert import_cycles(pkg, "pkg") == [["pkg.a", "pkg.sub.b"], ["pkg.c", "pkg.d"]]

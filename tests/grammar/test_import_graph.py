"""grammar/ has no import circle, counting imports inside functions (read from the source by tests/import_graph.py)."""

import pathlib

from import_graph import cycles, merge, module_graph

ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_grammar_has_no_import_circle():
    graph = merge(module_graph(ROOT / "grammar", "sglpy.grammar"))
    assert len(graph) > 30  # the whole folder was read, its concept folders included
    assert cycles(graph) == []

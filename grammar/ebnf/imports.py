"""EBNF `%import` without the filesystem: only lark's bundled grammars, read once, served from memory.

Lark resolves `%import a.b` by opening `a/b.lark` relative to its import paths (the working directory
included). A request's grammar must never reach the filesystem, so `Lark(..., import_paths=[loader])`
gets `bundled_loader`: it serves lark's own grammars (common, unicode, lark, python) from memory and
refuses every other name with a GrammarError, which stops lark before it tries any path.
"""

from __future__ import annotations

import functools
import pkgutil

from ..errors import GrammarError

BUNDLED = ("common", "unicode", "lark", "python")


@functools.lru_cache(maxsize=1)
def bundled_grammars() -> dict[str, str]:
    """lark's bundled grammars by file name ("common.lark" -> text), read once (call at startup)."""
    out = {}
    for name in BUNDLED:
        data = pkgutil.get_data("lark", f"grammars/{name}.lark")
        if data is not None:
            out[f"{name}.lark"] = data.decode("utf-8")
    return out


def bundled_loader(base_path, grammar_path: str) -> tuple[str, str]:
    """lark import loader: (path, text) of a bundled grammar; GrammarError for any other import."""
    texts = bundled_grammars()
    text = texts.get(grammar_path)
    if text is None:
        shown = grammar_path[:-5] if grammar_path.endswith(".lark") else grammar_path
        shown = shown.replace("/", ".").replace("\\", ".")
        allowed = ", ".join(n[:-5] for n in texts)
        raise GrammarError(f"EBNF %import of {shown!r} is refused: grammars never read files; only lark's "
                           f"bundled grammars can be imported ({allowed}), e.g. %import common.NUMBER")
    return f"<lark bundled>/{grammar_path}", text

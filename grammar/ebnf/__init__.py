"""Context-free grammars (lark EBNF) as guides, with `%import` served from lark's bundled grammars only."""

from .guide import EBNFGuide

__all__ = ["EBNFGuide"]

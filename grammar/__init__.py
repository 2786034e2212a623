"""Constrained decoding: regex / JSON schema / EBNF -> token-level guides. No torch, no runtime imports."""

from .compiler import DTYPE_REGEX, GrammarCompiler, choices_regex
from .errors import GrammarError
from .guide import Guide, RegexGuide
from .tokens.jump import JumpResult
from .tokens.vocab import TokenizerInfo

__all__ = [
    "DTYPE_REGEX",
    "GrammarCompiler",
    "GrammarError",
    "Guide",
    "JumpResult",
    "RegexGuide",
    "TokenizerInfo",
    "choices_regex",
]

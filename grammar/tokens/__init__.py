"""The vocabulary side: token id -> bytes and token tries (vocab), lazy per-state token masks of an automaton (masks),
the eager index of EBNF terminals (index), jump-forward (jump)."""

from .index import TokenIndex, build_index
from .jump import JumpResult, jump_tokens
from .masks import MaskTable, WalkTables
from .vocab import TokenizerInfo

__all__ = ["JumpResult", "MaskTable", "TokenIndex", "TokenizerInfo", "WalkTables", "build_index", "jump_tokens"]

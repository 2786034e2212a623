"""The vocabulary side: token id -> bytes (vocab), per-state token masks of a DFA (index), jump-forward (jump)."""

from .index import TokenIndex, build_index
from .jump import JumpResult, jump_tokens
from .vocab import TokenizerInfo

__all__ = ["JumpResult", "TokenIndex", "TokenizerInfo", "build_index", "jump_tokens"]

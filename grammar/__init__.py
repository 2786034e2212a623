"""Constrained decoding: regex / JSON schema / EBNF -> token-level guides. No torch, no runtime imports."""

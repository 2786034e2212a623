"""Test support shipped with the package: tiny models, a fake engine, a server harness, kernel cases, runner KV."""

from .tiny_model import make_tiny_model

__all__ = ["make_tiny_model"]

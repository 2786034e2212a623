"""sglpy: SGLang-compatible structured-generation frontend on its own runtime."""

__version__ = "0.1.0"

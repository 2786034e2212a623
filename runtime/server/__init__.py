"""`sglpy serve`: the HTTP server process and its engine process. `main` is the command-line entry point."""

from .app import main

__all__ = ["main"]

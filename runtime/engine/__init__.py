"""The engine: request building, scheduling, sampling, stop rules and output shaping around one step loop.

`Engine` is imported on first use, so the torch-free modules here (request_builder, stops, detokenizer)
import without torch.
"""

__all__ = ["Engine"]


def __getattr__(name):
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(f"module 'sglpy.runtime.engine' has no attribute {name!r}")

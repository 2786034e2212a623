"""The engine: request building, scheduling, sampling, stop rules and output shaping around one step loop.

`Engine` is imported on first use, so the torch-free modules here (request_builder, stops, detokenizer)
import without torch.
"""

__all__ = ["Engine", "preload"]


def preload(model=None, **engine_kwargs) -> None:
    """Import what building an Engine imports and read the model's config and tokenizer files (a standby engine
    process of the server runs this, then waits: its restart skips the imports)."""
    from transformers import AutoConfig, AutoTokenizer

    from ..model.loader import resolve_model_path
    from .engine import Engine  # noqa: F401 - torch and the model code

    path = resolve_model_path(model)
    AutoConfig.from_pretrained(path)  # the model family's configuration module
    AutoTokenizer.from_pretrained(path)


def __getattr__(name):
    if name == "Engine":
        from .engine import Engine

        return Engine
    raise AttributeError(f"module 'sglpy.runtime.engine' has no attribute {name!r}")

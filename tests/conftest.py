"""Shared test setup. TRITON_INTERPRET must be set before any kernel module imports triton."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def default_model_path():
    """HF folder of the embedded default model (converted once into the cache)."""
    import importlib.util

    from sglpy.runtime.model.loader import DEFAULT_MODEL_PACKAGE, resolve_model_path

    if importlib.util.find_spec(DEFAULT_MODEL_PACKAGE) is None:  # the GPU image carries no model (docs/gpu.md)
        pytest.skip(f"the default model's package {DEFAULT_MODEL_PACKAGE} is not installed (make venv installs it)")
    return resolve_model_path(None)


@pytest.fixture(scope="session")
def tiny_model_path(tmp_path_factory):
    """A tiny random-weight Llama folder (2 layers, GQA 4:2) with the default tokenizer."""
    from sglpy.runtime.testing import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("models") / "tiny-llama")

"""Shared test setup. TRITON_INTERPRET must be set before any kernel module imports triton."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# pytest-xdist workers share the machine's cores: each worker, and every engine or server process it starts (they
# inherit this), gets cores // workers torch threads. `make test`'s two workers on a 2-core machine with torch's
# default of 2 threads each put 4+ OpenMP threads on 2 cores, whose barriers then wait on descheduled threads: the
# programs-over-HTTP tests took 68.5 s of CPU instead of 20.0 s. tests/kernels/conftest.py keeps 2 threads for the
# kernels' own tests (their multi-thread splits are what they check).
_XDIST_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _XDIST_WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, len(os.sched_getaffinity(0)) // _XDIST_WORKERS)))

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

"""The backend-agnostic test programs (sglpy.test_programs) on the fake backend, the in-process
engine on the default model, and our HTTP server (through sgl.Runtime / RuntimeEndpoint)."""

import pytest

import sglpy as sgl
from sglpy import test_programs as programs
from sglpy.backend_fake import FakeBackend

IDS = [p.__name__.removeprefix("test_") for p in programs.ALL_PROGRAMS]


@pytest.fixture
def fake_backend():
    old = sgl.global_config.default_backend
    backend = FakeBackend()
    sgl.set_default_backend(backend)
    yield backend
    sgl.set_default_backend(old)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("program", programs.ALL_PROGRAMS, ids=IDS)
def test_program_on_fake_backend(fake_backend, program):
    program()


@pytest.fixture(scope="module")
def engine_backend():
    import torch

    torch.set_num_threads(2)
    backend = sgl.Engine()
    yield backend
    backend.shutdown()


@pytest.fixture(scope="module")
def http_runtime():
    runtime = sgl.Runtime()
    yield runtime
    runtime.shutdown()


def _constraints_supported(backend) -> bool:
    if hasattr(backend, "engine"):
        return getattr(backend.engine, "constrained", None) is not None
    return bool(backend.model_info.get("supports_constraints"))


def _run(backend, program):
    if program.__name__ in programs.CONSTRAINED_PROGRAMS and not _constraints_supported(backend):
        pytest.skip("the runtime has no constrained-decoding hook yet (regex/json_schema would be ignored)")
    old = sgl.global_config.default_backend
    sgl.set_default_backend(backend)
    try:
        program()
    finally:
        sgl.set_default_backend(old)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("program", programs.ALL_PROGRAMS, ids=IDS)
def test_program_on_engine(engine_backend, program):
    _run(engine_backend, program)


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("program", programs.ALL_PROGRAMS, ids=IDS)
def test_program_over_http(http_runtime, program):
    _run(http_runtime.endpoint, program)

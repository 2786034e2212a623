"""The kernels' tests run with at least 2 torch threads, whatever the worker's share of the cores (tests/conftest.py):
the native kernels split work by thread (flash-decoding chunks, row blocks), and those splits are what they check."""

import pytest


@pytest.fixture(autouse=True)
def _two_threads_at_least():
    import torch

    threads = torch.get_num_threads()
    if threads < 2:
        torch.set_num_threads(2)
    yield
    if threads < 2:
        torch.set_num_threads(threads)

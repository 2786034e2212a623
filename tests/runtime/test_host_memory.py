"""glibc's malloc keeps a CPU engine's freed step-sized blocks (engine/host_memory.py)."""

import ctypes
import ctypes.util
import threading
import time

import pytest
import torch

from sglpy.runtime.engine import host_memory
from sglpy.runtime.engine.sampler import Sampler


def _glibc() -> bool:
    try:
        return hasattr(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6"), "gnu_get_libc_version")
    except OSError:
        return False


@pytest.mark.skipif(not _glibc(), reason="glibc's mallopt only")
def test_a_cpu_sampler_makes_freed_logits_blocks_reusable():
    Sampler(0, torch.device("cpu"))  # what a CPU engine builds
    assert host_memory.keep_freed_blocks() is True  # set once; asking again changes nothing

    # a step's logits (256 x 49152 float32, 50 MB) allocated and freed on a thread: with the thresholds set the
    # block is reused (no munmap + fresh page faults per step). Timing only as a loose check: the free of an
    # mmapped block costs milliseconds, of a kept one microseconds
    def frees(out: list):
        for _ in range(6):
            x = torch.empty(256, 49152).fill_(1.0)
            t = time.perf_counter()
            del x
            out.append(time.perf_counter() - t)

    got: list = []
    th = threading.Thread(target=frees, args=(got,))
    th.start()
    th.join()
    assert min(got[1:]) < 1e-3, got

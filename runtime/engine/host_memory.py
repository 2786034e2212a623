"""Host memory for a CPU engine: glibc's malloc keeps the step's large freed blocks for the next step.

Every decode step allocates its logits ([batch, vocab] float32: 50 MB at batch 256 with a 49,152-token vocabulary)
and frees them at the end of the step. glibc serves a block that large with its own mmap and returns it to the
system on free, so each step paid a munmap (3-8 ms at batch 256 on a 2-vCPU VM, on the loop thread) and then
page faults and zeroing for a fresh mapping in the next step's lm_head. Raising malloc's mmap and trim thresholds
makes such blocks come from malloc's heaps, where a freed block is reused by the next step. Allocators that
PyTorch's CPU guides recommend (jemalloc, tcmalloc) do the same by design.

The setting is process-wide; it is made once, after the model and the KV pool are allocated (blocks above the
mmap threshold, like those, are still mapped and unmapped on their own), and the memory it keeps is bounded by the
trim threshold per heap.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

logger = logging.getLogger(__name__)

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 64 << 20  # blocks below this come from malloc's heaps (a thread's heap holds at most 64 MiB)
TRIM_THRESHOLD = 128 << 20  # free memory kept at the top of a heap before it is returned to the system

_done: bool | None = None  # the outcome of the one attempt per process


def keep_freed_blocks() -> bool:
    """Set glibc malloc's thresholds (above) once per process; False where malloc is not glibc's or refuses."""
    global _done
    if _done is None:
        _done = _set_thresholds()
        if _done:
            logger.info("host malloc: blocks under %d MiB are reused across steps (glibc mallopt)",
                        MMAP_THRESHOLD >> 20)
    return _done


def _set_thresholds() -> bool:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
        if not hasattr(libc, "gnu_get_libc_version"):  # mallopt's parameters below are glibc's
            return False
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    # the trim threshold first: with it alone nothing changes; with both, freed blocks are reused
    return bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)) and bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))

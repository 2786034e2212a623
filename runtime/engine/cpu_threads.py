"""Run torch work beside an Engine without slowing it: on a short-lived thread (docs/runtime.md, "CPU threads").

libgomp keeps one OpenMP worker pool per thread that has run a parallel torch op; with two pools on a
machine with few cores its workers stop spinning between ops and every op pays a wake-up. A thread's pool
goes away when the thread ends, so work run here leaves the engine's loop thread the only pool.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

T = TypeVar("T")


def on_own_thread(fn: Callable[..., T], *args, **kwargs) -> T:
    """fn(*args, **kwargs) on a fresh thread that ends afterwards; returns its result or raises its exception."""
    with ThreadPoolExecutor(1, thread_name_prefix="sglpy-own-thread") as pool:
        return pool.submit(fn, *args, **kwargs).result()

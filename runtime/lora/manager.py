"""The engine's LoRA adapters: the adapters loaded by name (at most max_loaded_loras), and the pool they run from. Reading an adapter's files runs on
the caller's thread; adding, removing and resolving run on the engine's loop thread (no lock: one owner)."""

from __future__ import annotations

from typing import Iterable

import torch
from torch import nn

from .adapter import LoraAdapter, load_adapter
from .pool import LoraPool, base_shapes
from .spec import LORA_MODULES, LoraRef

DEFAULT_MAX_RANK = 16  # the pool's rank when neither max_lora_rank nor a startup adapter sets it


def pool_dtype(lora_dtype: str, model_dtype: torch.dtype, device: torch.device, quantization: str) -> torch.dtype:
    """The adapter pool's dtype for EngineConfig.lora_dtype. auto: bfloat16 under an int8 / int4 base on the CPU
    (the fused decode layers read half the bytes; measured in benchmarks/README.md), else the model's. On CUDA the
    Triton kernel reads the model's dtype only."""
    if lora_dtype == "auto":
        return torch.bfloat16 if device.type == "cpu" and quantization in ("int8", "int4") else model_dtype
    dtype = getattr(torch, lora_dtype)
    if device.type != "cpu" and dtype != model_dtype:
        raise ValueError(f"lora_dtype {lora_dtype} differs from the model's {model_dtype} (on {device.type} the "
                         f"adapters run in the model's dtype: use auto)")
    return dtype


class LoraManager:
    """Loaded adapters by name and the pool of the runner's model (built by the runner, once, after quantizing)."""

    def __init__(self, model: nn.Module, refs: tuple[LoraRef, ...], slots: int, max_loaded: int | None,
                 max_rank: int | None, targets: tuple[str, ...] | None, policy: str, device: torch.device,
                 dtype: torch.dtype):
        shapes = base_shapes(model)
        initial = [load_adapter(r.name, r.path, shapes) for r in refs]
        if max_loaded is not None and len(initial) > max_loaded:
            raise ValueError(f"{len(initial)} lora_paths given, above max_loaded_loras {max_loaded}")
        rank = max_rank or max((a.rank for a in initial), default=DEFAULT_MAX_RANK)
        if targets is None:
            used = set().union(*(a.target_modules for a in initial)) if initial else set(LORA_MODULES)
            targets = tuple(m for m in LORA_MODULES if m in used and m in shapes.modules)
        self.pool = LoraPool(model, slots, rank, frozenset(targets), policy, device, dtype)
        self.max_loaded = max_loaded
        self.adapters: dict[str, LoraAdapter] = {}
        for a in initial:
            self.pool.fits(a)
            self.adapters[a.name] = a

    def read(self, name: str, path: str) -> LoraAdapter:
        """Read and check an adapter's files (any thread); add() makes it servable."""
        if not isinstance(name, str) or not name or not isinstance(path, str) or not path:
            raise ValueError("loading a LoRA adapter needs a non-empty lora_name and lora_path")
        adapter = load_adapter(name, path, self.pool.shapes)
        self.pool.fits(adapter)
        return adapter

    def add(self, adapter: LoraAdapter) -> None:
        """Serve `adapter` under its name (loop thread); a taken name or a full registry is refused."""
        if adapter.name in self.adapters:
            raise ValueError(f"a LoRA adapter named {adapter.name!r} is already loaded (unload it first)")
        if self.max_loaded is not None and len(self.adapters) >= self.max_loaded:
            raise ValueError(f"{len(self.adapters)} LoRA adapters are loaded, the most max_loaded_loras allows "
                             f"(unload one first)")
        self.adapters[adapter.name] = adapter

    def remove(self, name: str, live: Iterable) -> LoraAdapter:
        """Stop serving `name` (loop thread); refused while a waiting or running request (`live`) uses it."""
        adapter = self.adapters.get(name)
        if adapter is None:
            raise ValueError(f"no LoRA adapter named {name!r} is loaded (loaded: {sorted(self.adapters)})")
        users = sum(1 for r in live if getattr(r, "lora", None) is adapter)
        if users:
            raise ValueError(f"LoRA adapter {name!r} is in use by {users} request(s); unload it when they finish")
        del self.adapters[name]
        self.pool.drop(adapter.uid)
        return adapter

    def resolve(self, name: str) -> LoraAdapter:
        """The adapter a request names (by name, or by the path it was loaded from)."""
        adapter = self.adapters.get(name)
        if adapter is None:
            adapter = next((a for a in self.adapters.values() if a.path == name), None)
        if adapter is None:
            raise ValueError(f"unknown LoRA adapter {name!r} (loaded: {sorted(self.adapters)})")
        return adapter

    def describe(self) -> list[dict]:
        """The loaded adapters, in load order."""
        return [a.describe() for a in self.adapters.values()]

"""KV pool sizing: max_total_tokens from device memory (mem_fraction_static), a pure function plus its CUDA probe."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30


@dataclass(frozen=True)
class MemoryPlan:
    """How the KV pool was sized: the numbers behind max_total_tokens (printed at engine start)."""

    total_bytes: int  # device memory in all
    free_bytes: int  # free after the weights were loaded
    reserved_bytes: int  # total * (1 - mem_fraction_static): left for activations, graphs, the allocator
    kv_bytes_per_token: int
    max_total_tokens: int

    def describe(self) -> str:
        """One line for the start-up log."""
        return (f"KV pool: {self.max_total_tokens} tokens x {self.kv_bytes_per_token} B = "
                f"{self.max_total_tokens * self.kv_bytes_per_token / GIB:.2f} GiB (device {self.total_bytes / GIB:.1f} "
                f"GiB, free after weights {self.free_bytes / GIB:.2f} GiB, kept back {self.reserved_bytes / GIB:.2f} GiB)")


def kv_bytes_per_token(num_layers: int, kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """Bytes one token's K and V take over all layers."""
    return 2 * num_layers * kv_heads * head_dim * dtype_bytes


def plan_kv_pool(total_bytes: int, free_bytes: int, mem_fraction_static: float, per_token: int,
                 overhead_bytes_per_token: int = 0) -> MemoryPlan:
    """Size the pool as SGLang does: what is free after the weights, minus total * (1 - fraction), in tokens.

    overhead_bytes_per_token counts per-slot costs outside K/V (none today). Raises ValueError when nothing
    is left, naming the numbers, rather than starting with a pool too small to serve one request.
    """
    if not 0 < mem_fraction_static < 1:
        raise ValueError(f"mem_fraction_static must be in (0, 1), got {mem_fraction_static}")
    if per_token <= 0 or total_bytes <= 0 or free_bytes < 0:
        raise ValueError(f"bad memory figures: total {total_bytes}, free {free_bytes}, per token {per_token}")
    reserved = int(total_bytes * (1 - mem_fraction_static))
    usable = free_bytes - reserved
    tokens = usable // (per_token + overhead_bytes_per_token) if usable > 0 else 0
    if tokens < 1:
        raise ValueError(f"no memory left for the KV cache: {free_bytes / GIB:.2f} GiB free after the weights, "
                         f"{reserved / GIB:.2f} GiB kept back by mem_fraction_static={mem_fraction_static}; "
                         "raise --mem-fraction-static or set --max-total-tokens")
    return MemoryPlan(total_bytes, free_bytes, reserved, per_token, int(tokens))


def plan_cuda_kv_pool(device, mem_fraction_static: float, per_token: int) -> MemoryPlan:
    """plan_kv_pool from torch.cuda.mem_get_info on `device` (call after the weights are loaded)."""
    import torch

    torch.cuda.synchronize(device)
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info(device)
    return plan_kv_pool(total, free, mem_fraction_static, per_token)

"""KV pool sizing: max_total_tokens from device memory (mem_fraction_static), a pure function plus its CUDA and CPU
probes."""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1 << 30
CPU_MIN_TOTAL_TOKENS = 4096  # a CPU pool never plans below this: its pages are committed only as requests fill it


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


def cpu_memory() -> tuple[int, int]:
    """(total, available) bytes of this machine's memory for the process: /proc/meminfo's MemTotal and MemAvailable,
    lowered to a cgroup v2 memory.max (and its headroom) when one is set."""
    info = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, _, rest = line.partition(":")
            info[key] = int(rest.split()[0]) * 1024
    total, available = info["MemTotal"], info.get("MemAvailable", info["MemFree"])
    try:
        limit = open("/sys/fs/cgroup/memory.max").read().strip()
        used = int(open("/sys/fs/cgroup/memory.current").read().strip())
        if limit != "max" and int(limit) < total:
            total, available = int(limit), min(available, max(0, int(limit) - used))
    except (OSError, ValueError):
        pass
    return total, available


def plan_cpu_kv_pool(mem_fraction_static: float, per_token: int, max_tokens: int) -> MemoryPlan:
    """plan_kv_pool from the machine's memory (call after the weights are loaded), at most max_tokens. The CPU pool
    commits pages as it fills (memory/kv_pool.py: cpu_zeros), so an idle pool costs address space, not memory."""
    total, available = cpu_memory()
    reserved = int(total * (1 - mem_fraction_static))
    floor = min(max_tokens, CPU_MIN_TOTAL_TOKENS)
    if (available - reserved) // per_token < floor:  # a busy machine: start small rather than refuse
        return MemoryPlan(total, available, reserved, per_token, floor)
    plan = plan_kv_pool(total, available, mem_fraction_static, per_token)
    if plan.max_total_tokens > max_tokens:
        plan = MemoryPlan(plan.total_bytes, plan.free_bytes, plan.reserved_bytes, per_token, max_tokens)
    return plan

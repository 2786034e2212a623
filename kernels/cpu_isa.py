"""Which instruction-set level the native CPU kernels are built for: the best this CPU runs, or a lower forced one.

Levels, best first: x86-64 avx512 (-march=x86-64-v4, plus AVX512-VNNI/BF16 and AVX-VNNI where the CPU has them),
avx2 (x86-64-v3: AVX2 + FMA, plus AVX-VNNI where present), baseline (x86-64: SSE2); aarch64 neon (plus the
dot-product instructions where the CPU has them), baseline (armv8-a). Each level's library is built and cached on
its own (kernels/cpu_native.py). SGLPY_CPU_ISA=<level> forces a lower level, so that one box can run and measure
every path; a level this CPU cannot run is refused with the flags it lacks.
"""

from __future__ import annotations

import platform
from dataclasses import dataclass

ISA_ENV = "SGLPY_CPU_ISA"

_X86_V3 = frozenset({"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe"})
_X86_V4 = _X86_V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}


@dataclass(frozen=True)
class IsaLevel:
    """One code path: its name, the CPU flags it needs, its -march and the optional extensions it adds per CPU."""

    name: str
    arch: str  # platform.machine() family: "x86_64" or "aarch64"
    needs: frozenset[str]
    march: str
    extras: tuple[tuple[str, str], ...] = ()  # (cpu flag, compiler flag) added when the CPU has the flag

    def compile_flags(self, cpu_flags: frozenset[str]) -> list[str]:
        """-march (and extension flags for what this CPU has) for a build of this level."""
        return [f"-march={self.march}"] + [flag for feature, flag in self.extras if feature in cpu_flags]


LEVELS: dict[str, tuple[IsaLevel, ...]] = {
    "x86_64": (
        IsaLevel("avx512", "x86_64", _X86_V4, "x86-64-v4",
                 (("avx512_vnni", "-mavx512vnni"), ("avx512_bf16", "-mavx512bf16"), ("avx_vnni", "-mavxvnni"))),
        IsaLevel("avx2", "x86_64", _X86_V3, "x86-64-v3", (("avx_vnni", "-mavxvnni"),)),
        IsaLevel("baseline", "x86_64", frozenset(), "x86-64"),
    ),
    "aarch64": (
        IsaLevel("neon", "aarch64", frozenset({"asimd"}), "armv8-a", (("asimddp", "+dotprod"),)),
        IsaLevel("baseline", "aarch64", frozenset(), "armv8-a"),
    ),
}


def machine_family(machine: str | None = None) -> str:
    """'x86_64', 'aarch64', or the machine name itself for a family without levels."""
    m = (machine or platform.machine()).lower()
    if m in ("x86_64", "amd64"):
        return "x86_64"
    if m in ("aarch64", "arm64"):
        return "aarch64"
    return m


def read_cpu_flags() -> frozenset[str]:
    """This CPU's feature flags (/proc/cpuinfo 'flags' on x86, 'Features' on ARM); empty where unreadable."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith(("flags", "Features")):
                    return frozenset(line.split(":", 1)[1].split())
    except OSError:
        pass
    return frozenset()


@dataclass(frozen=True)
class IsaChoice:
    """The level to build, its compiler flags, and why it was chosen."""

    level: IsaLevel
    flags: tuple[str, ...]
    reason: str  # "best this CPU runs" or "forced by SGLPY_CPU_ISA"

    @property
    def name(self) -> str:
        return self.level.name


def _with_extras(level: IsaLevel, cpu_flags: frozenset[str]) -> tuple[str, ...]:
    flags = level.compile_flags(cpu_flags)
    if level.arch == "aarch64":  # ARM extensions join the -march value: -march=armv8.2-a+dotprod
        ext = "".join(f for f in flags[1:])
        return (f"-march=armv8.2-a{ext}",) if ext else (flags[0],)
    return tuple(flags)


def choose_isa(cpu_flags: frozenset[str], forced: str | None = None, family: str | None = None) -> IsaChoice:
    """The best level `cpu_flags` run, or `forced` (a level name) when it is one this CPU runs.

    Raises ValueError naming the levels for an unknown name, and the missing flags for a level the CPU lacks.
    A family without levels (not x86-64 or aarch64) builds with -march=native."""
    family = family or machine_family()
    levels = LEVELS.get(family)
    if levels is None:
        if forced:
            raise ValueError(f"{ISA_ENV}={forced!r}: {family} has no selectable instruction-set levels")
        return IsaChoice(IsaLevel("native", family, frozenset(), "native"), ("-march=native",), "this CPU")
    if forced:
        names = [lv.name for lv in levels]
        match = [lv for lv in levels if lv.name == forced.strip().lower()]
        if not match:
            raise ValueError(f"{ISA_ENV}={forced!r} is not a CPU kernel level of {family}; use one of {names}")
        missing = sorted(match[0].needs - cpu_flags)
        if missing:
            runs = [lv.name for lv in levels if lv.needs <= cpu_flags]
            raise ValueError(f"{ISA_ENV}={forced!r}: this CPU lacks {', '.join(missing)}; it runs {runs}")
        return IsaChoice(match[0], _with_extras(match[0], cpu_flags), f"forced by {ISA_ENV}")
    best = next(lv for lv in levels if lv.needs <= cpu_flags)  # baseline needs nothing
    return IsaChoice(best, _with_extras(best, cpu_flags), "best this CPU runs")


def runnable_levels(cpu_flags: frozenset[str], family: str | None = None) -> list[str]:
    """Names of the levels this CPU runs, best first (what tests parametrize over)."""
    return [lv.name for lv in LEVELS.get(family or machine_family(), ()) if lv.needs <= cpu_flags]

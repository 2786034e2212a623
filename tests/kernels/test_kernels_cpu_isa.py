"""Instruction-set levels of the native CPU kernels (kernels/cpu_isa.py): the choice from a CPU's flags, forcing a
level (SGLPY_CPU_ISA), refusing one the CPU lacks, and the aarch64 NEON build (cross-compiled, run under qemu)."""

from __future__ import annotations

import pathlib
import shutil
import subprocess

import pytest

from sglpy.kernels import cpu_native
from sglpy.kernels.cpu_isa import ISA_ENV, choose_isa, runnable_levels
from sglpy.kernels.cpu_native import build_native, find_compiler

V3 = {"avx", "avx2", "fma", "bmi1", "bmi2", "f16c", "movbe", "sse4_2"}
ZEN4 = frozenset(V3 | {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16"})
ALDER_LAKE = frozenset(V3 | {"avx_vnni"})  # AVX2 with AVX-VNNI, no AVX-512
OLD_X86 = frozenset({"sse2", "sse4_2", "avx"})  # AVX without AVX2
ROOT = pathlib.Path(__file__).resolve().parents[2]


def test_the_best_level_a_cpu_runs_is_chosen_with_its_extensions():
    c = choose_isa(ZEN4, family="x86_64")
    assert c.name == "avx512" and c.flags == ("-march=x86-64-v4", "-mavx512vnni", "-mavx512bf16")
    assert c.reason == "best this CPU runs"
    c = choose_isa(ALDER_LAKE, family="x86_64")
    assert c.name == "avx2" and c.flags == ("-march=x86-64-v3", "-mavxvnni")
    assert choose_isa(frozenset(V3), family="x86_64").flags == ("-march=x86-64-v3",)
    assert choose_isa(OLD_X86, family="x86_64").name == "baseline"
    assert choose_isa(frozenset(), family="x86_64").flags == ("-march=x86-64",)  # flags unreadable: portable code
    arm = choose_isa(frozenset({"fp", "asimd", "asimddp"}), family="aarch64")
    assert arm.name == "neon" and arm.flags == ("-march=armv8.2-a+dotprod",)
    assert choose_isa(frozenset({"fp", "asimd"}), family="aarch64").flags == ("-march=armv8-a",)
    assert choose_isa(frozenset(), family="riscv64").flags == ("-march=native",)
    assert runnable_levels(ZEN4, "x86_64") == ["avx512", "avx2", "baseline"]
    assert runnable_levels(ALDER_LAKE, "x86_64") == ["avx2", "baseline"]


def test_a_lower_level_can_be_forced_a_higher_one_is_refused_by_name():
    c = choose_isa(ZEN4, "avx2", family="x86_64")
    assert c.name == "avx2" and c.flags == ("-march=x86-64-v3",) and ISA_ENV in c.reason
    assert choose_isa(ZEN4, "BASELINE", family="x86_64").name == "baseline"
    with pytest.raises(ValueError, match=r"SGLPY_CPU_ISA='avx512': this CPU lacks avx512bw, avx512cd, avx512dq, "
                                         r"avx512f, avx512vl; it runs \['avx2', 'baseline'\]"):
        choose_isa(ALDER_LAKE, "avx512", family="x86_64")
    with pytest.raises(ValueError, match=r"'sse9' is not a CPU kernel level of x86_64; use one of \['avx512', "
                                         r"'avx2', 'baseline'\]"):
        choose_isa(ZEN4, "sse9", family="x86_64")
    with pytest.raises(ValueError, match="is not a CPU kernel level of aarch64"):
        choose_isa(frozenset({"asimd"}), "avx2", family="aarch64")


def test_forcing_through_the_environment_names_the_level_or_refuses(monkeypatch):
    monkeypatch.setattr(cpu_native, "read_cpu_flags", lambda: ALDER_LAKE)
    monkeypatch.setattr(cpu_native, "machine_family", lambda: "x86_64", raising=False)
    monkeypatch.setenv(ISA_ENV, "avx512")
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)  # disabled kernels never look at the level
    cpu_native._build_for.cache_clear()
    try:
        with pytest.raises(ValueError, match="this CPU lacks avx512"):
            cpu_native.native_status()
        with pytest.raises(ValueError, match="this CPU lacks avx512"):
            cpu_native.native_lib()
    finally:
        cpu_native._build_for.cache_clear()


@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler on this machine")
@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86-64 levels")
def test_the_engine_status_names_the_level_in_use(monkeypatch):
    monkeypatch.delenv(cpu_native.DISABLE_ENV, raising=False)
    monkeypatch.setenv(ISA_ENV, "baseline")
    status = cpu_native.native_status()
    assert status.startswith("native: baseline (forced by SGLPY_CPU_ISA: -march=x86-64; GEMV activations int8)")
    assert cpu_native.native_isa() == "baseline"
    monkeypatch.delenv(ISA_ENV)
    best = runnable_levels(cpu_native.read_cpu_flags())[0]
    assert cpu_native.native_status().startswith(f"native: {best} (best this CPU runs: ")
    assert cpu_native.native_isa() == best


@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler on this machine")
def test_each_level_is_cached_under_its_own_key(tmp_path):
    levels = runnable_levels(cpu_native.read_cpu_flags())[:2]
    builds = [build_native(find_compiler(), cpu_native.cache_dir(), isa=level) for level in levels]
    assert all(b.lib is not None for b in builds), [b.detail for b in builds]
    assert len({b.lib._name for b in builds}) == len(levels)  # one file per level, none overwrites another
    refused = build_native(find_compiler(), tmp_path, isa="no-such-level")
    assert refused.lib is None and "not a CPU kernel level" in refused.detail


def _cross_compile(march: str, out: pathlib.Path) -> None:
    sources = sorted((ROOT / "kernels" / "csrc").glob("*.cpp"))
    cmd = ["aarch64-linux-gnu-g++", "-O2", f"-march={march}", "-static", "-std=c++17", "-fopenmp-simd",
           "-Wno-psabi", str(ROOT / "tests" / "kernels" / "native_selftest.cpp"), *map(str, sources), "-o", str(out)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]


@pytest.mark.skipif(find_compiler() is None, reason="no C++ compiler on this machine")
@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="x86-64 levels")
def test_float_activation_build_passes_its_self_test(tmp_path):
    """-DSGLPY_FLOAT_ACT (the A/B switch: float32 activations where the level would quantize them; every x86 level
    quantizes now, so nothing else runs these kernels on x86) at the baseline level, against plain loops."""
    exe = tmp_path / "selftest"
    sources = sorted((ROOT / "kernels" / "csrc").glob("*.cpp"))
    cmd = [find_compiler(), "-O1", "-march=x86-64", "-DSGLPY_FLOAT_ACT", "-std=c++17", "-fopenmp-simd", "-Wno-psabi",
           str(ROOT / "tests" / "kernels" / "native_selftest.cpp"), *map(str, sources), "-o", str(exe)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    r = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok (GEMV activations float32)", r.stdout + r.stderr


@pytest.mark.skipif(shutil.which("aarch64-linux-gnu-g++") is None,
                    reason="no aarch64 cross compiler (apt-get install g++-aarch64-linux-gnu): NEON path unverified")
@pytest.mark.parametrize("march,acts", [("armv8.2-a+dotprod", "int8"),
                                        pytest.param("armv8-a", "float32", marks=pytest.mark.slow)])
def test_neon_build_compiles_and_passes_its_self_test_under_qemu(tmp_path, march, acts):
    """The aarch64 build (NEON; sdot where the CPU has dotprod) against plain loops, run by qemu-user."""
    exe = tmp_path / "selftest"
    _cross_compile(march, exe)
    qemu = shutil.which("qemu-aarch64") or shutil.which("qemu-aarch64-static")
    if qemu is None:
        pytest.skip("compiled for aarch64, but qemu-user is not installed (apt-get install qemu-user): not run")
    r = subprocess.run([qemu, str(exe)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == f"ok (GEMV activations {acts})", r.stdout + r.stderr

"""Native CPU kernels (kernels/csrc/*.cpp): built per machine and ISA level by the system C++ compiler, loaded by ctypes.

The library is compiled on first use into $SGLPY_CACHE/cpu_kernels (default ~/.cache/sglpy), once per instruction-set
level (kernels/cpu_isa.py: the best this CPU runs, or a lower one forced by SGLPY_CPU_ISA), keyed by the sources, the
compiler and the flags, so later processes load it in milliseconds. Where it cannot run (no compiler, a failed
build, SGLPY_DISABLE_CPU_KERNELS=1), native_lib() is None and every wrapper falls back to its torch reference, which stays the oracle the tests compare the kernels with.

Threads: the kernels use OpenMP only when torch itself runs on libgomp; the library then binds to torch's already
loaded libgomp.so.1 (same soname), so torch's ops and ours share one worker pool per thread (a second pool made
every op on the 2-core box pay a wake-up: docs/runtime.md, "CPU threads"). Elsewhere they are built serial.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass

import torch

from .cpu_isa import ISA_ENV, IsaChoice, choose_isa, read_cpu_flags

logger = logging.getLogger(__name__)

DISABLE_ENV = "SGLPY_DISABLE_CPU_KERNELS"  # =1: torch references only (A/B runs, debugging)
CSRC = pathlib.Path(__file__).with_name("csrc")
DTYPE_CODES = {torch.float32: 0, torch.bfloat16: 1, torch.float16: 2}  # = enum DType in csrc/cpu_common.h

_P, _I64, _I32, _F32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
# name -> (restype, argtypes) of every exported function (their C signatures are in the sources)
SIGNATURES = {
    "sglpy_decode_attention": (_I64, [_P, _I64, _P, _P, _I32, _I64, _I64, _P, _I64, _I64, _P, _P, _P,
                                      _I64, _I64, _I64, _I64, _F32, _I32]),
    "sglpy_decode_attention_windowed": (_I64, [_P, _I64, _P, _P, _I32, _I64, _I64, _P, _I64, _I64, _P, _P, _P,
                                               _I64, _I64, _I64, _I64, _F32, _I64, _F32, _I32]),
    "sglpy_extend_attention_windowed": (_I64, [_P, _I64, _P, _P, _I32, _I64, _I64, _P, _I64, _I64, _P, _P, _P, _P,
                                               _P, _I64, _I64, _I64, _I64, _F32, _I64, _F32, _I32]),
    "sglpy_rmsnorm": (_I64, [_P, _P, _P, _F32, _P, _P, _I64, _I64, _I32]),
    "sglpy_rotary_store": (_I64, [_P, _I64, _I64, _I64, _I64, _I64, _P, _I64, _P, _P, _P, _I32, _I64, _I64, _P,
                                  _I32]),
    "sglpy_silu_mul": (_I64, [_P, _I64, _I64, _P, _I32]),
    "sglpy_decode_layer": (_I64, [_P, _P, _P, _P, _I32, _I64]),
    "sglpy_decode_layer_extend": (_I64, [_P, _P, _P, _P, _I32, _I64, _P, _P, _P]),
    "sglpy_decode_layer_lora": (_I64, [_P, _P, _P, _P, _I32, _I64, _P, _P]),
    "sglpy_extend_attention": (_I64, [_P, _I64, _P, _P, _I32, _I64, _I64, _P, _I64, _I64, _P, _P, _P, _P, _P,
                                      _I64, _I64, _I64, _I64, _F32, _I32]),
    "sglpy_gemv_int8": (_I64, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I32]),
    "sglpy_gemv_int4": (_I64, [_P, _I64, _I64, _P, _P, _P, _P, _I64, _I32]),
    "sglpy_gemv_f32": (_I64, [_P, _I64, _I64, _P, _P, _P, _I64, _I32]),
    "sglpy_dequant_rows": (_I64, [_I32, _P, _P, _I64, _I64, _I64, _P, _I32, _I32]),
    "sglpy_gemv_int8_activations": (_I32, []),
    "sglpy_gemv_int8_weight_act_max": (_I32, []),
    "sglpy_moe_experts": (_I64, [_P, _I64, _I64, _I64, _I64, _I64, _P, _P, _I32, _P, _P, _P, _P, _P, _I32]),
}


@dataclass(frozen=True)
class NativeBuild:
    """The loaded library, or None with the reason; `detail` says what was built (compiler, flags, file)."""

    lib: ctypes.CDLL | None
    detail: str
    isa: str = ""  # the instruction-set level it was built for (kernels/cpu_isa.py)


def bind_signatures(lib: ctypes.CDLL, signatures: dict) -> ctypes.CDLL:
    """Set restype/argtypes of the entry points `signatures` names ({name: (restype, argtypes)}) on lib; returns lib."""
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype, fn.argtypes = restype, argtypes
    return lib


def pool_readable(k_cache: torch.Tensor, v_cache: torch.Tensor) -> bool:
    """Whether the native kernels read a layer's K/V pool [slots, kv_heads, head_dim] as it is: on CPU, a dtype they
    convert, K and V alike, each slot's [kv_heads, head_dim] contiguous (slots may sit any stride apart)."""
    return (k_cache.device.type == "cpu" and k_cache.dtype in DTYPE_CODES and v_cache.dtype == k_cache.dtype
            and k_cache.stride() == v_cache.stride() and k_cache.stride(2) == 1
            and k_cache.stride(1) == k_cache.shape[2])


def cache_dir() -> pathlib.Path:
    """Where built libraries live: $SGLPY_CACHE/cpu_kernels (the model conversion cache's folder)."""
    return pathlib.Path(os.environ.get("SGLPY_CACHE", pathlib.Path.home() / ".cache" / "sglpy")) / "cpu_kernels"


def find_compiler() -> str | None:
    """$CXX, else g++, c++ or clang++ on PATH; None when there is none."""
    env = os.environ.get("CXX")
    if env:
        return shutil.which(env) or env
    return next((p for p in map(shutil.which, ("g++", "c++", "clang++")) if p), None)


def torch_openmp_is_libgomp() -> bool:
    """True when torch runs its parallel ops on OpenMP through a loaded libgomp (Linux wheels)."""
    if "OpenMP" not in torch.__config__.parallel_info() or not sys.platform.startswith("linux"):
        return False
    return bool(loaded_libgomp())


def loaded_libgomp() -> list[str]:
    """Paths of the libgomp copies mapped into this process (Linux; empty elsewhere)."""
    try:
        with open("/proc/self/maps") as f:
            return sorted({line.split()[-1] for line in f if "libgomp" in line})
    except OSError:
        return []


def _cpu_identity() -> str:
    # -march=native code may not run on another CPU sharing this cache folder (a shared home directory)
    try:
        with open("/proc/cpuinfo") as f:
            text = f.read()
        keep = [ln for ln in text.splitlines() if ln.startswith(("model name", "flags", "Features", "CPU part"))]
        return "\n".join(dict.fromkeys(keep))
    except OSError:
        return platform.processor() or platform.machine()


def compile_flags(openmp: bool, isa_flags: tuple[str, ...] | list[str] = ("-march=native",)) -> list[str]:
    """g++/clang++ flags for one instruction-set level (`isa_flags`: its -march and extensions); OpenMP threads only
    beside torch's libgomp."""
    return ["-O3", *isa_flags, "-std=c++17", "-shared", "-fPIC", "-fno-math-errno",
            "-Wno-psabi",
            "-fopenmp" if openmp else "-fopenmp-simd"]


def _compile_and_link(cxx: str, flags: list[str], sources: list[pathlib.Path], out: pathlib.Path) -> str | None:
    """Compile each source to an object file, at once on the CPU's cores (one g++ over all sources ran them one
    after another: ~11 s here, quant_gemv.cpp alone 3.4 s), then link them into `out`. None, or what failed (the
    command and the end of its stderr), appended to 'building the CPU kernels failed'."""
    from concurrent.futures import ThreadPoolExecutor

    cflags = [f for f in flags if f != "-shared"]  # objects first; -shared is the link's
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        objs = pathlib.Path(tempfile.mkdtemp(prefix=f"{out.name}.objs.", dir=out.parent))
    except OSError as e:
        return f": {e}"
    try:
        cmds = [[cxx, *cflags, "-c", str(src), "-o", str(objs / f"{src.stem}.o")] for src in sources]
        link = [cxx, *flags, *(c[-1] for c in cmds), "-o", str(out)]
        with ThreadPoolExecutor(max_workers=max(1, min(len(cmds), os.cpu_count() or 1))) as pool:
            runs = list(pool.map(lambda c: subprocess.run(c, capture_output=True, text=True, timeout=600), cmds))
        for cmd, r in zip(cmds, runs):
            if r.returncode != 0:
                return f" ({' '.join(cmd)}): {r.stderr.strip()[-1500:]}"
        r = subprocess.run(link, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            return f" ({' '.join(link)}): {r.stderr.strip()[-1500:]}"
        return None
    except (OSError, subprocess.SubprocessError) as e:
        return f": {e}"
    finally:
        shutil.rmtree(objs, ignore_errors=True)


def build_native(cxx: str | None, cache: pathlib.Path, openmp: bool | None = None,
                 isa: IsaChoice | str | None = None) -> NativeBuild:
    """Compile (unless cached) and load the kernels library for `isa` (a choice or a level name; None: the best this
    CPU runs); never raises: a failure is NativeBuild(None, why), a level this CPU lacks included."""
    if not isinstance(isa, IsaChoice):
        try:
            isa = choose_isa(read_cpu_flags(), isa)
        except ValueError as e:
            return NativeBuild(None, str(e))
    if cxx is None:
        return NativeBuild(None, "no C++ compiler found (install g++ or set CXX)", isa.name)
    openmp = torch_openmp_is_libgomp() if openmp is None else openmp
    flags = compile_flags(openmp, isa.flags)
    sources = sorted(CSRC.glob("*.cpp"))
    try:
        version = subprocess.run([cxx, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        return NativeBuild(None, f"C++ compiler {cxx!r} does not run: {e}", isa.name)
    key = hashlib.sha256()
    # -march=native code may not run on another CPU sharing the cache folder; an explicit level's code does
    cpu = _cpu_identity() if "-march=native" in flags else ""
    for part in [cxx, version, " ".join(flags), cpu, platform.machine()]:
        key.update(part.encode())
    for path in sources + sorted(CSRC.glob("*.h")):
        key.update(path.name.encode() + path.read_bytes())
    out = cache / f"libsglpy_cpu_{key.hexdigest()[:20]}.so"
    if not out.exists():
        tmp = out.with_name(f"{out.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        failure = _compile_and_link(cxx, flags, sources, tmp)
        if failure is not None:
            tmp.unlink(missing_ok=True)
            return NativeBuild(None, f"building the CPU kernels failed{failure}", isa.name)
        problem = self_test(tmp)
        if problem is not None:
            tmp.unlink(missing_ok=True)
            return NativeBuild(None, f"the built {isa.name} CPU kernels failed their self-test: {problem}", isa.name)
        os.replace(tmp, out)  # atomic: concurrent builders (engine processes, TP ranks) never see half a file
    try:
        lib = ctypes.CDLL(str(out))
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(lib, name)
            fn.restype, fn.argtypes = restype, argtypes
    except (OSError, AttributeError) as e:
        return NativeBuild(None, f"loading {out} failed: {e}", isa.name)
    threads = "OpenMP on torch's libgomp" if openmp else "single-threaded (torch does not run on libgomp)"
    acts = "int8" if lib.sglpy_gemv_int8_activations() else "float32"
    if acts == "int8" and lib.sglpy_gemv_int8_weight_act_max() < 127:
        acts += f" (7-bit, |q| <= {lib.sglpy_gemv_int8_weight_act_max()}, against int8 weights)"
    return NativeBuild(lib, f"{isa.name} ({isa.reason}: {' '.join(isa.flags)}; GEMV activations {acts}); "
                            f"{version.splitlines()[0] if version else cxx}; {threads}; {out}", isa.name)


# Runs in a fresh interpreter (no torch): loads the library and calls vectorized kernels on tiny inputs. A CPU that
# cannot execute what -march=native produced (a VM whose CPUID over-reports, say) dies there with SIGILL instead of
# in the engine; the library is then not installed and the references run.
_SELF_TEST = """
import ctypes, math, sys
lib = ctypes.CDLL(sys.argv[1])
n = 48
gu = (ctypes.c_float * (2 * n))(*[(i - n) / 7.0 for i in range(2 * n)])
out = (ctypes.c_float * n)()
lib.sglpy_silu_mul(gu, ctypes.c_int64(1), ctypes.c_int64(n), out, ctypes.c_int32(1))
for i in range(n):
    g, u = gu[i], gu[n + i]
    want = g / (1.0 + math.exp(-g)) * u
    assert abs(out[i] - want) <= 1e-5 * (1.0 + abs(want)), (i, out[i], want)
k, rows = 64, 3
x = (ctypes.c_float * k)(*[math.sin(i) for i in range(k)])
q = (ctypes.c_int8 * (rows * k))(*[((i * 37) % 255) - 127 for i in range(rows * k)])
scale = (ctypes.c_float * rows)(0.5, 0.25, 2.0)
y = (ctypes.c_float * rows)()
lib.sglpy_gemv_int8(x, ctypes.c_int64(1), ctypes.c_int64(k), q, scale, None, y, ctypes.c_int64(rows),
                    ctypes.c_int32(1))
qmax = lib.sglpy_gemv_int8_weight_act_max()
for r in range(rows):  # int8 activations (q8_dot.h) err by at most sum |w| * (max |x| / qmax) / 2 (|x| <= 1 here)
    want = sum(q[r * k + i] * x[i] for i in range(k)) * scale[r]
    bound = sum(abs(q[r * k + i]) for i in range(k)) * scale[r] / (2.0 * qmax)
    assert abs(y[r] - want) <= bound + 1e-4 * (1.0 + abs(want)), (r, y[r], want)
"""


def self_test(path: pathlib.Path) -> str | None:
    """None when a fresh interpreter can load the library at `path` and run kernels on it, else what went wrong."""
    try:
        r = subprocess.run([sys.executable, "-c", _SELF_TEST, str(path)], capture_output=True, text=True, timeout=120)
    except (OSError, subprocess.SubprocessError) as e:
        return f"could not run it: {e}"
    if r.returncode == 0:
        return None
    how = f"killed by signal {-r.returncode}" if r.returncode < 0 else f"exit code {r.returncode}"
    return f"{how}: {r.stderr.strip()[-800:]}"


_lock = threading.Lock()


def forced_isa() -> str | None:
    """The level SGLPY_CPU_ISA asks for, or None (unset or empty: the best this CPU runs)."""
    return os.environ.get(ISA_ENV, "").strip().lower() or None


def _default_build() -> NativeBuild:
    return _build_for(forced_isa())


@functools.lru_cache(maxsize=None)
def _build_for(forced: str | None) -> NativeBuild:
    isa = choose_isa(read_cpu_flags(), forced)  # ValueError: a level this CPU lacks is refused, not run slower
    with _lock:
        build = build_native(find_compiler(), cache_dir(), isa=isa)
    if build.lib is None:
        warnings.warn(f"sglpy.kernels: native CPU kernels unavailable, using torch references: {build.detail}",
                      stacklevel=3)
    else:
        logger.info("native CPU kernels: %s", build.detail)
    return build


def native_lib() -> ctypes.CDLL | None:
    """The loaded kernels library, or None (SGLPY_DISABLE_CPU_KERNELS=1, no compiler, or a failed build).
    Raises ValueError when SGLPY_CPU_ISA names a level this CPU cannot run (or none at all)."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    return _default_build().lib


def native_isa() -> str | None:
    """The instruction-set level of the loaded kernels (avx512, avx2, baseline, neon), None when none are loaded."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return None
    build = _default_build()
    return build.isa if build.lib is not None else None


def native_status() -> str:
    """One line for get_server_info: 'native: <level (why: flags)>; <compiler>; <threads>; <file>' or
    'torch reference: <why>'. Raises ValueError for an SGLPY_CPU_ISA this CPU cannot run."""
    if os.environ.get(DISABLE_ENV, "") not in ("", "0"):
        return f"torch reference: {DISABLE_ENV} is set"
    build = _default_build()
    return f"native: {build.detail}" if build.lib is not None else f"torch reference: {build.detail}"

"""Every Triton kernel compiles for sm_80 and sm_90 without a GPU (catches what the interpreter lets through)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("triton")

ARCHS = ("80", "90")
# Shared memory per block that every targeted card grants (sm_86/sm_89 allow 99 KiB; sm_80/sm_90 more).
SHARED_LIMIT = 99 * 1024

from sglpy.runtime.testing.kernel_compile import cases  # noqa: E402


@pytest.fixture(scope="module")
def compiled() -> dict:
    # TRITON_INTERPRET makes @triton.jit return interpreter objects, which cannot be compiled: use a clean child.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-m", "sglpy.runtime.testing.kernel_compile", *ARCHS],
                          capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(cases()))
def test_kernel_compiles_to_cubin(compiled, case, arch):
    got = compiled[case][arch]
    assert isinstance(got, dict), f"{case} failed for sm_{arch}:\n{got}"
    assert got["stages"][-1] == "cubin", got["stages"]
    assert got["shared_bytes"] <= SHARED_LIMIT, f"{case} needs {got['shared_bytes']} B of shared memory"


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize("case", sorted(c for c in cases() if c.startswith(("decode_split", "extend"))))
def test_attention_kv_loads_are_pipelined(compiled, case, arch):
    # Decode attention is bandwidth-bound: its K/V tile loads must become 16-byte cp.async copies, not
    # per-element loads (a runtime-masked head_dim without divisibility once compiled to 144 ld.global.b16).
    got = compiled[case][arch]
    assert isinstance(got, dict), got
    assert got["cp_async"] > 0, got
    assert got["scalar_b16_loads"] == 0, got

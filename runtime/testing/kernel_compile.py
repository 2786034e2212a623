"""Compile every Triton kernel for real GPU targets without a GPU; run as a script with TRITON_INTERPRET unset.

Usage: python -m sglpy.runtime.testing.kernel_compile 80 90  -> prints one JSON object {case: {arch: stages | error}}.
Under TRITON_INTERPRET=1 @triton.jit yields interpreter objects that cannot be compiled, hence a subprocess.
"""

from __future__ import annotations

import json
import re
import sys
import traceback

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sglpy.kernels import (
    bitmask_triton,
    decode_attention_triton,
    extend_attention_triton,
    kv_store_triton,
    rmsnorm_triton,
    rotary_triton,
)

TY = {"fp32": "*fp32", "fp16": "*fp16", "bf16": "*bf16"}
ELEM_BYTES = {"fp32": 4, "fp16": 2, "bf16": 2}
# Size arguments that are multiples of 16 for real models (head_dim 64/128, hidden 576..8192, vocab 49152...).
SIZE_ARGS = ("head_dim", "hidden", "HALF", "vocab")


def _sig(names: list[str], types: dict[str, str], constexprs: dict[str, object]) -> dict[str, str]:
    """Every argument is i32 unless typed; constexprs are marked as such."""
    return {n: "constexpr" if n in constexprs else types.get(n, "i32") for n in names}


def cases() -> dict[str, tuple]:
    """name -> (jit kernel, types of non-i32 args, constexprs): the variants the launchers produce."""
    out: dict[str, tuple] = {}
    for dt in ("fp32", "bf16", "fp16"):
        p = TY[dt]
        prec = "ieee" if dt == "fp32" else "tf32"
        out[f"store_kv-{dt}"] = (kv_store_triton._store_kv_kernel,
                                 {"KCache": p, "VCache": p, "Loc": "*i64", "K": p, "V": p},
                                 {"BLOCK_H": 4, "BLOCK_D": 64})
        # fp16 shares bf16's code paths except the MMA operand type, so only the attention kernels repeat it.
        shapes = ((64, 3),) if dt == "fp16" else ((64, 3), (128, 8))
        for head_dim, group in shapes:
            out[f"decode_split-{dt}-d{head_dim}-g{group}"] = (
                decode_attention_triton._decode_split_kernel,
                {"Q": p, "KCache": p, "VCache": p, "ReqToToken": "*i32", "ReqPool": "*i64", "SeqLens": "*i64",
                 "MidO": "*fp32", "MidLse": "*fp32", "sm_scale_log2": "fp32"},
                {"BLOCK_H": max(16, triton.next_power_of_2(group)), "BLOCK_N": 64, "BLOCK_D": head_dim,
                 "DOT_PRECISION": prec},
            )
            out[f"extend-{dt}-d{head_dim}"] = (
                extend_attention_triton._extend_kernel,
                {"Q": p, "KCache": p, "VCache": p, "O": p, "ReqToToken": "*i32", "ReqPool": "*i64",
                 "PrefixLens": "*i64", "ExtendLens": "*i64", "QStart": "*i64", "sm_scale_log2": "fp32"},
                {"BLOCK_M": (blk := extend_attention_triton.default_block(head_dim, ELEM_BYTES[dt])),
                 "BLOCK_N": blk, "BLOCK_D": head_dim, "DOT_PRECISION": prec},
            )
        if dt == "fp16":
            continue
        out[f"decode_merge-{dt}"] = (decode_attention_triton._decode_merge_kernel,
                                     {"MidO": "*fp32", "MidLse": "*fp32", "O": p, "SeqLens": "*i64"},
                                     {"BLOCK_N": 64, "BLOCK_D": 64})
        for has_res in (False, True):
            out[f"rmsnorm-{dt}-res{int(has_res)}"] = (
                rmsnorm_triton._rmsnorm_kernel,
                {"X": p, "Res": p, "W": p, "Out": p, "ResOut": p, "eps": "fp32"},
                {"HAS_RESIDUAL": has_res, "BLOCK": 1024},
            )
        out[f"rotary-{dt}"] = (rotary_triton._rotary_kernel,
                               {"Q": p, "K": p, "Positions": "*i64", "CosSin": "*fp32"},
                               {"BLOCK_HQ": 16, "BLOCK_HK": 4, "BLOCK_HALF": 32})
        for has_idx in (False, True):
            out[f"bitmask-{dt}-idx{int(has_idx)}"] = (
                bitmask_triton._bitmask_kernel,
                {"Logits": p, "Bitmask": "*i32", "Indices": "*i64"},
                {"HAS_INDICES": has_idx, "BLOCK": 1024},
            )
    return out


def compile_case(kernel, types: dict[str, str], constexprs: dict[str, object], arch: int) -> dict:
    """Compile to the last stage the toolchain reaches (cubin with the bundled ptxas); stages + shared memory."""
    sig = _sig(kernel.arg_names, types, constexprs)
    # A launch specialises pointers (16-byte aligned) and ints that are multiples of 16 (strides and sizes of
    # real models); compile that same variant, the one whose loads can be vectorised and pipelined.
    aligned = [n for n in kernel.arg_names
               if sig[n].startswith("*") or (sig[n] == "i32" and (n.startswith("stride") or n in SIZE_ARGS))]
    attrs = {(kernel.arg_names.index(n),): [["tt.divisibility", 16]] for n in aligned}
    compiled = triton.compile(ASTSource(kernel, sig, constexprs, attrs), target=GPUTarget("cuda", arch, 32))
    stages = [stage for stage in ("ttir", "ttgir", "llir", "ptx", "cubin") if compiled.asm.get(stage)]
    ptx = compiled.asm.get("ptx", "")
    return {"stages": stages, "shared_bytes": int(compiled.metadata.shared),
            "cp_async": len(re.findall(r"\bcp\.async\.c[ag]\.shared\.global", ptx)),
            "scalar_b16_loads": len(re.findall(r"\bld\.global(?:\.\w+)*\.b16\b", ptx))}


def main(archs: list[int]) -> dict:
    result: dict[str, dict[str, object]] = {}
    for name, (kernel, types, constexprs) in cases().items():
        result[name] = {}
        for arch in archs:
            try:
                result[name][str(arch)] = compile_case(kernel, types, constexprs, arch)
            except Exception:  # reported per case so one failure does not hide the others
                result[name][str(arch)] = "ERROR: " + traceback.format_exc(limit=3)[-2000:]
    return result


if __name__ == "__main__":
    print(json.dumps(main([int(a) for a in sys.argv[1:]])))

"""Triton kernels and native CPU kernels, each beside a pure-torch reference (the test oracle).

Importing this package never imports triton (the `*_triton` modules load lazily, only for CUDA tensors) and never
builds the native CPU kernels (kernels/cpu_native.py builds them on first use).
"""

from .bitmask import apply_token_bitmask, apply_token_bitmask_reference
from .decode_attention import decode_attention, decode_attention_reference
from .extend_attention import extend_attention, extend_attention_reference
from .fused_moe import fused_moe, fused_moe_reference
from .kv_store import store_kv, store_kv_reference
from .rmsnorm import RMSNormResult, rmsnorm, rmsnorm_reference
from .rotary import apply_rotary, apply_rotary_reference, build_rope_cache

__all__ = [
    "RMSNormResult",
    "apply_rotary",
    "apply_rotary_reference",
    "apply_token_bitmask",
    "apply_token_bitmask_reference",
    "build_rope_cache",
    "decode_attention",
    "decode_attention_reference",
    "extend_attention",
    "extend_attention_reference",
    "fused_moe",
    "fused_moe_reference",
    "rmsnorm",
    "rmsnorm_reference",
    "store_kv",
    "store_kv_reference",
]

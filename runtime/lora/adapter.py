"""A LoRA adapter in PEFT's format (adapter_config.json + adapter_model.safetensors), read and checked against the
base model: per layer and target module its A [r, in] and scaled B [out, r] (scaling folded in), or a ValueError
naming what it cannot honour (DoRA, modules_to_save, biases, other PEFT types, embeddings or lm_head as targets, a
layer count or shape that does not fit the base)."""

from __future__ import annotations

import itertools
import json
import math
import pathlib
import re
from dataclasses import dataclass, field

import torch

from .spec import LORA_MODULES

_KEY = re.compile(r"^(?:base_model\.model\.)?model\.layers\.(\d+)\.(?:self_attn|mlp)\.(\w+)\.lora_([AB])"
                  r"(?:\.[\w-]+)?\.weight$")
_uid = itertools.count(1)


@dataclass(frozen=True)
class BaseShapes:
    """What an adapter must fit: the base model's layer count and each target module's (in, out) features."""

    num_layers: int
    modules: dict[str, tuple[int, int]]  # module name -> (in_features, out_features)


@dataclass(frozen=True, eq=False)
class LoraAdapter:
    """A loaded adapter. uid is unique per load (a reloaded name is a new adapter: no cache or pool slot carries
    over). weights[(layer, module)] = (A [r, in], B * scaling [out, r]), float32 on the CPU."""

    name: str
    path: str
    rank: int  # the largest rank of its modules (the pool slot's rank)
    alpha: float
    use_rslora: bool
    target_modules: frozenset[str]
    weights: dict[tuple[int, str], tuple[torch.Tensor, torch.Tensor]] = field(repr=False)
    uid: int = field(default_factory=lambda: next(_uid))

    @property
    def nbytes(self) -> int:
        """Host bytes of its weights."""
        return sum(a.numel() * a.element_size() + b.numel() * b.element_size() for a, b in self.weights.values())

    def describe(self) -> dict:
        """The JSON view (/v1/models, the load reply)."""
        return {"name": self.name, "path": self.path, "rank": self.rank, "alpha": self.alpha,
                "use_rslora": self.use_rslora, "target_modules": sorted(self.target_modules)}


def _pattern_value(patterns: dict, module_key: str, default):
    """PEFT's rank_pattern / alpha_pattern lookup: the first key matching the end of the module's name."""
    for key, value in (patterns or {}).items():
        if re.match(rf"(.*\.)?({key})$", module_key):
            return value
    return default


def read_config(folder: pathlib.Path) -> dict:
    """adapter_config.json, with every setting we cannot honour refused by name."""
    cfg_file = folder / "adapter_config.json"
    if not cfg_file.is_file():
        raise ValueError(f"LoRA adapter {folder}: no adapter_config.json (PEFT's format: adapter_config.json + "
                         f"adapter_model.safetensors)")
    try:
        cfg = json.loads(cfg_file.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ValueError(f"LoRA adapter {folder}: adapter_config.json is not valid JSON ({e})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"LoRA adapter {folder}: adapter_config.json must hold a JSON object")
    kind = cfg.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise ValueError(f"LoRA adapter {folder}: peft_type {kind!r} is not supported (only LORA)")
    if cfg.get("use_dora"):
        raise ValueError(f"LoRA adapter {folder}: DoRA (use_dora) is not supported")
    if cfg.get("modules_to_save"):
        raise ValueError(f"LoRA adapter {folder}: modules_to_save {cfg['modules_to_save']} is not supported (fully "
                         f"trained copies of base modules, e.g. the embeddings)")
    if cfg.get("bias", "none") != "none" or cfg.get("lora_bias"):
        raise ValueError(f"LoRA adapter {folder}: trained biases (bias={cfg.get('bias')!r}, lora_bias="
                         f"{cfg.get('lora_bias')!r}) are not supported")
    if cfg.get("fan_in_fan_out"):
        raise ValueError(f"LoRA adapter {folder}: fan_in_fan_out (GPT-2 Conv1D layers) is not supported")
    r = cfg.get("r")
    if isinstance(r, bool) or not isinstance(r, int) or r < 1:
        raise ValueError(f"LoRA adapter {folder}: r must be a positive int, got {r!r}")
    return cfg


def load_adapter(name: str, path: str, base: BaseShapes) -> LoraAdapter:
    """Read and check the adapter at `path` (a folder) for the base model described by `base`."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = pathlib.Path(path).expanduser()
    if not folder.is_dir():
        raise ValueError(f"LoRA adapter {name!r}: {path} is not a folder (no model hub is used: give a local path)")
    cfg = read_config(folder)
    weights_file = folder / "adapter_model.safetensors"
    if not weights_file.is_file():
        other = " (adapter_model.bin is not read: pickled weights; save with safe_serialization)" \
            if (folder / "adapter_model.bin").exists() else ""
        raise ValueError(f"LoRA adapter {folder}: no adapter_model.safetensors{other}")
    try:
        state = load_file(str(weights_file))
    except (SafetensorError, OSError) as e:
        raise ValueError(f"LoRA adapter {folder}: adapter_model.safetensors cannot be read ({e})") from None
    parts: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"LoRA adapter {folder}: tensor {key!r} is not supported (LoRA A/B of the decoder "
                             f"layers' {', '.join(LORA_MODULES)} only; embeddings, lm_head and DoRA magnitudes are not)")
        layer, module, ab = int(m.group(1)), m.group(2), m.group(3)
        if module not in LORA_MODULES:
            raise ValueError(f"LoRA adapter {folder}: target module {module!r} is not supported "
                             f"(supported: {', '.join(LORA_MODULES)})")
        if module not in base.modules:
            raise ValueError(f"LoRA adapter {folder}: the base model has no {module!r} to adapt (a mixture-of-experts "
                             f"MLP takes no LoRA)")
        if layer >= base.num_layers:
            raise ValueError(f"LoRA adapter {folder} does not fit the base model: it adapts layer {layer}, the base "
                             f"has {base.num_layers} layers")
        parts.setdefault((layer, module), {})[ab] = t
    if not parts:
        raise ValueError(f"LoRA adapter {folder}: adapter_model.safetensors holds no LoRA weights")
    alpha = cfg.get("lora_alpha", 8)
    rslora = bool(cfg.get("use_rslora", False))
    weights = {}
    for (layer, module), ab in sorted(parts.items()):
        where = f"layer {layer} {module}"
        if set(ab) != {"A", "B"}:
            raise ValueError(f"LoRA adapter {folder}: {where} has lora_{''.join(ab)} without its pair")
        a, b = ab["A"].to(torch.float32), ab["B"].to(torch.float32)
        n_in, n_out = base.modules[module]
        if a.dim() != 2 or b.dim() != 2 or a.shape[1] != n_in or b.shape[0] != n_out or a.shape[0] != b.shape[1]:
            raise ValueError(f"LoRA adapter {folder} does not fit the base model: {where} has A {tuple(a.shape)} and "
                             f"B {tuple(b.shape)}, the base needs A [r, {n_in}] and B [{n_out}, r]")
        full_key = f"model.layers.{layer}.{module}"
        r = a.shape[0]
        rank_cfg = _pattern_value(cfg.get("rank_pattern"), full_key, cfg["r"])
        if r != rank_cfg:
            raise ValueError(f"LoRA adapter {folder}: {where} has rank {r}, its config says {rank_cfg}")
        a_m = _pattern_value(cfg.get("alpha_pattern"), full_key, alpha)
        scaling = a_m / (math.sqrt(r) if rslora else r)
        weights[(layer, module)] = (a.contiguous(), (b * scaling).contiguous())
    return LoraAdapter(name=name, path=str(folder), rank=max(a.shape[0] for a, _ in weights.values()),
                       alpha=float(alpha), use_rslora=rslora, target_modules=frozenset(m for _, m in weights),
                       weights=weights)

"""Test helpers: random-weight LoRA adapters in PEFT's format for a model folder (made by PEFT itself), and the HF
transformers + PEFT reference those tests compare against."""

from __future__ import annotations

import json
import os
import pathlib


def make_peft_adapter(base: str | os.PathLike, path: str | os.PathLike, rank: int = 8, alpha: float = 16.0,
                      targets: tuple[str, ...] = ("q_proj", "v_proj"), seed: int = 0, use_rslora: bool = False,
                      scale: float = 0.1, config_extra: dict | None = None) -> str:
    """Write a PEFT LoRA adapter of `base` with random A and B (PEFT starts B at zero: an adapter that does nothing
    would test nothing); config_extra edits adapter_config.json afterwards (refusal tests)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    path = pathlib.Path(path)
    if (path / "adapter_config.json").exists():
        return str(path)
    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    cfg = LoraConfig(r=rank, lora_alpha=alpha, target_modules=list(targets), lora_dropout=0.05, bias="none",
                     use_rslora=use_rslora, task_type="CAUSAL_LM")
    peft_model = get_peft_model(model, cfg)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)
    tmp = path.with_name(path.name + ".tmp")
    peft_model.save_pretrained(str(tmp), safe_serialization=True)
    if config_extra:
        f = tmp / "adapter_config.json"
        f.write_text(json.dumps({**json.loads(f.read_text()), **config_extra}))
    tmp.rename(path)
    return str(path)


def peft_reference(base: str | os.PathLike, adapter: str | os.PathLike | None):
    """HF transformers' model of `base` in float32, with the PEFT adapter applied (None: the base alone), in eval."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(base), torch_dtype=torch.float32)
    if adapter is not None:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, str(adapter))
    return model.eval()


def write_random_adapter(path: str | os.PathLike, num_layers: int, modules: dict[str, tuple[int, int]], rank: int,
                         alpha: float | None = None, targets: tuple[str, ...] | None = None, seed: int = 0,
                         scale: float = 0.02) -> str:
    """Write a random PEFT-format adapter without loading the base (benchmarks at real sizes): `modules` maps each
    HF module name to its (in, out) features (runtime/lora/pool.base_shapes gives them for a loaded model)."""
    import torch
    from safetensors.torch import save_file

    path = pathlib.Path(path)
    targets = tuple(targets or modules)
    g = torch.Generator().manual_seed(seed)
    state = {}
    for i in range(num_layers):
        for m in targets:
            part = "self_attn" if m in ("q_proj", "k_proj", "v_proj", "o_proj") else "mlp"
            n_in, n_out = modules[m]
            key = f"base_model.model.model.layers.{i}.{part}.{m}"
            state[f"{key}.lora_A.weight"] = torch.randn(rank, n_in, generator=g) * n_in ** -0.5
            state[f"{key}.lora_B.weight"] = torch.randn(n_out, rank, generator=g) * scale
    path.mkdir(parents=True, exist_ok=True)
    save_file(state, str(path / "adapter_model.safetensors"))
    cfg = {"peft_type": "LORA", "r": rank, "lora_alpha": alpha if alpha is not None else 2 * rank,
           "target_modules": list(targets), "lora_dropout": 0.0, "bias": "none", "task_type": "CAUSAL_LM"}
    (path / "adapter_config.json").write_text(json.dumps(cfg))
    return str(path)


def module_shapes(model_path: str | os.PathLike) -> tuple[int, dict[str, tuple[int, int]]]:
    """(layers, HF module name -> (in, out) features) of a Llama-family model folder, from its config alone."""
    from transformers import AutoConfig

    c = AutoConfig.from_pretrained(str(model_path))
    h, inter = c.hidden_size, c.intermediate_size
    hd = getattr(c, "head_dim", None) or h // c.num_attention_heads
    q, kv = c.num_attention_heads * hd, (getattr(c, "num_key_value_heads", None) or c.num_attention_heads) * hd
    return c.num_hidden_layers, {"q_proj": (h, q), "k_proj": (h, kv), "v_proj": (h, kv), "o_proj": (q, h),
                                 "gate_proj": (h, inter), "up_proj": (h, inter), "down_proj": (inter, h)}

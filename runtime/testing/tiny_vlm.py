"""Test helpers: tiny random-weight vision-language folders (LLaVA with a CLIP or SigLIP tower, Qwen2-VL) built from
a config in code, with the default model's tokenizer plus the image tokens and each model's image processor config."""

from __future__ import annotations

import os
import pathlib
import shutil

from .tiny_model import TOKENIZER_FILES, tokenizer_source

# the image tokens get ids 49152.. after the default tokenizer's 49152; the vocabulary is padded to 49160
IMAGE_TOKENS = ["<image>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>", "<|video_pad|>"]
VOCAB = 49160
TEXT = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, max_position_embeddings=4096, rms_norm_eps=1e-6, bos_token_id=1,
            eos_token_id=2, pad_token_id=2)

# a 400M-class tower (CLIP ViT-L/14-336's shape: 24 layers, 1024 wide, 16 heads, 576 patches) for the benchmark
VIT_L_336 = dict(hidden_size=1024, intermediate_size=4096, num_hidden_layers=24, num_attention_heads=16,
                 image_size=336, patch_size=14)
TINY_VIT = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=3, num_attention_heads=2, image_size=56,
                patch_size=14)


def _write(model, path: pathlib.Path, processor, seed_std: float) -> str:
    import torch
    from transformers import AutoTokenizer

    with torch.no_grad():  # larger-than-default weights so greedy ids are not decided by near-ties
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, min(seed_std, p.shape[-1] ** -0.5))
            elif "norm" in name and name.endswith("weight"):
                p.normal_(1.0, 0.1)
            else:
                p.normal_(0.0, 0.05)
    tmp = path.with_name(path.name + ".tmp")
    if tmp.exists():
        shutil.rmtree(tmp)
    model.save_pretrained(tmp, safe_serialization=True)
    processor.save_pretrained(tmp)
    tok = AutoTokenizer.from_pretrained(tokenizer_source())
    tok.add_special_tokens({"additional_special_tokens": IMAGE_TOKENS})
    tok.save_pretrained(tmp)
    for name in TOKENIZER_FILES:
        src = pathlib.Path(tokenizer_source()) / name
        if name == "chat_template.jinja" and src.exists() and not (tmp / name).exists():
            shutil.copy(src, tmp / name)
    tmp.rename(path)
    return str(path)


def make_tiny_llava(path: str | os.PathLike, seed: int = 0, tower: str = "clip", vision: dict | None = None,
                    text: dict | None = None) -> str:
    """A LLaVA folder: a CLIP (vision_feature_layer -2, class token dropped) or SigLIP (all patches) tower, the
    2-layer GELU projector, a Llama decoder; the image processor resizes to the tower's image_size."""
    import torch
    from transformers import CLIPVisionConfig, LlamaConfig, LlavaConfig, LlavaForConditionalGeneration, SiglipVisionConfig
    from transformers.models.clip.image_processing_pil_clip import CLIPImageProcessorPil
    from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil

    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    v = {**TINY_VIT, **(vision or {})}
    if tower == "clip":
        vc = CLIPVisionConfig(**v)
        proc = CLIPImageProcessorPil(size={"shortest_edge": v["image_size"]},
                                     crop_size={"height": v["image_size"], "width": v["image_size"]})
        extra = dict(vision_feature_layer=-2, vision_feature_select_strategy="default")
    elif tower == "siglip":
        vc = SiglipVisionConfig(**v)
        proc = SiglipImageProcessorPil(size={"height": v["image_size"], "width": v["image_size"]})
        extra = dict(vision_feature_layer=-1, vision_feature_select_strategy="full")
    else:
        raise ValueError(f"tower must be clip or siglip, got {tower!r}")
    config = LlavaConfig(vision_config=vc, text_config=LlamaConfig(**{**TEXT, **(text or {})}),
                         image_token_id=VOCAB - 8, tie_word_embeddings=False, **extra)
    config.architectures = ["LlavaForConditionalGeneration"]
    torch.manual_seed(seed)
    return _write(LlavaForConditionalGeneration(config).float(), path, proc, 0.08)


def make_tiny_qwen2_vl(path: str | os.PathLike, seed: int = 0, v25: bool = False) -> str:
    """A Qwen2-VL folder: 14-pixel patches merged 2x2, M-RoPE sections (2, 3, 3) of a 16-wide head; images resized
    to between 4 and 64 merged tokens. v25: Qwen2.5-VL (windows of 2x2 merged tokens, full attention in block 1)."""
    import torch
    from transformers import (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration, Qwen2VLConfig,
                              Qwen2VLForConditionalGeneration)
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    path = pathlib.Path(path)
    if (path / "config.json").exists():
        return str(path)
    ids = {t: VOCAB - 8 + i for i, t in enumerate(IMAGE_TOKENS)}
    text = {**TEXT, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]}}
    vision = dict(depth=2, embed_dim=32, hidden_size=64, num_heads=2, mlp_ratio=2, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2)
    if v25:
        vision = dict(depth=3, hidden_size=32, out_hidden_size=64, intermediate_size=48, num_heads=2, patch_size=14,
                      spatial_merge_size=2, temporal_patch_size=2, window_size=56, fullatt_block_indexes=[1])
    cfg_cls, model_cls = (Qwen2_5_VLConfig, Qwen2_5_VLForConditionalGeneration) if v25 else \
        (Qwen2VLConfig, Qwen2VLForConditionalGeneration)
    config = cfg_cls(text_config=text, vision_config=vision,
                           image_token_id=ids["<|image_pad|>"], video_token_id=ids["<|video_pad|>"],
                           vision_start_token_id=ids["<|vision_start|>"], vision_end_token_id=ids["<|vision_end|>"],
                           tie_word_embeddings=False)
    config.architectures = [model_cls.__name__]
    proc = Qwen2VLImageProcessorPil(size={"shortest_edge": 4 * 28 * 28, "longest_edge": 64 * 28 * 28},
                                    patch_size=14, merge_size=2, temporal_patch_size=2)
    torch.manual_seed(seed)
    return _write(model_cls(config).float(), path, proc, 0.08)

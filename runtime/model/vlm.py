"""Vision-language models: the runtime's text decoder (Llama family for LLaVA, the family decoder with M-RoPE for
Qwen2-VL) with a vision encoder in the same process and device. Image tokens are embedded from the encoder's output
(runtime/model/mm_batch.py places them), every other token from the vocabulary."""

from __future__ import annotations

import copy

import torch
from torch import nn

from .decoder import FamilyForCausalLM, FamilyModel
from .families import VISION_ARCHITECTURES, Family
from .forward_batch import ForwardBatch
from .llama import LlamaForCausalLM
from .mrope import mrope_rows, mrope_sections
from .rope import RopeRows, gather_rows
from .vision_qwen2 import Qwen25VisionEncoder, Qwen2VisionEncoder
from .vision_vit import LlavaEncoder



def is_vision_config(config) -> bool:
    """True when the config names a vision-language architecture we run."""
    return bool(getattr(config, "architectures", None)) and config.architectures[0] in VISION_ARCHITECTURES


def text_config_of(config):
    """The decoder's config: text_config, with the model's tied-embedding setting (kept at the top level)."""
    text = copy.deepcopy(config.text_config)
    tie = getattr(config, "tie_word_embeddings", None)
    if tie is not None:
        text.tie_word_embeddings = bool(tie)
    text.architectures = None  # the Llama-family decoder; the vision parts are this module's
    return text


class VisionEmbedding:
    """Mixin: embeds image tokens from the encoder output a forward's MultimodalBatch carries."""

    vision: nn.Module

    def embed(self, fb: ForwardBatch) -> torch.Tensor:
        emb = self.model.embed_tokens
        x = emb(fb.input_ids.clamp(0, emb.num_embeddings - 1))  # image ids lie past the vocabulary: overwritten
        mm = fb.mm
        if mm is not None and mm.rows.numel():
            x[mm.rows] = mm.embeds.to(x.dtype)  # [k] rows <- [k, hidden]
        return x

    def encoder_dtype(self) -> torch.dtype:
        return next(self.vision.parameters()).dtype


class LlavaForConditionalGeneration(VisionEmbedding, LlamaForCausalLM):
    """LLaVA: CLIP/SigLIP tower + projector before a Llama-family decoder."""

    mrope = False

    def __init__(self, config, shard=None, batch_invariant: bool = False, row_split=None):
        super().__init__(text_config_of(config), shard, batch_invariant, row_split)
        self.vision = LlavaEncoder(config)
        self.tokens_per_image = self.vision.tokens_per_image

    @torch.inference_mode()
    def encode(self, images: list) -> list[torch.Tensor]:
        """Each ImageItem's token embeddings [tokens, hidden]."""
        dev = self.model.embed_tokens.weight.device
        pixels = torch.stack([torch.from_numpy(im.pixels) for im in images]).to(dev, self.encoder_dtype())
        return list(self.vision(pixels))  # pixels: [images, 3, H, W]


class Qwen2VLForConditionalGeneration(VisionEmbedding, FamilyForCausalLM):
    """Qwen2-VL and Qwen2.5-VL: dynamic-resolution vision encoder before a Qwen2 decoder rotated by multimodal
    positions."""

    mrope = True
    tokens_per_image = None  # dynamic: from each image's grid

    def __init__(self, config, shard=None, batch_invariant: bool = False, row_split=None):
        super().__init__(text_config_of(config), shard, batch_invariant, row_split)
        v25 = config.architectures[0] == "Qwen2_5_VLForConditionalGeneration"  # windowed encoder, same decoder
        self.vision = (Qwen25VisionEncoder if v25 else Qwen2VisionEncoder)(config.vision_config)
        params = getattr(self.config, "rope_parameters", None) or getattr(self.config, "rope_scaling", None) or {}
        self.mrope_section = list(params.get("mrope_section", [16, 24, 24]))
        mrope_sections(self.mrope_section, self.head_dim // 2)  # checked here; built on the device by init_rope
        self.sections: torch.Tensor | None = None

    def init_rope(self, max_pos: int, device, dtype) -> None:
        super().init_rope(max_pos, device, dtype)
        self.sections = mrope_sections(self.mrope_section, self.head_dim // 2).to(device)

    def build_decoder(self, config, shard) -> nn.Module:
        self.family = Family("qwen2_vl")
        self.final_softcap = None
        self.rope_tables = {}
        return FamilyModel(config, self.family, shard, self.batch_invariant)

    def rope_rows(self, fb: ForwardBatch) -> dict[str | None, RopeRows]:
        table = self.rope_tables[None]
        if fb.mm is None or fb.mm.mrope is None:
            return {None: gather_rows(table, fb.positions)}
        return {None: mrope_rows(table.cache, fb.mm.mrope, self.sections)}

    @torch.inference_mode()
    def encode(self, images: list) -> list[torch.Tensor]:
        dev = self.model.embed_tokens.weight.device
        patches = torch.cat([torch.from_numpy(im.pixels) for im in images]).to(dev, self.encoder_dtype())
        out = self.vision(patches, [im.grid for im in images])  # [sum of tokens, hidden]
        return list(out.split([im.num_tokens for im in images]))


def build_vlm(config, shard=None, batch_invariant: bool = False, row_split=None) -> LlamaForCausalLM:
    """Our model for a vision-language config (tensor parallelism is refused by the loader)."""
    cls = {"LlavaForConditionalGeneration": LlavaForConditionalGeneration,
           "Qwen2VLForConditionalGeneration": Qwen2VLForConditionalGeneration,
           "Qwen2_5_VLForConditionalGeneration": Qwen2VLForConditionalGeneration}[config.architectures[0]]
    return cls(config, shard, batch_invariant, row_split)


_PREFIXES = (  # checkpoint names (hub layout and transformers 5's in-memory layout) -> ours
    ("language_model.model.", "model."), ("language_model.lm_head.", "lm_head."),
    ("model.language_model.", "model."),
    ("vision_tower.vision_model.", "vision.vision_tower."), ("model.vision_tower.vision_model.", "vision.vision_tower."),
    ("vision_tower.", "vision.vision_tower."), ("model.vision_tower.", "vision.vision_tower."),
    ("multi_modal_projector.", "vision.multi_modal_projector."),
    ("model.multi_modal_projector.", "vision.multi_modal_projector."),
    ("model.visual.", "vision."), ("visual.", "vision."),
)


def remap_vision_checkpoint(model: nn.Module, state: dict) -> dict:
    """Rename a VLM checkpoint's tensors onto our modules; drop what our model never reads (the vision tower's
    layers past the selected feature layer, its pooling head and final norm)."""
    wanted = set(model.state_dict().keys())
    out = {}
    for k, v in state.items():
        for old, new in _PREFIXES:
            if k.startswith(old):
                k = new + k[len(old):]
                break
        if k.startswith("vision.") and k not in wanted:
            continue
        out[k] = v
    return out

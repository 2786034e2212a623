"""The LLaVA-style vision tower: a CLIP or SigLIP vision transformer (HF's vision_config) and the LLaVA projector
that maps its patch features into the text decoder's embedding space."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

ACTIVATIONS = {
    "quick_gelu": lambda x: x * torch.sigmoid(1.702 * x),
    "gelu": F.gelu,
    "gelu_pytorch_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
}


def activation(name: str):
    """The activation function a config names; ValueError names an unknown one."""
    if name not in ACTIVATIONS:
        raise ValueError(f"unsupported vision activation {name!r}; supported: {sorted(ACTIVATIONS)}")
    return ACTIVATIONS[name]


class ViTAttention(nn.Module):
    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads, self.head_dim = heads, dim // heads
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(dim, dim), nn.Linear(dim, dim), nn.Linear(dim, dim)
        self.out_proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape  # x: [images, patches, dim]
        q, k, v = (p(x).view(b, n, self.heads, self.head_dim).transpose(1, 2)
                   for p in (self.q_proj, self.k_proj, self.v_proj))
        o = F.scaled_dot_product_attention(q, k, v)  # bidirectional within each image
        return self.out_proj(o.transpose(1, 2).reshape(b, n, d))


class ViTLayer(nn.Module):
    def __init__(self, vc):
        super().__init__()
        d = vc.hidden_size
        self.layer_norm1 = nn.LayerNorm(d, eps=vc.layer_norm_eps)
        self.self_attn = ViTAttention(d, vc.num_attention_heads)
        self.layer_norm2 = nn.LayerNorm(d, eps=vc.layer_norm_eps)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(d, vc.intermediate_size), nn.Linear(vc.intermediate_size, d)
        self.act = activation(vc.hidden_act)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.layer_norm1(x))
        return x + self.mlp.fc2(self.act(self.mlp.fc1(self.layer_norm2(x))))


class ViTEmbeddings(nn.Module):
    def __init__(self, vc, cls_token: bool):
        super().__init__()
        d, p = vc.hidden_size, vc.patch_size
        self.patch_embedding = nn.Conv2d(vc.num_channels, d, kernel_size=p, stride=p, bias=not cls_token)
        self.num_patches = (vc.image_size // p) ** 2
        if cls_token:
            self.class_embedding = nn.Parameter(torch.zeros(d))
        self.cls_token = cls_token
        self.position_embedding = nn.Embedding(self.num_patches + int(cls_token), d)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = self.patch_embedding(pixels.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        if self.cls_token:  # [images, 1 + patches, dim]
            x = torch.cat([self.class_embedding.expand(x.shape[0], 1, -1), x], dim=1)
        return x + self.position_embedding.weight[None]


class VisionTransformer(nn.Module):
    """CLIP (class token, pre-norm) or SigLIP (neither) vision transformer; returns the hidden states a LLaVA
    config selects (vision_feature_layer, HF's hidden_states indexing: 0 = the embeddings)."""

    def __init__(self, vc, feature_layers: list[int]):
        super().__init__()
        self.clip = vc.model_type == "clip_vision_model"
        if not self.clip and vc.model_type != "siglip_vision_model":
            raise ValueError(f"unsupported LLaVA vision tower {vc.model_type!r}; supported: clip_vision_model, "
                             "siglip_vision_model")
        self.embeddings = ViTEmbeddings(vc, self.clip)
        if self.clip:
            self.pre_layrnorm = nn.LayerNorm(vc.hidden_size, eps=vc.layer_norm_eps)
        n = vc.num_hidden_layers
        self.layers_needed = max(i if i >= 0 else n + 1 + i for i in feature_layers)
        self.feature_layers = [i if i >= 0 else n + 1 + i for i in feature_layers]
        self.encoder = nn.Module()
        # only the layers whose output is read are built (a checkpoint's later layers are dropped at load)
        self.encoder.layers = nn.ModuleList(ViTLayer(vc) for _ in range(self.layers_needed))

    def forward(self, pixels: torch.Tensor) -> list[torch.Tensor]:
        x = self.embeddings(pixels)  # pixels: [images, 3, size, size] -> [images, tokens, dim]
        if self.clip:
            x = self.pre_layrnorm(x)
        states = [x]
        for layer in self.encoder.layers:
            x = layer(x)
            states.append(x)
        return [states[i] for i in self.feature_layers]


class LlavaEncoder(nn.Module):
    """Pixels -> the text decoder's embeddings of each image's tokens (tower, feature selection, projector)."""

    def __init__(self, config):
        super().__init__()
        vc, text = config.vision_config, config.text_config
        layers = config.vision_feature_layer
        layers = [layers] if isinstance(layers, int) else list(layers)
        self.strategy = getattr(config, "vision_feature_select_strategy", "default")
        if self.strategy not in ("default", "full"):
            raise ValueError(f"unsupported vision_feature_select_strategy {self.strategy!r}")
        self.vision_tower = VisionTransformer(vc, layers)
        bias = bool(getattr(config, "multimodal_projector_bias", True))
        self.multi_modal_projector = nn.Module()
        p = self.multi_modal_projector
        p.linear_1 = nn.Linear(vc.hidden_size * len(layers), text.hidden_size, bias=bias)
        p.linear_2 = nn.Linear(text.hidden_size, text.hidden_size, bias=bias)
        self.act = activation(getattr(config, "projector_hidden_act", "gelu"))
        self.drop = 1 if self.strategy == "default" else 0  # HF drops the first token (CLIP's class token)
        self.tokens_per_image = self.vision_tower.embeddings.num_patches + int(self.vision_tower.clip) - self.drop

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        feats = torch.cat([h[:, self.drop:] for h in self.vision_tower(pixels)], dim=-1)
        p = self.multi_modal_projector
        return p.linear_2(self.act(p.linear_1(feats)))  # [images, tokens_per_image, text hidden]

"""The Qwen2-VL vision encoder: 3D patch embedding of dynamic-resolution images, 2D rotary attention within each
image, and the merger that turns each 2x2 block of patches into one text-decoder token."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .vision_vit import activation


def patch_positions(grid: list[tuple[int, int, int]], merge: int) -> torch.Tensor:
    """(row, col) of every patch in the processor's order (merge x merge blocks, block-major): [patches, 2]."""
    out = []
    for t, h, w in grid:
        hh, ww = torch.meshgrid(torch.arange(h), torch.arange(w), indexing="ij")
        shape = (h // merge, merge, w // merge, merge)
        hh, ww = hh.reshape(shape).transpose(1, 2).flatten(), ww.reshape(shape).transpose(1, 2).flatten()
        out.append(torch.stack([hh, ww], dim=-1).repeat(t, 1))
    return torch.cat(out)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin in float32; x: [patches, heads, head_dim], cos/sin: [patches, 1, head_dim]."""
    xf = x.float()
    x1, x2 = xf.chunk(2, dim=-1)
    return (xf * cos + torch.cat([-x2, x1], dim=-1) * sin).to(x.dtype)


class VisionBlock(nn.Module):
    def __init__(self, vc):
        super().__init__()
        d = vc.embed_dim
        self.heads = vc.num_heads
        self.norm1, self.norm2 = nn.LayerNorm(d, eps=1e-6), nn.LayerNorm(d, eps=1e-6)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        hidden = int(d * vc.mlp_ratio)
        self.mlp = nn.Module()
        self.mlp.fc1, self.mlp.fc2 = nn.Linear(d, hidden), nn.Linear(hidden, d)
        self.act = activation(vc.hidden_act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        n, d = x.shape  # x: [patches of every image, dim]
        q, k, v = self.attn.qkv(self.norm1(x)).view(n, 3, self.heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths)):  # attention within one image
            o = F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None],
                                               vi.transpose(0, 1)[None])
            outs.append(o[0].transpose(0, 1).reshape(-1, d))
        x = x + self.attn.proj(torch.cat(outs))
        return x + self.mlp.fc2(self.act(self.mlp.fc1(self.norm2(x))))


class Qwen2VisionEncoder(nn.Module):
    """Flattened patches [patches, 3 * t * p * p] + their grids -> text embeddings [patches / merge^2, hidden]."""

    def __init__(self, vc):
        super().__init__()
        d = vc.embed_dim
        self.merge = vc.spatial_merge_size
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(vc.in_channels, d, kernel_size=[vc.temporal_patch_size, vc.patch_size,
                                                                           vc.patch_size], bias=False)
        self.blocks = nn.ModuleList(VisionBlock(vc) for _ in range(vc.depth))
        self.merger = nn.Module()
        self.merger.ln_q = nn.LayerNorm(d, eps=1e-6)
        self.merger.mlp = nn.Sequential(nn.Linear(d * self.merge ** 2, d * self.merge ** 2), nn.GELU(),
                                        nn.Linear(d * self.merge ** 2, vc.hidden_size))
        head_dim = d // vc.num_heads
        theta = float((getattr(vc, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.rope_theta, self.rope_half = theta, head_dim // 2  # rows and columns each rotate half the head

    def forward(self, patches: torch.Tensor, grid: list[tuple[int, int, int]]) -> torch.Tensor:
        w = self.patch_embed.proj.weight  # the 3D convolution over one patch each is a matmul
        x = patches.to(w.dtype) @ w.view(w.shape[0], -1).t()  # [patches, dim]
        pos = patch_positions(grid, self.merge).to(x.device)
        half = self.rope_half
        inv_freq = 1.0 / self.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32, device=x.device) / half)
        freqs = (pos[..., None].float() * inv_freq).flatten(1)  # [patches, head_dim / 2]: rows then cols
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        lengths = [h * w_ for t, h, w_ in grid for _ in range(t)]
        for blk in self.blocks:
            x = blk(x, cos, sin, lengths)
        return self.merger.mlp(self.merger.ln_q(x).view(-1, x.shape[-1] * self.merge ** 2))


class RMSNorm(nn.Module):
    """Qwen2.5-VL's vision RMSNorm (computed in float32)."""

    def __init__(self, dim: int, eps: float = 1e-6):
        super().__init__()
        self.weight, self.eps = nn.Parameter(torch.ones(dim)), eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return self.weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)


class Qwen25VisionBlock(VisionBlock):
    """Qwen2.5-VL's block: RMSNorms and a gated (SwiGLU) MLP with biases around the same attention."""

    def __init__(self, vc):
        nn.Module.__init__(self)
        d = vc.hidden_size
        self.heads = vc.num_heads
        self.norm1, self.norm2 = RMSNorm(d), RMSNorm(d)
        self.attn = nn.Module()
        self.attn.qkv, self.attn.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
        self.mlp = nn.Module()
        i = vc.intermediate_size
        self.mlp.gate_proj, self.mlp.up_proj, self.mlp.down_proj = nn.Linear(d, i), nn.Linear(d, i), nn.Linear(i, d)
        self.act = activation(vc.hidden_act)

    def forward(self, x, cos, sin, lengths):
        n, d = x.shape
        q, k, v = self.attn.qkv(self.norm1(x)).view(n, 3, self.heads, -1).unbind(1)
        q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
        outs = []
        for qi, ki, vi in zip(q.split(lengths), k.split(lengths), v.split(lengths)):
            o = F.scaled_dot_product_attention(qi.transpose(0, 1)[None], ki.transpose(0, 1)[None],
                                               vi.transpose(0, 1)[None])
            outs.append(o[0].transpose(0, 1).reshape(-1, d))
        x = x + self.attn.proj(torch.cat(outs))
        h = self.norm2(x)
        return x + self.mlp.down_proj(self.act(self.mlp.gate_proj(h)) * self.mlp.up_proj(h))


def window_order(grid: list[tuple[int, int, int]], merge: int, window: int) -> tuple[torch.Tensor, list[int]]:
    """Qwen2.5-VL's windows: the order of the merged tokens grouped window by window (row-major windows of
    window x window merged tokens, cut at the image's edge) and each window's length in patches."""
    order, lengths, base = [], [], 0
    for t, h, w in grid:
        gh, gw = h // merge, w // merge
        index = torch.arange(t * gh * gw).reshape(t, gh, gw)
        for f in range(t):
            for r in range(0, gh, window):
                for c in range(0, gw, window):
                    block = index[f, r:r + window, c:c + window].reshape(-1)
                    order.append(block + base)
                    lengths.append(block.numel() * merge * merge)
        base += t * gh * gw
    return torch.cat(order), lengths


class Qwen25VisionEncoder(Qwen2VisionEncoder):
    """Qwen2.5-VL: windowed attention (full attention in the fullatt_block_indexes blocks), RMSNorm, SwiGLU."""

    def __init__(self, vc):
        nn.Module.__init__(self)
        d = vc.hidden_size
        self.merge = vc.spatial_merge_size
        self.window = vc.window_size // self.merge // vc.patch_size  # merged tokens per window side
        self.full = set(vc.fullatt_block_indexes)
        self.patch_embed = nn.Module()
        self.patch_embed.proj = nn.Conv3d(vc.in_channels, d, kernel_size=[vc.temporal_patch_size, vc.patch_size,
                                                                           vc.patch_size], bias=False)
        self.blocks = nn.ModuleList(Qwen25VisionBlock(vc) for _ in range(vc.depth))
        self.merger = nn.Module()
        self.merger.ln_q = RMSNorm(d)
        self.merger.mlp = nn.Sequential(nn.Linear(d * self.merge ** 2, d * self.merge ** 2), nn.GELU(),
                                        nn.Linear(d * self.merge ** 2, vc.out_hidden_size))
        theta = float((getattr(vc, "rope_parameters", None) or {}).get("rope_theta", 10000.0))
        self.rope_theta, self.rope_half = theta, (d // vc.num_heads) // 2

    def forward(self, patches: torch.Tensor, grid: list[tuple[int, int, int]]) -> torch.Tensor:
        w = self.patch_embed.proj.weight
        x = patches.to(w.dtype) @ w.view(w.shape[0], -1).t()  # [patches, dim]
        unit = self.merge ** 2
        order, windows = window_order(grid, self.merge, self.window)
        order = order.to(x.device)
        regroup = lambda t: t.view(-1, unit, t.shape[-1])[order].reshape(-1, t.shape[-1])  # noqa: E731
        pos = patch_positions(grid, self.merge).to(x.device)
        half = self.rope_half
        inv_freq = 1.0 / self.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32, device=x.device) / half)
        freqs = regroup((pos[..., None].float() * inv_freq).flatten(1))
        emb = torch.cat([freqs, freqs], dim=-1)[:, None]
        cos, sin = emb.cos(), emb.sin()
        x = regroup(x)
        images = [h * w_ for t, h, w_ in grid for _ in range(t)]
        for i, blk in enumerate(self.blocks):
            x = blk(x, cos, sin, images if i in self.full else windows)
        merged = self.merger.mlp(self.merger.ln_q(x).view(-1, x.shape[-1] * unit))
        return merged[torch.argsort(order)]  # back to the processor's order

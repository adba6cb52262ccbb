"""Vision Transformers for faces, ViT-T/S/B: a patch embedding and a flattening embedding layer.

``patch conv (kernel = stride = p) → + learned position embedding → L × [pre-LN MHSA, pre-LN
MLP(4×, GELU)] with stochastic depth → LN → Flatten(all tokens) → Dropout → FC → BN``.

There is no class token: as in the IResNet embedding layer, the FC sees every token, so the
spatial layout of an aligned face is kept. The patch size defaults to ``min(H, W) // 12`` (9 at
112, 8 at 96, 2 at 28): a 12×12 token grid at 96 and 112, 14×14 at 28.

Widths / depths / heads: T 192/12/3, S 384/12/6, B 768/12/12 (the DeiT sizes).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from partialfc.models.common import as_hw, check_in_channels


class DropPath(nn.Module):
    """Stochastic depth: drop a whole residual branch per sample with probability ``p``."""

    def __init__(self, p: float):
        super().__init__()
        self.p = p

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training or self.p == 0.0:
            return x
        keep = 1.0 - self.p
        mask = x.new_empty((x.shape[0],) + (1,) * (x.ndim - 1)).bernoulli_(keep)
        return x * mask / keep


class Attention(nn.Module):
    """Multi-head self-attention on ``(B, N, D)`` via ``scaled_dot_product_attention``."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        if dim % num_heads:
            raise ValueError(f"dim {dim} is not divisible by num_heads {num_heads}")
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class TransformerBlock(nn.Module):
    def __init__(self, dim: int, num_heads: int, mlp_ratio: float, drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        hidden = int(dim * mlp_ratio)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class FaceViT(nn.Module):
    """ViT backbone producing an embedding.

    Args:
        dim: transformer width.
        depth: number of blocks.
        num_heads: attention heads.
        embedding_dim: output dimension; default 512.
        input_size: ``H`` or ``(H, W)``; default 112.
        in_channels: 1 or 3; default 3.
        dropout: dropout before the FC; default 0.0.
        patch_size: default ``max(1, min(H, W) // 12)``.
        mlp_ratio: MLP hidden width / dim; default 4.
        drop_path_rate: stochastic depth of the last block (linear from 0); default 0.1.
    """

    def __init__(
        self,
        dim: int,
        depth: int,
        num_heads: int,
        embedding_dim: int = 512,
        input_size: int | tuple[int, int] = 112,
        in_channels: int = 3,
        dropout: float = 0.0,
        patch_size: int | None = None,
        mlp_ratio: float = 4.0,
        drop_path_rate: float = 0.1,
    ):
        super().__init__()
        h, w = as_hw(input_size)
        self.input_size = (h, w)
        self.in_channels = check_in_channels(in_channels)
        self.embedding_dim = embedding_dim
        p = patch_size if patch_size is not None else max(1, min(h, w) // 12)
        if p > min(h, w):
            raise ValueError(f"patch_size {p} exceeds input size {(h, w)}")
        self.patch_size = p
        self.grid = (h // p, w // p)
        num_tokens = self.grid[0] * self.grid[1]

        self.patch_embed = nn.Conv2d(in_channels, dim, p, stride=p)
        self.pos_embed = nn.Parameter(torch.zeros(1, num_tokens, dim))
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.Sequential(
            *[TransformerBlock(dim, num_heads, mlp_ratio, r) for r in rates]
        )
        self.norm = nn.LayerNorm(dim)
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(num_tokens * dim, embedding_dim)
        self.features = nn.BatchNorm1d(embedding_dim)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x).flatten(2).transpose(1, 2) + self.pos_embed
        x = self.norm(self.blocks(x))
        return self.features(self.fc(self.dropout(x.flatten(1))))


def vit_t(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> FaceViT:
    """ViT-Tiny for faces: dim 192, 12 blocks, 3 heads."""
    return FaceViT(192, 12, 3, embedding_dim, input_size, in_channels, dropout)


def vit_s(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> FaceViT:
    """ViT-Small for faces: dim 384, 12 blocks, 6 heads."""
    return FaceViT(384, 12, 6, embedding_dim, input_size, in_channels, dropout)


def vit_b(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> FaceViT:
    """ViT-Base for faces: dim 768, 12 blocks, 12 heads."""
    return FaceViT(768, 12, 12, embedding_dim, input_size, in_channels, dropout)

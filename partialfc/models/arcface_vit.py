"""The Vision Transformers of InsightFace's ``arcface_torch`` (``vit_t`` … ``vit_h``).

They differ from :mod:`partialfc.models.vit` in ways that change the function, so they are a
family of their own: 9×9 patches at any input size, attention without a ``qkv`` bias, a
ReLU6 MLP, and a two-stage embedding layer::

    patch conv 9×9/9 → + position embedding → L × [pre-LN MHSA (no qkv bias), pre-LN
    MLP(4×, ReLU6)] with stochastic depth → LN → Flatten(all tokens)
    → FC(no bias, N·D → D) → BN(ε 2e-5) → [Dropout] → FC(no bias, D → d) → BN(ε 2e-5)

Widths / depths (8 heads each): t 256/12, s 512/12, b 512/24, l 768/24, h 1024/48.
arcface_torch also masks a fraction of the tokens in training (``mask_ratio``); that is a
training-time augmentation which leaves the inference function unchanged, and it is not
reproduced here (fine-tuning runs without it). Module names follow arcface_torch's, so its
weights load through :mod:`partialfc.tools.arcface_torch.weights` with only the unused
``mask_token`` dropped. Source: InsightFace arcface_torch ``backbones/vit.py``; Dosovitskiy
et al., An Image Is Worth 16x16 Words, ICLR 2021.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from partialfc.models.common import as_hw, check_in_channels, conv_out
from partialfc.models.vit import DropPath

PATCH_SIZE = 9
NUM_HEADS = 8
BN_EPS = 2e-5


class PatchEmbed(nn.Module):
    def __init__(self, in_channels: int, dim: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(in_channels, dim, patch, stride=patch)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.proj(x).flatten(2).transpose(1, 2)


class Attention(nn.Module):
    """Multi-head self-attention, ``softmax(q kᵀ / √(D/h)) v``, no bias on ``qkv``."""

    def __init__(self, dim: int, num_heads: int):
        super().__init__()
        self.num_heads = num_heads
        self.qkv = nn.Linear(dim, 3 * dim, bias=False)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        qkv = self.qkv(x).reshape(b, n, 3, self.num_heads, d // self.num_heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).float().unbind(0)
        y = F.scaled_dot_product_attention(q, k, v)
        return self.proj(y.transpose(1, 2).reshape(b, n, d))


class Mlp(nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden)
        self.act = nn.ReLU6()
        self.fc2 = nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.act(self.fc1(x)))


class Block(nn.Module):
    def __init__(self, dim: int, num_heads: int, drop_path: float):
        super().__init__()
        self.norm1 = nn.LayerNorm(dim)
        self.attn = Attention(dim, num_heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = Mlp(dim, 4 * dim)
        self.drop_path = DropPath(drop_path)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.drop_path(self.attn(self.norm1(x)))
        return x + self.drop_path(self.mlp(self.norm2(x)))


class ArcFaceViT(nn.Module):
    """arcface_torch's face ViT; see the module docstring for the layout."""

    def __init__(
        self,
        dim: int,
        depth: int,
        drop_path_rate: float,
        embedding_dim: int = 512,
        input_size: int | tuple[int, int] = 112,
        in_channels: int = 3,
        dropout: float = 0.0,
    ):
        super().__init__()
        h, w = as_hw(input_size)
        if min(h, w) < PATCH_SIZE:
            raise ValueError(f"input_size {(h, w)} is smaller than the {PATCH_SIZE}-pixel patch")
        self.input_size = (h, w)
        self.in_channels = check_in_channels(in_channels)
        self.embedding_dim = embedding_dim
        self.grid = (conv_out(h, PATCH_SIZE, PATCH_SIZE, 0), conv_out(w, PATCH_SIZE, PATCH_SIZE, 0))
        tokens = self.grid[0] * self.grid[1]
        self.patch_embed = PatchEmbed(in_channels, dim, PATCH_SIZE)
        self.pos_embed = nn.Parameter(torch.zeros(1, tokens, dim))
        # stochastic depth rising linearly from 0 to drop_path_rate over the blocks
        rates = [drop_path_rate * i / max(depth - 1, 1) for i in range(depth)]
        self.blocks = nn.ModuleList([Block(dim, NUM_HEADS, r) for r in rates])
        self.norm = nn.LayerNorm(dim)
        self.feature = nn.Sequential(
            nn.Linear(tokens * dim, dim, bias=False),
            nn.BatchNorm1d(dim, eps=BN_EPS),
            nn.Linear(dim, embedding_dim, bias=False),
            nn.BatchNorm1d(embedding_dim, eps=BN_EPS),
        )
        self.dropout = nn.Dropout(p=dropout)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)
        for m in self.modules():
            if isinstance(m, nn.Linear):
                nn.init.trunc_normal_(m.weight, std=0.02)
                if m.bias is not None:
                    nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.patch_embed(x) + self.pos_embed
        for block in self.blocks:
            x = block(x)
        x = self.norm(x.float()).flatten(1)
        fc1, bn1, fc2, bn2 = self.feature
        return bn2(fc2(self.dropout(bn1(fc1(x)))))


def _vit(dim, depth, drop_path_rate):
    def build(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> ArcFaceViT:
        return ArcFaceViT(
            dim, depth, drop_path_rate, embedding_dim, input_size, in_channels, dropout
        )

    build.__doc__ = f"arcface_torch ViT: dim {dim}, {depth} blocks, drop path {drop_path_rate}."
    return build


# partialfc name -> builder; the arcface_torch names they stand for are in
# partialfc.tools.arcface_torch.weights.NETWORKS
ARCFACE_VITS = {
    "arcface_vit_t": _vit(256, 12, 0.1),
    "arcface_vit_t_dp005": _vit(256, 12, 0.05),
    "arcface_vit_s": _vit(512, 12, 0.1),
    "arcface_vit_s_dp005": _vit(512, 12, 0.05),
    "arcface_vit_b": _vit(512, 24, 0.1),
    "arcface_vit_b_dp005": _vit(512, 24, 0.05),
    "arcface_vit_l_dp005": _vit(768, 24, 0.05),
    "arcface_vit_h": _vit(1024, 48, 0.1),
}

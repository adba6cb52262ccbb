"""Pieces shared by every backbone: input-size handling and the embedding layer.

Every backbone maps ``(B, in_channels, H, W)`` float images to ``(B, embedding_dim)``
*unnormalised* embeddings; heads L2-normalise them (docs/architecture.md).
"""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn


def as_hw(input_size: int | tuple[int, int]) -> tuple[int, int]:
    """``112 -> (112, 112)``; ``(96, 112) -> (96, 112)``. Rejects non-positive sizes."""
    if isinstance(input_size, int):
        h = w = input_size
    else:
        h, w = (int(v) for v in input_size)
    if h < 1 or w < 1:
        raise ValueError(f"input_size must be positive, got {input_size!r}")
    return h, w


def conv_out(size: int, kernel: int, stride: int, padding: int) -> int:
    """Spatial output length of a convolution: ``floor((n + 2p - k) / s) + 1``."""
    return (size + 2 * padding - kernel) // stride + 1


def check_in_channels(in_channels: int) -> int:
    if in_channels not in (1, 3):
        raise ValueError(f"in_channels must be 1 (grey) or 3 (RGB), got {in_channels}")
    return in_channels


class EmbeddingLayer(nn.Module):
    """ArcFace output block: ``BN → Dropout → Flatten → FC → BN`` to the embedding.

    The final BatchNorm1d keeps its scale fixed at 1 (only the shift is learned), as in
    the ArcFace reference models, so the layer cannot shrink the feature norm by itself.
    """

    def __init__(self, channels: int, spatial: int, embedding_dim: int, dropout: float):
        super().__init__()
        self.bn = nn.BatchNorm2d(channels, eps=1e-5)
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(channels * spatial, embedding_dim)
        self.features = nn.BatchNorm1d(embedding_dim, eps=1e-5)
        nn.init.constant_(self.features.weight, 1.0)
        self.features.weight.requires_grad_(False)

    def forward(self, x):
        x = self.dropout(self.bn(x))
        # flatten() rather than view(): works for channels-last feature maps too
        return self.features(self.fc(x.flatten(1)))


def fold_linear_map(backbone: nn.Module, matrix) -> nn.Module:
    """A copy of ``backbone``, in eval mode, whose embedding is ``matrix @ f(x)`` where ``f(x)``
    is ``backbone``'s (e.g. a whitening, :class:`partialfc.models.whitening.WithinClassWhitening`).

    In eval mode the output block computes ``z = a ⊙ (W h + b) + c`` (``a = γ / √(σ² + ε)``,
    ``c = β − a ⊙ μ``: the final batch norm with its running statistics), so ``M z`` is the same
    block with ``W ← M diag(a) W``, ``b ← M (a ⊙ b + c)`` and an identity batch norm: exact up to
    rounding, and the copy keeps the architecture (it exports and loads like any backbone).
    The copy is for inference: training it would re-estimate the batch norm's statistics.
    ``backbone`` itself is not changed. ``matrix`` is ``(d, d)``, ``d`` the embedding size.
    """
    layers = [m for m in backbone.modules() if isinstance(m, EmbeddingLayer)]
    if len(layers) != 1:
        raise ValueError(
            f"fold_linear_map needs a backbone with one EmbeddingLayer output block, "
            f"{type(backbone).__name__} has {len(layers)}"
        )
    linear = torch.as_tensor(np.asarray(matrix), dtype=torch.float64)
    dim = layers[0].fc.out_features
    if linear.shape != (dim, dim) or not torch.isfinite(linear).all():
        raise ValueError(f"matrix must be a finite ({dim}, {dim}) array, got {tuple(linear.shape)}")
    folded = copy.deepcopy(backbone).eval()
    head = next(layer for layer in folded.modules() if isinstance(layer, EmbeddingLayer))
    fc, bn = head.fc, head.features  # nn.Linear with a bias, BatchNorm1d
    with torch.no_grad():
        a = bn.weight.double() / torch.sqrt(bn.running_var.double() + bn.eps)
        c = bn.bias.double() - a * bn.running_mean.double()
        fc.weight.copy_(linear @ (a[:, None] * fc.weight.double()))
        fc.bias.copy_(linear @ (a * fc.bias.double() + c))
        bn.running_mean.zero_()
        bn.running_var.fill_(1.0 - bn.eps)
        bn.weight.fill_(1.0)
        bn.bias.zero_()
    return folded

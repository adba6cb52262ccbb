"""MobileFaceNet as InsightFace's ``arcface_torch`` builds it (``mbf``, ``mbf_large``).

This is not the paper's layout (:mod:`partialfc.models.mobilefacenet`): the stem is ``scale``
times wider, the second stem conv is grouped (64 groups) and the bottlenecks follow
arcface_torch's plan. Each bottleneck is ``1×1 expand → depthwise 3×3(stride) → 1×1 linear``
(a residual when the stride is 1 and the width stays)::

    conv3×3 s2 (64·scale) → stem2 → [down, repeats] × 3 stages → conv1×1 512
    → GDC (depthwise, kernel = final map, 7×7 at 112) → Flatten → FC (no bias) → BN

Module names follow arcface_torch's (``layers``, ``conv_sep``, ``features``), so a backbone
trained there loads with an identity key map. ``mbf``: ``scale=2``, repeats ``(1, 4, 6, 2)``;
``mbf_large``: ``scale=4``, repeats ``(2, 8, 12, 4)``. Source: InsightFace arcface_torch
``backbones/mobilefacenet.py`` (after cavaface.pytorch); Chen et al., MobileFaceNets, 2018.
"""

from __future__ import annotations

import torch
from torch import nn

from partialfc.models.common import as_hw, check_in_channels, conv_out


class ConvUnit(nn.Module):
    """``conv (no bias) → BN`` with a PReLU unless ``linear``."""

    def __init__(self, cin, cout, kernel=1, stride=1, padding=0, groups=1, linear=False):
        super().__init__()
        parts = [
            nn.Conv2d(cin, cout, kernel, stride, padding, groups=groups, bias=False),
            nn.BatchNorm2d(cout),
        ]
        if not linear:
            parts.append(nn.PReLU(cout))
        self.layers = nn.Sequential(*parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class DepthwiseBottleneck(nn.Module):
    """``1×1 (cin → hidden) → depthwise 3×3(stride) → 1×1 linear (hidden → cout)`` [+ x]."""

    def __init__(self, cin: int, cout: int, hidden: int, stride: int, residual: bool):
        super().__init__()
        self.residual = residual
        self.layers = nn.Sequential(
            ConvUnit(cin, hidden),
            ConvUnit(hidden, hidden, 3, stride, 1, groups=hidden),
            ConvUnit(hidden, cout, linear=True),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layers(x)
        return x + y if self.residual else y


class Repeats(nn.Module):
    """``n`` residual stride-1 bottlenecks of width ``c``."""

    def __init__(self, c: int, n: int, hidden: int):
        super().__init__()
        self.layers = nn.Sequential(
            *[DepthwiseBottleneck(c, c, hidden, 1, residual=True) for _ in range(n)]
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class GlobalDepthwiseEmbedding(nn.Module):
    """``depthwise conv over the whole map → BN → Flatten → [Dropout] → FC → BN``."""

    def __init__(self, map_hw: tuple[int, int], embedding_dim: int, dropout: float):
        super().__init__()
        self.layers = nn.Sequential(
            ConvUnit(512, 512, map_hw, groups=512, linear=True),
            nn.Flatten(),
            nn.Linear(512, embedding_dim, bias=False),
            nn.BatchNorm1d(embedding_dim),
        )
        self.dropout = nn.Dropout(p=dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        conv, flatten, fc, bn = self.layers
        return bn(fc(self.dropout(flatten(conv(x)))))


class ArcFaceMobileFaceNet(nn.Module):
    """arcface_torch's MobileFaceNet; ``scale`` widens it, ``repeats`` deepens its stages."""

    def __init__(
        self,
        scale: int = 2,
        repeats: tuple[int, int, int, int] = (1, 4, 6, 2),
        embedding_dim: int = 512,
        input_size: int | tuple[int, int] = 112,
        in_channels: int = 3,
        dropout: float = 0.0,
    ):
        super().__init__()
        h, w = as_hw(input_size)
        self.input_size = (h, w)
        self.in_channels = check_in_channels(in_channels)
        self.embedding_dim = embedding_dim
        c1, c2 = 64 * scale, 128 * scale
        first = repeats[0]
        self.layers = nn.ModuleList(
            [
                ConvUnit(in_channels, c1, 3, 2, 1),
                ConvUnit(c1, c1, 3, 1, 1, groups=64) if first == 1 else Repeats(c1, first, 128),
                DepthwiseBottleneck(c1, c1, 128, 2, residual=False),
                Repeats(c1, repeats[1], 128),
                DepthwiseBottleneck(c1, c2, 256, 2, residual=False),
                Repeats(c2, repeats[2], 256),
                DepthwiseBottleneck(c2, c2, 512, 2, residual=False),
                Repeats(c2, repeats[3], 256),
            ]
        )
        for _ in range(4):  # four stride-2 convolutions
            h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
        self.feature_map_size = (h, w)
        self.conv_sep = ConvUnit(c2, 512)
        self.features = GlobalDepthwiseEmbedding((h, w), embedding_dim, dropout)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return self.features(self.conv_sep(x))


def arcface_mbf(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0):
    """arcface_torch ``mbf``: scale 2, repeats 1-4-6-2 (about 2.0M parameters, 512-d)."""
    return ArcFaceMobileFaceNet(2, (1, 4, 6, 2), embedding_dim, input_size, in_channels, dropout)


def arcface_mbf_large(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0):
    """arcface_torch ``mbf_large``: scale 4, repeats 2-8-12-4."""
    return ArcFaceMobileFaceNet(4, (2, 8, 12, 4), embedding_dim, input_size, in_channels, dropout)

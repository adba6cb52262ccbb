"""MobileFaceNet (Chen et al., 2018): inverted-residual bottlenecks and a global depthwise conv.

At 112×112::

    conv3×3 s2 64 → dwconv3×3 64 → bottlenecks (t, c, n, s):
        (2, 64, 5, 2) (4, 128, 1, 2) (2, 128, 6, 1) (4, 128, 1, 2) (2, 128, 2, 1)
    → conv1×1 512 → linear GDConv (depthwise, kernel = final map, 7×7 at 112)
    → Flatten → FC → BN to the embedding.

Convolutions are followed by BN and PReLU except the "linear" ones (bottleneck projections
and the GDConv). The GDConv kernel is computed from the input size, so 28×28 inputs work.
"""

from __future__ import annotations

import torch
from torch import nn

from partialfc.models.common import as_hw, check_in_channels, conv_out

# (expansion t, output channels c, repeats n, first stride s)
BOTTLENECK_PLAN = ((2, 64, 5, 2), (4, 128, 1, 2), (2, 128, 6, 1), (4, 128, 1, 2), (2, 128, 2, 1))


def _conv_bn(cin, cout, kernel, stride=1, groups=1, act=True) -> nn.Sequential:
    layers = [
        nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2, groups=groups, bias=False),
        nn.BatchNorm2d(cout),
    ]
    if act:
        layers.append(nn.PReLU(cout))
    return nn.Sequential(*layers)


class Bottleneck(nn.Module):
    """Inverted residual: ``1×1 expand → 3×3 depthwise(stride) → 1×1 linear project``."""

    def __init__(self, cin: int, cout: int, stride: int, expansion: int):
        super().__init__()
        hidden = cin * expansion
        self.body = nn.Sequential(
            _conv_bn(cin, hidden, 1),
            _conv_bn(hidden, hidden, 3, stride, groups=hidden),
            _conv_bn(hidden, cout, 1, act=False),
        )
        self.use_residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.body(x)
        return x + y if self.use_residual else y


class MobileFaceNet(nn.Module):
    """MobileFaceNet with configurable embedding size, input size and channel count.

    Args:
        embedding_dim: output dimension; default 512 (the paper uses 128).
        input_size: ``H`` or ``(H, W)``; default 112.
        in_channels: 1 or 3; default 3.
        dropout: dropout before the FC; default 0.0.
    """

    def __init__(self, embedding_dim=512, input_size=112, in_channels=3, dropout=0.0):
        super().__init__()
        h, w = as_hw(input_size)
        self.input_size = (h, w)
        self.in_channels = check_in_channels(in_channels)
        self.embedding_dim = embedding_dim

        layers = [_conv_bn(in_channels, 64, 3, 2), _conv_bn(64, 64, 3, 1, groups=64)]
        h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
        cin = 64
        for t, c, n, s in BOTTLENECK_PLAN:
            for i in range(n):
                stride = s if i == 0 else 1
                layers.append(Bottleneck(cin, c, stride, t))
                h, w = conv_out(h, 3, stride, 1), conv_out(w, 3, stride, 1)
                cin = c
        layers.append(_conv_bn(cin, 512, 1))
        self.features = nn.Sequential(*layers)
        self.feature_map_size = (h, w)
        # global depthwise conv: one kernel spanning the whole final map
        self.gdconv = nn.Sequential(
            nn.Conv2d(512, 512, (h, w), groups=512, bias=False), nn.BatchNorm2d(512)
        )
        self.dropout = nn.Dropout(p=dropout)
        self.fc = nn.Linear(512, embedding_dim, bias=False)
        self.bn = nn.BatchNorm1d(embedding_dim)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.01)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.gdconv(self.features(x)).flatten(1)
        return self.bn(self.fc(self.dropout(x)))


def mobilefacenet(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> MobileFaceNet:
    """MobileFaceNet: about 1.2M parameters and 0.23 GMACs at 112×112 (512-d)."""
    return MobileFaceNet(embedding_dim, input_size, in_channels, dropout)

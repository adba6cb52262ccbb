"""IResNet: the "improved residual" backbones of ArcFace (Deng et al., CVPR 2019).

Stem: ``conv3×3(64, stride 1) → BN → PReLU``. Four stages of IR blocks, each stage halving
the resolution in its first block::

    x ─ BN ─ conv3×3 ─ BN ─ PReLU ─ conv3×3(stride) ─ BN ─(+)─→
    └──────────── shortcut (identity, or conv1×1(stride) ─ BN) ──┘

Output: ``BN → Dropout → Flatten → FC → BN`` to the embedding (512-d by default).

The final feature-map size is computed from the input size (7×7 at 112, 6×6 at 96,
2×2 at 28), so the same definition serves 112×112 faces and 28×28 Omniglot characters.

Depths (blocks per stage): r18 2-2-2-2, r34 3-4-6-3, r50 3-4-14-3, r100 3-13-30-3,
r200 6-26-60-6, r2060 3-128-896-3; widths 64-128-256-512.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from partialfc.models.common import EmbeddingLayer, as_hw, check_in_channels, conv_out


def _conv3x3(cin: int, cout: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)


class IRBlock(nn.Module):
    """IR block: ``BN–conv3×3–BN–PReLU–conv3×3(stride)–BN`` plus shortcut (no bottleneck)."""

    def __init__(self, cin: int, cout: int, stride: int):
        super().__init__()
        self.residual = nn.Sequential(
            nn.BatchNorm2d(cin, eps=1e-5),
            _conv3x3(cin, cout),
            nn.BatchNorm2d(cout, eps=1e-5),
            nn.PReLU(cout),
            _conv3x3(cout, cout, stride),
            nn.BatchNorm2d(cout, eps=1e-5),
        )
        if stride != 1 or cin != cout:
            self.shortcut = nn.Sequential(
                nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                nn.BatchNorm2d(cout, eps=1e-5),
            )
        else:
            self.shortcut = nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.residual(x) + self.shortcut(x)


class IResNet(nn.Module):
    """IResNet backbone with a configurable depth, width, input size and channel count.

    Args:
        layers: IR blocks per stage, e.g. ``(3, 4, 14, 3)`` for r50.
        widths: output channels per stage; default ``(64, 128, 256, 512)``.
        stem_width: channels of the stem conv; default 64.
        embedding_dim: output dimension; default 512.
        input_size: ``H`` (square) or ``(H, W)``; default 112.
        in_channels: 1 (grey) or 3 (RGB); default 3.
        dropout: dropout probability before the FC; default 0.0.
    """

    def __init__(
        self,
        layers: Sequence[int],
        widths: Sequence[int] = (64, 128, 256, 512),
        stem_width: int = 64,
        embedding_dim: int = 512,
        input_size: int | tuple[int, int] = 112,
        in_channels: int = 3,
        dropout: float = 0.0,
    ):
        super().__init__()
        if len(layers) != len(widths) or any(n < 1 for n in layers):
            raise ValueError(
                f"layers {tuple(layers)} and widths {tuple(widths)} must have equal length, n >= 1"
            )
        h, w = as_hw(input_size)
        self.input_size = (h, w)
        self.in_channels = check_in_channels(in_channels)
        self.embedding_dim = embedding_dim

        self.stem = nn.Sequential(
            _conv3x3(in_channels, stem_width),
            nn.BatchNorm2d(stem_width, eps=1e-5),
            nn.PReLU(stem_width),
        )
        stages, cin = [], stem_width
        for n_blocks, cout in zip(layers, widths, strict=True):
            blocks = [IRBlock(cin, cout, stride=2)]
            blocks += [IRBlock(cout, cout, stride=1) for _ in range(n_blocks - 1)]
            stages.append(nn.Sequential(*blocks))
            cin = cout
            h, w = conv_out(h, 3, 2, 1), conv_out(w, 3, 2, 1)
        self.stages = nn.Sequential(*stages)
        self.feature_map_size = (h, w)
        # "head" names the state-dict keys of every checkpoint written so far
        self.head = EmbeddingLayer(cin, h * w, embedding_dim, dropout)
        self._init_weights()

    def _init_weights(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
            elif isinstance(m, nn.Linear):
                nn.init.normal_(m.weight, std=0.01)
                nn.init.zeros_(m.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.stages(self.stem(x)))


COMPACT_WIDTHS = (32, 64, 128, 256)  # half of IResNet-18's, for small inputs on a CPU
NARROW_WIDTHS = (24, 48, 96, 192)
TINY_WIDTHS = (16, 32, 64, 128)


def _iresnet(
    layers, embedding_dim, input_size, in_channels, dropout, widths=(64, 128, 256, 512)
) -> IResNet:
    return IResNet(
        layers,
        widths=widths,
        stem_width=widths[0],
        embedding_dim=embedding_dim,
        input_size=input_size,
        in_channels=in_channels,
        dropout=dropout,
    )


def iresnet18(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-18 (2-2-2-2): 24.0M parameters, 2.6 GMACs at 112×112, 512-d."""
    return _iresnet((2, 2, 2, 2), embedding_dim, input_size, in_channels, dropout)


def iresnet34(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-34 (3-4-6-3): 34.1M parameters, 4.5 GMACs at 112×112, 512-d."""
    return _iresnet((3, 4, 6, 3), embedding_dim, input_size, in_channels, dropout)


def iresnet50(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-50 (3-4-14-3): 43.6M parameters, 6.3 GMACs at 112×112, 512-d."""
    return _iresnet((3, 4, 14, 3), embedding_dim, input_size, in_channels, dropout)


def iresnet100(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-100 (3-13-30-3): 65.2M parameters, 12.1 GMACs at 112×112, 512-d."""
    return _iresnet((3, 13, 30, 3), embedding_dim, input_size, in_channels, dropout)


def iresnet200(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-200 (6-26-60-6): 23.5 GMACs at 112×112, 512-d."""
    return _iresnet((6, 26, 60, 6), embedding_dim, input_size, in_channels, dropout)


def iresnet2060(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-2060 (3-128-896-3), arcface_torch's ``r2060``: about 1.1 billion parameters."""
    return _iresnet((3, 128, 896, 3), embedding_dim, input_size, in_channels, dropout)


def iresnet_small(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """Compact IResNet (1-1-1-1, widths 32-64-128-256), e.g. for 28×28 greyscale on a CPU.

    Use ``iresnet_small(input_size=28, in_channels=1)`` for Omniglot.
    Same blocks as the face models, about a thousandth of their compute at 28×28; see
    ``benchmarks/bench_models.py`` for its measured throughput.
    """
    return _iresnet((1, 1, 1, 1), embedding_dim, input_size, in_channels, dropout, COMPACT_WIDTHS)


def iresnet_small_narrow(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """``iresnet_small`` at three quarters of its width (1-1-1-1, widths 24-48-96-192).

    About 0.56× its convolution MACs; a smaller compact model for training sets of a few
    hundred identities.
    """
    return _iresnet((1, 1, 1, 1), embedding_dim, input_size, in_channels, dropout, NARROW_WIDTHS)


def iresnet_tiny(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """``iresnet_small`` at half its width (1-1-1-1, widths 16-32-64-128): about a quarter of
    its convolution MACs."""
    return _iresnet((1, 1, 1, 1), embedding_dim, input_size, in_channels, dropout, TINY_WIDTHS)


def iresnet18_half(embedding_dim=512, input_size=112, in_channels=3, dropout=0.0) -> IResNet:
    """IResNet-18's depth (2-2-2-2) at half its width (32-64-128-256, as ``iresnet_small``).

    Twice the IR blocks of ``iresnet_small``: 9.2M parameters and 0.66 GMACs at 112×112
    (``iresnet_small``: 7.7M, 0.43 GMACs), 512-d. A deeper compact model for small face sets.
    """
    return _iresnet((2, 2, 2, 2), embedding_dim, input_size, in_channels, dropout, COMPACT_WIDTHS)

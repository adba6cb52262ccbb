"""Pixel normalisation: the one map from stored ``uint8`` pixels to network input.

``x = (uint8 / 255 - mean) / std`` per channel, with ``mean = std = 0.5`` for every model this
project trains (input in [-1, 1]); training, evaluation, deployment and the tools all call it.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

TRAINING_MEAN = 0.5
TRAINING_STD = 0.5


def normalize_pixels(
    unit: torch.Tensor,
    mean: float | Sequence[float] = TRAINING_MEAN,
    std: float | Sequence[float] = TRAINING_STD,
) -> torch.Tensor:
    """``(unit - mean) / std`` for pixels already scaled to [0, 1]; a per-channel ``mean`` /
    ``std`` broadcasts over the last axis (channels-last input)."""
    if not isinstance(mean, (int, float)):
        mean = torch.tensor(list(mean), dtype=unit.dtype, device=unit.device)
    if not isinstance(std, (int, float)):
        std = torch.tensor(list(std), dtype=unit.dtype, device=unit.device)
    return (unit - mean) / std


def normalize_batch(images: torch.Tensor) -> torch.Tensor:
    """uint8 batch (B, C, H, W) -> float32 in [-1, 1]: ``(x / 255 - 0.5) / 0.5``."""
    return normalize_pixels(images.float() / 255.0)

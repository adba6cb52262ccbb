"""Intra- and inter-class angular penalties of ArcFace (Deng et al., CVPR 2019, L5 and L6).

    L5 = L2 + (1/pi) * theta_{y_i}                                   (intra: pull to own center)
    L6 = L2 - 1/(pi (N-1)) * sum_{j != y_i} arccos(W_{y_i}^T W_j)    (inter: spread the centers)

These are the add-on terms only (without the softmax loss L2), averaged over the batch, so a
caller writes ``loss = head(x, y) + intra_angular_penalty(...)``. The paper found neither gives a
gain on top of ArcFace; they are here for ablations. Angles use :func:`angle_from_cos`, so
gradients stay finite when vectors coincide.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from partialfc.losses.margins import angle_from_cos

__all__ = ["intra_angular_penalty", "inter_angular_penalty"]


def intra_angular_penalty(target_cos: Tensor) -> Tensor:
    """``mean_i theta_{y_i} / pi`` from the ``(B,)`` cosines between samples and their centers."""
    if target_cos.dim() != 1:
        raise ValueError(f"target_cos must be 1-D (B,), got shape {tuple(target_cos.shape)}")
    if target_cos.numel() == 0:
        return target_cos.sum()
    return angle_from_cos(target_cos).mean() / math.pi


def inter_angular_penalty(centers: Tensor, target_rows: Tensor) -> Tensor:
    """``-mean_i 1/(pi (N-1)) sum_{j != y_i} arccos(w_{y_i} . w_j)`` over ``N`` centers.

    Args:
        centers: ``(N, d)`` class centers (normalised here).
        target_rows: ``(B,)`` row of each sample's class in ``centers``.
    """
    if centers.dim() != 2 or centers.shape[0] < 2:
        raise ValueError(f"centers must be (N, d) with N >= 2, got shape {tuple(centers.shape)}")
    if target_rows.dim() != 1:
        raise ValueError(f"target_rows must be 1-D (B,), got shape {tuple(target_rows.shape)}")
    if target_rows.numel() == 0:
        return centers.sum() * 0.0
    if bool(((target_rows < 0) | (target_rows >= centers.shape[0])).any()):
        raise ValueError(f"target_rows must be in [0, {centers.shape[0]})")
    num_centers = centers.shape[0]
    rows, counts = torch.unique(target_rows, return_counts=True)
    unit = F.normalize(centers, dim=1)
    angles = angle_from_cos(unit[rows] @ unit.T)  # (U, N)
    not_self = torch.ones_like(angles, dtype=torch.bool)
    not_self[torch.arange(len(rows)), rows] = False
    per_class = torch.where(not_self, angles, torch.zeros_like(angles)).sum(dim=1)
    per_class = per_class / (math.pi * (num_centers - 1))
    weights = counts.to(per_class.dtype) / target_rows.numel()
    return -(per_class * weights).sum()

"""Contrastive loss (Chopra, Hadsell & LeCun, CVPR 2005; Hadsell et al., CVPR 2006).

On L2-normalised embeddings with Euclidean distance ``D = |a - b|`` (in [0, 2]):

    same identity:       1/2 D^2                 (pulled to distance 0)
    different identity:  1/2 max(0, margin - D)^2 (pushed to at least ``margin``)

over every unordered pair in the batch. The two terms are averaged separately (over positive
pairs and over negative pairs) and added, so their balance does not depend on how many
identities a batch holds. ``D`` for the negative term is ``sqrt(max(D^2, eps))``, so coincident
negatives get a large but finite gradient.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from partialfc.losses.contract import Head, stats_as_floats
from partialfc.losses.triplet import squared_distances
from partialfc.losses.validation import check_embeddings_and_labels

__all__ = ["ContrastiveLoss", "ContrastiveStats"]

_SQRT_EPS = 1e-12


@dataclass(frozen=True)
class ContrastiveStats:
    """Diagnostics of one call: pair counts and the negatives still inside the margin."""

    num_positive_pairs: int
    num_negative_pairs: int
    num_active_negatives: int
    active_fraction: float  # active negatives / negative pairs


class ContrastiveLoss(Head):
    """``loss(embeddings, labels) -> scalar``; diagnostics in ``self.last_stats``.

    Args:
        margin: distance (not squared) different identities must exceed, in (0, 2].
            Default 1.0 (60 degrees apart on the unit sphere).
    """

    def __init__(self, margin: float = 1.0) -> None:
        super().__init__()
        if not isinstance(margin, (int, float)) or not math.isfinite(margin):
            raise ValueError(f"margin must be a number in (0, 2], got {margin!r}")
        if not 0 < margin <= 2:
            raise ValueError(f"margin must be in (0, 2] (unit-sphere distance), got {margin}")
        self.margin = float(margin)
        self.last_stats: ContrastiveStats | None = None

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        check_embeddings_and_labels(embeddings, labels)
        dist_sq = squared_distances(embeddings)
        upper = torch.ones_like(dist_sq, dtype=torch.bool).triu_(diagonal=1)
        same = labels.unsqueeze(0) == labels.unsqueeze(1)
        positive, negative = same & upper, ~same & upper
        pull = 0.5 * dist_sq[positive]
        gap = self.margin - dist_sq[negative].clamp_min(_SQRT_EPS).sqrt()
        push = 0.5 * gap.clamp_min(0.0).square()
        num_active = int((gap > 0).sum())
        self.last_stats = ContrastiveStats(
            pull.numel(), push.numel(), num_active, num_active / max(push.numel(), 1)
        )
        zero = dist_sq.sum() * 0.0  # keeps the graph when a term has no pairs
        pull_term = pull.mean() if pull.numel() else zero
        push_term = push.mean() if push.numel() else zero
        return pull_term + push_term

    def diagnostics(self, embeddings: Tensor, labels: Tensor, seed: int = 0) -> dict[str, float]:
        """The last call's :class:`ContrastiveStats` as floats (no parameters, no centers)."""
        return stats_as_floats(self.last_stats)

    def extra_repr(self) -> str:
        return f"margin={self.margin}"

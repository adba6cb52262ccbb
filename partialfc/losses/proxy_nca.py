"""ProxyNCA (Movshovitz-Attias et al., ICCV 2017): one learnable proxy per class.

With L2-normalised embeddings ``x`` and proxies ``p`` and ``d(x, p) = |x - p|^2 = 2 - 2 cos``:

    loss_i = -log( exp(-s d(x_i, p_y)) / sum_{z != y} exp(-s d(x_i, p_z)) )

(the target proxy is left out of the denominator, as in the paper), averaged over the batch.
``s`` (``scale``) sharpens the distribution; the paper's form is ``s = 1``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from partialfc.losses.contract import Head
from partialfc.losses.validation import check_embeddings_and_labels, check_positive_int

__all__ = ["ProxyNCALoss", "ProxyNCAStats"]


@dataclass(frozen=True)
class ProxyNCAStats:
    """Diagnostics of one call: how many samples have their own proxy as the nearest."""

    num_samples: int
    num_nearest_own_proxy: int
    nearest_own_fraction: float


class ProxyNCALoss(Head):
    """``loss(embeddings, labels) -> scalar`` with a ``(num_classes, d)`` proxy table.

    Args:
        num_classes: C >= 2.
        embedding_dim: d >= 1.
        scale: multiplies the squared distances. Default 1.0.
    """

    def __init__(self, num_classes: int, embedding_dim: int, scale: float = 1.0) -> None:
        super().__init__()
        check_positive_int("num_classes", num_classes)
        check_positive_int("embedding_dim", embedding_dim)
        if num_classes < 2:
            raise ValueError(f"num_classes must be >= 2 to have a denominator, got {num_classes}")
        if not isinstance(scale, (int, float)) or not math.isfinite(scale) or scale <= 0:
            raise ValueError(f"scale must be a finite number > 0, got {scale!r}")
        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.scale = float(scale)
        self.proxies = nn.Parameter(torch.randn(num_classes, embedding_dim))
        self.last_stats: ProxyNCAStats | None = None

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        check_embeddings_and_labels(embeddings, labels, self.embedding_dim, self.num_classes)
        cos = F.normalize(embeddings, dim=1) @ F.normalize(self.proxies, dim=1).T
        neg_dist = -self.scale * (2.0 - 2.0 * cos)  # (B, C) logits
        labels = labels.long()
        target = neg_dist.gather(1, labels.unsqueeze(1)).squeeze(1)
        others = neg_dist.scatter(1, labels.unsqueeze(1), float("-inf"))
        losses = torch.logsumexp(others, dim=1) - target
        nearest = int((neg_dist.argmax(dim=1) == labels).sum())
        self.last_stats = ProxyNCAStats(labels.numel(), nearest, nearest / max(labels.numel(), 1))
        return losses.mean()

    def class_centers(self) -> Tensor:
        """The ``(C, d)`` proxies, float32 copy."""
        return self.proxies.detach().float().clone()

    def diagnostics(self, embeddings: Tensor, labels: Tensor, seed: int = 0) -> dict[str, float]:
        """APCS / AMNCS / MICS over the proxies, and the last call's nearest-own-proxy share."""
        out = super().diagnostics(embeddings, labels, seed)
        if self.last_stats is not None:
            out["nearest_own_fraction"] = float(self.last_stats.nearest_own_fraction)
        return out

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_dim={self.embedding_dim}, "
            f"scale={self.scale}"
        )

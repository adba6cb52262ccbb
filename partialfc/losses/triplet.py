"""Triplet loss on the unit sphere with online mining (FaceNet, Schroff et al.,
CVPR 2015; batch-hard and soft margin: Hermans et al., arXiv 1703.07737).

Embeddings are L2-normalised, distances are squared Euclidean, ``d = |a - b|^2 = 2 - 2 cos``,
and a triplet (anchor a, positive p, negative n) costs

    hinge:        max(0, d_ap - d_an + alpha)          (alpha = ``margin``, default 0.2)
    soft margin:  ln(1 + exp(d_ap - d_an))             (Hermans et al.; no alpha)

Mining (``mining=``), all inside the batch and all in O(B^2) memory (never a B x B x B tensor):

* ``"all"`` — every valid triplet. The loss is linear in (d_ap, d_an) on each triplet, so the
  forward pass walks anchor-positive pairs in chunks and accumulates the exact ``(B, B)``
  gradient with respect to the distance matrix; nothing per-triplet is kept.
* ``"semihard"`` — FaceNet: for every anchor-positive pair, the hardest negative inside the
  band ``d_ap < d_an < d_ap + alpha``; if the band is empty, the hardest negative of that anchor
  (so the pair still contributes instead of emitting zero).
* ``"batch_hard"`` — for every anchor, its farthest positive and its nearest negative.

With the hinge, the loss is the mean over active triplets (loss > 0) when
``average_over_active`` (default), else over all mined triplets; the soft margin never reaches
zero, so it always averages over all mined triplets (its "active" count is ``d_ap > d_an``).
Diagnostics of the last call are in ``self.last_stats`` (:class:`TripletStats`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import Tensor
from torch.autograd.function import once_differentiable

from partialfc.losses.contract import Head, stats_as_floats
from partialfc.losses.validation import check_embeddings_and_labels

__all__ = ["TripletLoss", "TripletStats", "Triplets", "squared_distances"]

Mining = Literal["all", "semihard", "batch_hard"]
_CHUNK_ELEMENTS = 1 << 22  # (pairs x B) elements per chunk: 16 MiB of float32


@dataclass(frozen=True)
class TripletStats:
    """Diagnostics of one call: mined triplets, active ones (loss > 0), and their fraction."""

    num_triplets: int
    num_active: int
    active_fraction: float
    num_semihard: int = 0  # semihard mining: pairs whose negative came from the band


@dataclass(frozen=True)
class Triplets:
    """Mined index triplets ``(anchors[i], positives[i], negatives[i])``."""

    anchors: Tensor
    positives: Tensor
    negatives: Tensor
    in_band: Tensor  # bool: negative from the semi-hard band (False: fallback / batch-hard)


def squared_distances(embeddings: Tensor) -> Tensor:
    """``(B, B)`` squared Euclidean distances between the L2-normalised rows: ``2 - 2 cos``."""
    unit = F.normalize(embeddings, dim=1)
    return (2.0 - 2.0 * (unit @ unit.T)).clamp_min(0.0)


def _pair_chunks(num_pairs: int, batch: int):
    step = max(1, _CHUNK_ELEMENTS // max(1, batch))
    for start in range(0, num_pairs, step):
        yield start, min(start + step, num_pairs)


class _AllTriplets(torch.autograd.Function):
    """Sum over all valid triplets of the hinge / soft-margin loss, from the distance matrix."""

    @staticmethod
    def forward(ctx, dist, anchors, positives, negative_mask, margin, soft):
        batch = dist.shape[0]
        grad = torch.zeros_like(dist)
        total = dist.new_zeros(())
        num_active = 0
        for start, stop in _pair_chunks(anchors.numel(), batch):
            a, p = anchors[start:stop], positives[start:stop]
            x = dist[a, p].unsqueeze(1) - dist[a]  # (chunk, B): d_ap - d_an
            valid = negative_mask[a]
            if soft:
                active = valid & (x > 0)
                loss = torch.where(valid, F.softplus(x), 0.0)
                weight = torch.where(valid, torch.sigmoid(x), 0.0)
            else:
                x = x + margin
                active = valid & (x > 0)
                weight = active.to(dist.dtype)
                loss = x * weight
            total += loss.sum()
            num_active += int(active.sum())
            # d/d d_ap = +weight summed over negatives; d/d d_an = -weight summed over positives
            grad.index_put_((a, p), weight.sum(dim=1), accumulate=True)
            grad.index_add_(0, a, -weight)
        ctx.save_for_backward(grad)
        count = torch.tensor(num_active)
        ctx.mark_non_differentiable(count)
        return total, count

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_total, _grad_count):
        (grad,) = ctx.saved_tensors
        return grad * grad_total, None, None, None, None, None


class TripletLoss(Head):
    """Triplet loss on the unit sphere: ``loss(embeddings, labels) -> scalar``.

    Args:
        margin: alpha, in squared-distance units (the sphere's squared diameter is 4).
            Default 0.2.
        mining: ``"all"``, ``"semihard"`` (default) or ``"batch_hard"``; see the module doc.
        soft_margin: use ``ln(1 + e^(d_ap - d_an))`` instead of the hinge (``margin`` then only
            shapes the semi-hard band). Default False.
        average_over_active: with the hinge, average over triplets with non-zero loss (default
            True) rather than over all mined triplets.
    """

    def __init__(
        self,
        margin: float = 0.2,
        mining: Mining = "semihard",
        soft_margin: bool = False,
        average_over_active: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(margin, (int, float)) or not math.isfinite(margin) or margin < 0:
            raise ValueError(f"margin must be a finite number >= 0, got {margin!r}")
        if mining not in ("all", "semihard", "batch_hard"):
            raise ValueError(f"mining must be 'all', 'semihard' or 'batch_hard', got {mining!r}")
        self.margin = float(margin)
        self.mining = mining
        self.soft_margin = bool(soft_margin)
        self.average_over_active = bool(average_over_active)
        self.last_stats: TripletStats | None = None

    # ------------------------------------------------------------------ mining
    @staticmethod
    def _masks(labels: Tensor) -> tuple[Tensor, Tensor]:
        same = labels.unsqueeze(0) == labels.unsqueeze(1)
        positive = same.clone()
        positive.fill_diagonal_(False)
        return positive, ~same

    def _mine_semihard(self, dist: Tensor, positive: Tensor, negative: Tensor) -> Triplets:
        # Sort each anchor's negative distances once (non-negatives at +inf, so last); the
        # hardest semi-hard negative of pair (a, p) is then the first sorted d_an > d_ap, found
        # by binary search in row a: O(B^2 log B) time, O(B^2) memory.
        inf = torch.tensor(float("inf"), dtype=dist.dtype, device=dist.device)
        sorted_neg, order = torch.where(negative, dist, inf).sort(dim=1)
        anchors, positives = (positive & negative.any(dim=1, keepdim=True)).nonzero(as_tuple=True)
        d_ap = dist[anchors, positives]
        # one row of queries per anchor: pair k is the rank-th positive of its anchor
        per_anchor = torch.bincount(anchors, minlength=dist.shape[0])
        starts = torch.cumsum(per_anchor, 0) - per_anchor
        rank = torch.arange(anchors.numel(), device=dist.device) - starts[anchors]
        width = int(per_anchor.max()) if anchors.numel() else 1
        queries = torch.full(
            (dist.shape[0], width), float("inf"), dtype=dist.dtype, device=dist.device
        )
        queries[anchors, rank] = d_ap
        first_above = torch.searchsorted(sorted_neg, queries, right=True)[anchors, rank]
        first_above.clamp_max_(dist.shape[1] - 1)
        candidate = sorted_neg[anchors, first_above]
        in_band = (candidate > d_ap) & (candidate < d_ap + self.margin)
        band_pick = order[anchors, first_above]
        negatives = torch.where(in_band, band_pick, order[anchors, 0])  # fallback: hardest
        return Triplets(anchors, positives, negatives, in_band)

    @staticmethod
    def _mine_batch_hard(dist: Tensor, positive: Tensor, negative: Tensor) -> Triplets:
        usable = positive.any(dim=1) & negative.any(dim=1)
        anchors = usable.nonzero(as_tuple=True)[0]
        d = dist[anchors]
        positives = torch.where(positive[anchors], d, -1.0).argmax(dim=1)
        negatives = torch.where(negative[anchors], d, float("inf")).argmin(dim=1)
        return Triplets(anchors, positives, negatives, torch.zeros_like(anchors, dtype=torch.bool))

    @torch.no_grad()
    def mine(self, embeddings: Tensor, labels: Tensor) -> Triplets:
        """The triplets ``"semihard"`` / ``"batch_hard"`` mining selects (no gradient)."""
        if self.mining == "all":
            raise ValueError("mining='all' uses every valid triplet; there is no selection")
        check_embeddings_and_labels(embeddings, labels)
        dist = squared_distances(embeddings)
        positive, negative = self._masks(labels)
        if self.mining == "semihard":
            return self._mine_semihard(dist, positive, negative)
        return self._mine_batch_hard(dist, positive, negative)

    # ------------------------------------------------------------------ loss
    def _reduce(self, total: Tensor, num_triplets: int, num_active: int) -> Tensor:
        use_active = self.average_over_active and not self.soft_margin
        denominator = num_active if use_active else num_triplets
        return total / max(denominator, 1)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        check_embeddings_and_labels(embeddings, labels)
        dist = squared_distances(embeddings)
        positive, negative = self._masks(labels)
        if self.mining == "all":
            anchors, positives = positive.nonzero(as_tuple=True)
            num_triplets = int(negative.sum(dim=1)[anchors].sum())
            total, num_active = _AllTriplets.apply(
                dist, anchors, positives, negative, self.margin, self.soft_margin
            )
            num_active = int(num_active)
            self.last_stats = TripletStats(
                num_triplets, num_active, num_active / max(num_triplets, 1)
            )
            return self._reduce(total, num_triplets, num_active)

        with torch.no_grad():
            if self.mining == "semihard":
                triplets = self._mine_semihard(dist.detach(), positive, negative)
            else:
                triplets = self._mine_batch_hard(dist.detach(), positive, negative)
        x = dist[triplets.anchors, triplets.positives] - dist[triplets.anchors, triplets.negatives]
        if self.soft_margin:
            losses, active = F.softplus(x), x > 0
        else:
            losses = F.relu(x + self.margin)
            active = losses > 0
        num_triplets, num_active = x.numel(), int(active.sum())
        self.last_stats = TripletStats(
            num_triplets,
            num_active,
            num_active / max(num_triplets, 1),
            int(triplets.in_band.sum()),
        )
        return self._reduce(losses.sum(), num_triplets, num_active)

    def diagnostics(self, embeddings: Tensor, labels: Tensor, seed: int = 0) -> dict[str, float]:
        """The last call's :class:`TripletStats` as floats (no parameters, no centers)."""
        return stats_as_floats(self.last_stats)

    def extra_repr(self) -> str:
        return f"margin={self.margin}, mining={self.mining!r}, soft_margin={self.soft_margin}"

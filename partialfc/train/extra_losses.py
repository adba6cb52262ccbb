"""Extra loss terms added to the classifier loss of a training step.

A term is any object with a ``name`` and ``__call__(ctx: StepContext) -> LossTerm``; the
Trainer adds each term's (already weighted) loss to ``classifier_weight · L_head`` and logs
its diagnostics under its name in ``metrics.jsonl``::

    L = classifier_weight · head(e, y) + Σ_terms term(ctx).loss

Terms see the embeddings after the fp16 gradient scale, so mixed precision needs nothing from
them; each returns a mean over this rank's batch, which DDP's gradient average turns into the
global mean. Terms must not step optimizers or change parameters (the Trainer does that).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from torch import Tensor


@dataclass
class StepContext:
    """What a term may read in one step (all on the training device)."""

    images: Tensor  # normalised batch (B, C, H, W), as the backbone saw it
    embeddings: Tensor  # float32 (B, d) backbone output, with gradient
    labels: Tensor  # (B,) long
    head: object  # the loss head (Head: class_centers(), angular_margin(); never its forward)
    step: int  # optimizer steps already taken
    indices: Tensor | None = None  # (B,) long: the samples' dataset indices (per-sample targets)


@dataclass
class LossTerm:
    """A weighted scalar loss and named float diagnostics (logged as window means)."""

    loss: Tensor
    diagnostics: dict[str, float] = field(default_factory=dict)


class ExtraLoss(Protocol):
    name: str

    def __call__(self, ctx: StepContext) -> LossTerm: ...


class TripletTerm:
    """``weight · TripletLoss(e, y)`` (FaceNet, Schroff et al., CVPR 2015) with its active fraction
    as a diagnostic.

    Args:
        weight: multiplier of the triplet loss; default 1.0.
        margin: alpha in squared-distance units on the unit sphere; default 0.2.
        mining: ``"semihard"`` (default), ``"batch_hard"`` or ``"all"``.
    """

    name = "triplet"

    def __init__(self, weight: float = 1.0, margin: float = 0.2, mining: str = "semihard"):
        from partialfc.losses.triplet import TripletLoss

        self.weight = float(weight)
        self.loss_fn = TripletLoss(margin=margin, mining=mining)

    def __call__(self, ctx: StepContext) -> LossTerm:
        loss = self.loss_fn(ctx.embeddings, ctx.labels)
        stats = self.loss_fn.last_stats
        return LossTerm(
            self.weight * loss,
            {
                "loss": float(loss.detach()),
                "active_fraction": stats.active_fraction,
                "num_triplets": float(stats.num_triplets),
            },
        )


__all__ = ["ExtraLoss", "LossTerm", "StepContext", "TripletTerm"]

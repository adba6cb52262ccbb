"""Training a network as the complement of a fixed embedder it will be fused with.

A network that is fused at test time with a fixed descriptor ``d`` by the cosine of
``[ê, √w · d̂]``, i.e. ``cos_f = (cos_net + w · cos_d) / (1 + w)``, can be trained on that fused
cosine instead of its own: the margin-softmax of the fused cosine to each class (ArcFace, Deng
et al., CVPR 2019) gives small gradients on the samples the descriptor already separates and
large ones where it fails, as boosting reweights the examples a fixed learner gets wrong
(Friedman, Annals of Statistics 2001). :class:`ComplementaryMarginTerm` adds that loss to the
network's own classifier loss (a Trainer extra loss)::

    L_c = − log softmax_y( s · [ f(cos_f(i, y)),  cos_f(i, c ≠ y) ] )
    cos_f(i, c) = (ê_i · Ŵ_c + w · d̂_i · D̂_c^(−i)) / (1 + w)

with ``f`` the head's margin (its warm-up included), ``Ŵ`` the head's current unit centers
(a detached copy: the head's own loss moves them), ``D̂_c`` the unit sum of the class's unit
descriptors and ``D̂_y^(−i)`` that sum without the sample itself (a class center that contains
the sample would call it separated whenever the class is small).

The descriptor values of the training images must be those of images the descriptor was not
fitted on (a descriptor whitened on the training people separates them far better than new
people): :func:`out_of_fold_embeddings` fits it on all people but one group and embeds that
group, for each group in turn.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from partialfc.train.extra_losses import LossTerm, StepContext


def out_of_fold_embeddings(
    fit_and_embed: Callable[[np.ndarray, np.ndarray], np.ndarray],
    labels: np.ndarray,
    num_groups: int = 4,
    seed: int = 0,
) -> np.ndarray:
    """``(N, d)`` embeddings of every sample by a model fitted without its person.

    The people (distinct ``labels``) are dealt into ``num_groups`` groups at random (``seed``);
    for each group, ``fit_and_embed(train_rows, embed_rows)`` fits on the samples of the other
    groups (row indices into the caller's arrays) and returns the embeddings of ``embed_rows``.
    Each group's rows are embedded by a different fit, so only cosines within a group are
    comparable as the final fit's are. Default 4 groups.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ValueError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    people = np.unique(labels)
    if not 2 <= num_groups <= people.size:
        raise ValueError(
            f"num_groups must be in 2..{people.size} (the number of people), got {num_groups}"
        )
    order = np.random.default_rng(seed).permutation(people)
    group_of_person = np.empty(people.size, dtype=np.int64)
    group_of_person[np.searchsorted(people, order)] = np.arange(people.size) % num_groups
    group = group_of_person[np.searchsorted(people, labels)]
    out = None
    for g in range(num_groups):
        embed_rows, train_rows = np.flatnonzero(group == g), np.flatnonzero(group != g)
        part = np.asarray(fit_and_embed(train_rows, embed_rows))
        if part.ndim != 2 or part.shape[0] != embed_rows.size:
            raise ValueError(
                f"fit_and_embed returned shape {part.shape} for {embed_rows.size} rows "
                f"(group {g}); expected ({embed_rows.size}, d)"
            )
        if out is None:
            out = np.zeros((labels.size, part.shape[1]), dtype=part.dtype)
        out[embed_rows] = part
    return out


class ComplementaryMarginTerm:
    """Trainer extra loss: ``weight · L_c`` (module docstring), the margin-softmax of the
    cosine fused with a fixed descriptor.

    Args:
        descriptors: ``(N, d)`` the descriptor of every training sample, indexed like the
            training set (out of fold: :func:`out_of_fold_embeddings`); normalised here.
        labels: ``(N,)`` class of every sample, ``0..C−1`` as the head's classes.
        num_classes: C, the head's classes.
        descriptor_weight: ``w`` ≥ 0 of the fused cosine; default 3.0.
        weight: multiplier of the loss; default 1.0.

    The network's embedding enters ``cos_f`` with the factor ``1 / (1 + w)``, so at equal
    ``weight`` the term moves the network a quarter as much as its classifier loss for
    ``w = 3``. The head must have one center a class (``num_subcenters = 1``).
    """

    name = "complementary"

    def __init__(
        self,
        descriptors: Tensor | np.ndarray,
        labels: Tensor | np.ndarray,
        num_classes: int,
        descriptor_weight: float = 3.0,
        weight: float = 1.0,
    ):
        units = F.normalize(torch.as_tensor(np.asarray(descriptors), dtype=torch.float32), dim=1)
        labels = torch.as_tensor(np.asarray(labels), dtype=torch.long)
        if units.ndim != 2 or labels.shape != (units.shape[0],):
            raise ValueError(
                f"descriptors {tuple(units.shape)} and labels {tuple(labels.shape)} must be "
                "(N, d) and (N,)"
            )
        if labels.numel() and (labels.min() < 0 or labels.max() >= num_classes):
            raise ValueError(f"labels must be in 0..{num_classes - 1}")
        for name, value in (("descriptor_weight", descriptor_weight), ("weight", weight)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value}")
        self.units, self.labels = units, labels
        self.class_sums = torch.zeros(num_classes, units.shape[1]).index_add_(0, labels, units)
        self.class_units = F.normalize(self.class_sums, dim=1)  # D̂_c, fixed: computed once
        self.descriptor_weight = float(descriptor_weight)
        self.weight = float(weight)

    def descriptor_cosines(self, indices: Tensor) -> Tensor:
        """``(B, C)``: ``d̂_i · D̂_c`` of the samples ``indices``, the own class's center without
        the sample (0 where the sample is its class's only one)."""
        indices = indices.cpu().long()
        units, labels = self.units[indices], self.labels[indices]
        own_sum = self.class_sums[labels] - units
        cos = units @ self.class_units.T
        own = (units * own_sum).sum(1) / own_sum.norm(dim=1).clamp_min(1e-12)
        return cos.scatter(1, labels.unsqueeze(1), own.unsqueeze(1))

    def __call__(self, ctx: StepContext) -> LossTerm:
        if ctx.indices is None:
            raise ValueError("ComplementaryMarginTerm needs the batch's dataset indices")
        margin = ctx.head.angular_margin()
        centers = ctx.head.class_centers()
        if centers.shape[0] != self.class_sums.shape[0]:
            raise ValueError(
                f"the head has {centers.shape[0]} center rows for {self.class_sums.shape[0]} "
                "classes; the complementary term needs one center a class"
            )
        embeddings = ctx.embeddings  # float32 or wider (fp16/bf16 promoted)
        work = torch.promote_types(embeddings.dtype, torch.float32)
        unit = F.normalize(embeddings.to(work), dim=1)
        cos_net = unit @ F.normalize(centers.to(unit), dim=1).T
        cos_d = self.descriptor_cosines(ctx.indices).to(unit)
        w = self.descriptor_weight
        fused = (cos_net + w * cos_d) / (1.0 + w)
        labels = ctx.labels.to(unit.device)
        logits = margin(fused, labels) if margin is not None else fused
        loss = F.cross_entropy(logits, labels)
        with torch.no_grad():
            hit = (fused.argmax(1) == labels).float().mean()
        return LossTerm(self.weight * loss, {"loss": float(loss.detach()), "top1": float(hit)})


__all__ = ["ComplementaryMarginTerm", "out_of_fold_embeddings"]

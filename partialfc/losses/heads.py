"""Dense classification heads: embeddings + labels -> loss (NormFace, Wang et al., ACM MM
2017; SphereFace, Liu et al., CVPR 2017; CosFace, Wang et al., CVPR 2018; ArcFace, Deng et al.,
CVPR 2019).

* :class:`MarginSoftmaxHead` — normalised embeddings against normalised class (sub-)centers,
  ``logits = margin(cos, target)`` (ArcFace, CosFace, SphereFace, NormFace, combined), optional
  K sub-centers per class (max over K before the margin) and the ArcFace-paper angular add-ons.
* :class:`SoftmaxHead` — the plain, un-normalised linear layer with bias (the baseline).

Both share one call signature: ``head(embeddings, labels) -> mean cross-entropy`` and
``head.logits(embeddings, labels) -> (B, N)``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.autograd.function import once_differentiable

from partialfc.losses.contract import Head
from partialfc.losses.gemm_precision import (
    GemmPrecision,
    check_gemm_path,
    gemm_precision,
    matmul,
    parse_compute_dtype,
)
from partialfc.losses.margin_softmax import margin_cross_entropy, normalized_margin_cross_entropy
from partialfc.losses.margins import CombinedMargin, angle_from_cos
from partialfc.losses.penalties import inter_angular_penalty, intra_angular_penalty
from partialfc.losses.subcenter import max_over_subcenters
from partialfc.losses.validation import check_embeddings_and_labels, check_positive_int

__all__ = ["MarginSoftmaxHead", "SoftmaxHead", "SubcenterAssignment"]


class _UnitRows(torch.autograd.Function):
    """Rows scaled to unit L2 norm, as ``F.normalize(matrix, dim=1)`` with fewer passes:
    forward ``u = w r``, ``r = 1 / max(|w|, eps)``; backward ``r (g - u <u, g>)``."""

    @staticmethod
    def forward(ctx, matrix: Tensor, eps: float) -> Tensor:
        norms = torch.linalg.vector_norm(matrix, dim=1, keepdim=True)
        inv_norms = norms.clamp_min(eps).reciprocal_()
        unit = matrix * inv_norms
        ctx.save_for_backward(unit, inv_norms, norms >= eps)
        return unit

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_unit: Tensor):
        unit, inv_norms, projected = ctx.saved_tensors
        along = torch.linalg.vecdot(unit, grad_unit, dim=1).unsqueeze(1) * projected
        grad = torch.addcmul(grad_unit, unit, along, value=-1.0)
        return grad.mul_(inv_norms), None


def _work_dtype(*tensors: Tensor) -> torch.dtype:
    """The dtype the head computes in: the inputs' common dtype, at least float32 (bfloat16 and
    float16 embeddings are widened, as in :func:`normalized_margin_cross_entropy`)."""
    dtype = torch.float32
    for t in tensors:
        dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _unit_rows(matrix: Tensor, eps: float = 1e-12) -> Tensor:
    if matrix.requires_grad and torch.is_grad_enabled():
        return _UnitRows.apply(matrix, eps)
    return F.normalize(matrix, dim=1, eps=eps)


@dataclass(frozen=True)
class SubcenterAssignment:
    """Per-sample dominant sub-center of the labelled class and the angle to it.

    Attributes:
        subcenter: ``(B,)`` long, index ``k`` in ``[0, K)`` of the closest sub-center.
        cos: ``(B,)`` cosine to that sub-center.
        angle_rad: ``(B,)`` angle in radians.
        angle_deg: ``(B,)`` angle in degrees (the cleaning recipe drops samples past 75 deg).
    """

    subcenter: Tensor
    cos: Tensor
    angle_rad: Tensor
    angle_deg: Tensor


class MarginSoftmaxHead(Head):
    """Margin-softmax over ``num_classes`` classes with ``num_subcenters`` centers each.

    ``loss = CE(margin(max_k cos(x, w_ck), y)) + intra_weight L_intra + inter_weight L_inter``

    Args:
        num_classes: C >= 1.
        embedding_dim: d >= 1.
        margin: a :class:`CombinedMargin` (e.g. ``ArcFaceMargin(0.5, 64.0)``).
        num_subcenters: K >= 1 (Sub-center ArcFace uses 3). Default 1.
        intra_weight: weight of the ArcFace-paper intra penalty ``theta_y / pi`` (L5). Default 0.
        inter_weight: weight of the inter penalty (L6), ``K = 1`` only. Default 0.
        reuse_buffers: the backward pass overwrites the forward's ``(B, C)`` buffer (one
            allocation fewer; the graph can then be differentiated once). Default True; set
            False for ``retain_graph`` or ``gradcheck``.
        compute_dtype: operand precision of the cosine GEMM and its two gradient GEMMs:
            ``"float32"`` (default), ``"bfloat16"`` or ``"float16"`` (GPU only), with float32
            accumulation; margin, softmax and loss stay float32
            (:mod:`partialfc.losses.gemm_precision`).
        gemm_path: ``"auto"`` (default), ``"native"`` or ``"emulated"``; see
            :func:`~partialfc.losses.gemm_precision.gemm_precision`.

    The center table ``weight`` is ``(C*K, d)``, class-major (rows ``c*K .. c*K+K-1`` are class
    c), initialised N(0, 0.01^2). Embeddings and centers are L2-normalised inside. For every K
    the math runs in the inputs' common dtype, at least float32 (bfloat16 or float16 embeddings
    from autocast are widened; the loss is float32).

    ``class_subset`` (optional, ``(N,)`` distinct class ids) restricts the columns to those
    classes, in that order; a label outside the subset gets no margin in :meth:`logits` and is
    an error in :meth:`forward`.
    """

    def __init__(
        self,
        num_classes: int,
        embedding_dim: int,
        margin: CombinedMargin,
        num_subcenters: int = 1,
        intra_weight: float = 0.0,
        inter_weight: float = 0.0,
        reuse_buffers: bool = True,
        compute_dtype="float32",
        gemm_path: str = "auto",
    ) -> None:
        super().__init__()
        parse_compute_dtype(compute_dtype)  # float16 is refused on a CPU at forward time
        check_gemm_path(gemm_path)
        check_positive_int("num_classes", num_classes)
        check_positive_int("embedding_dim", embedding_dim)
        check_positive_int("num_subcenters", num_subcenters)
        if not isinstance(margin, CombinedMargin):
            raise ValueError(f"margin must be a CombinedMargin, got {type(margin).__name__}")
        for name, value in (("intra_weight", intra_weight), ("inter_weight", inter_weight)):
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if inter_weight > 0 and num_subcenters != 1:
            raise ValueError("inter_weight > 0 needs num_subcenters=1 (one center per class)")
        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.num_subcenters = num_subcenters
        self.margin = margin
        self.intra_weight = float(intra_weight)
        self.inter_weight = float(inter_weight)
        self.reuse_buffers = bool(reuse_buffers)
        self.compute_dtype = compute_dtype
        self.gemm_path = gemm_path
        self.weight = nn.Parameter(torch.empty(num_classes * num_subcenters, embedding_dim))
        nn.init.normal_(self.weight, std=0.01)

    # ------------------------------------------------------------------ helpers
    def precision(self, device=None) -> GemmPrecision:
        """The GEMM precision on ``device`` (default: where the centers are); float16 on a
        CPU raises ``ValueError``."""
        device = self.weight.device if device is None else device
        return gemm_precision(self.compute_dtype, device, self.gemm_path)

    def _check(self, embeddings: Tensor, labels: Tensor) -> None:
        check_embeddings_and_labels(embeddings, labels, self.embedding_dim, self.num_classes)

    def _center_rows(self, class_subset: Tensor | None) -> Tensor:
        if class_subset is None:
            return self.weight
        if class_subset.dim() != 1 or class_subset.dtype.is_floating_point:
            raise ValueError(
                f"class_subset must be a 1-D integer tensor, got {tuple(class_subset.shape)} "
                f"{class_subset.dtype}"
            )
        if class_subset.numel() == 0:
            raise ValueError("class_subset must not be empty")
        if bool(((class_subset < 0) | (class_subset >= self.num_classes)).any()):
            raise ValueError(f"class_subset values must be in [0, {self.num_classes})")
        if torch.unique(class_subset).numel() != class_subset.numel():
            raise ValueError("class_subset must not repeat a class")
        k = self.num_subcenters
        rows = class_subset.long().unsqueeze(1) * k + torch.arange(k, device=class_subset.device)
        return self.weight[rows.reshape(-1)]

    def _target_columns(self, labels: Tensor, class_subset: Tensor | None) -> Tensor:
        if class_subset is None:
            return labels.long()
        lookup = torch.full((self.num_classes,), -1, dtype=torch.long, device=labels.device)
        lookup[class_subset.long()] = torch.arange(class_subset.numel(), device=labels.device)
        return lookup[labels.long()]

    # ------------------------------------------------------------------ public API
    def cosines(
        self, embeddings: Tensor, class_subset: Tensor | None = None
    ) -> tuple[Tensor, Tensor]:
        """``(B, N)`` cosine to each class (max over its sub-centers) and ``(B, N)`` argmax k."""
        if embeddings.dim() != 2 or embeddings.shape[1] != self.embedding_dim:
            raise ValueError(
                f"embeddings must be (B, {self.embedding_dim}), got {tuple(embeddings.shape)}"
            )
        centers = self._center_rows(class_subset)
        work = _work_dtype(embeddings, centers)
        unit_x = F.normalize(embeddings.to(work), dim=1)
        cos = matmul(unit_x, _unit_rows(centers.to(work)).T, self.precision(embeddings.device))
        return max_over_subcenters(cos, self.num_subcenters)

    def logits(
        self, embeddings: Tensor, labels: Tensor, class_subset: Tensor | None = None
    ) -> Tensor:
        """``(B, N)`` scaled logits with the margin on each row's labelled class."""
        self._check(embeddings, labels)
        cos, _ = self.cosines(embeddings, class_subset)
        return self.margin(cos, self._target_columns(labels, class_subset))

    def forward(
        self, embeddings: Tensor, labels: Tensor, class_subset: Tensor | None = None
    ) -> Tensor:
        """Mean cross-entropy over the batch (plus the weighted angular add-ons, if enabled)."""
        self._check(embeddings, labels)
        target_col = self._target_columns(labels, class_subset)
        if class_subset is not None and bool((target_col < 0).any()):
            missing = int(labels[target_col < 0][0])
            raise ValueError(f"labels contain class {missing}, which is not in class_subset")
        if self.num_subcenters == 1:  # fused normalise + GEMM + margin + softmax
            centers = self._center_rows(class_subset)
            prec = self.precision(embeddings.device)
            loss = normalized_margin_cross_entropy(
                embeddings,
                centers,
                target_col,
                self.margin,
                self.reuse_buffers,
                None if prec.is_float32 else prec,
            )
        else:
            cos, _ = self.cosines(embeddings, class_subset)
            loss = margin_cross_entropy(cos, target_col, self.margin, self.reuse_buffers)
        if self.intra_weight > 0:
            target_cos = self._labelled_cosines(embeddings, labels).amax(dim=1)
            loss = loss + self.intra_weight * intra_angular_penalty(target_cos)
        if self.inter_weight > 0:
            loss = loss + self.inter_weight * inter_angular_penalty(
                self._center_rows(class_subset), target_col
            )
        return loss

    def _labelled_cosines(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """``(B, K)`` cosines between each sample and the K sub-centers of its own class."""
        k = self.num_subcenters
        rows = labels.long().unsqueeze(1) * k + torch.arange(k, device=labels.device)
        work = _work_dtype(embeddings, self.weight)
        centers = F.normalize(self.weight[rows].to(work), dim=2)  # (B, K, d)
        return torch.einsum("bkd,bd->bk", centers, F.normalize(embeddings.to(work), dim=1))

    @torch.no_grad()
    def dominant_subcenters(self, embeddings: Tensor, labels: Tensor) -> SubcenterAssignment:
        """Closest sub-center of each sample's labelled class and the angle to it (no grad)."""
        self._check(embeddings, labels)
        best_cos, subcenter = self._labelled_cosines(embeddings, labels).max(dim=1)
        angle = angle_from_cos(best_cos)
        return SubcenterAssignment(subcenter, best_cos, angle, torch.rad2deg(angle))

    def angular_margin(self) -> CombinedMargin:
        return self.margin

    def class_centers(self) -> Tensor:
        """The ``(C * K, d)`` center table, float32 copy."""
        return self.weight.detach().float().clone()

    def extra_repr(self) -> str:
        return (
            f"num_classes={self.num_classes}, embedding_dim={self.embedding_dim}, "
            f"num_subcenters={self.num_subcenters}, compute_dtype={self.compute_dtype!r}"
        )


class SoftmaxHead(Head):
    """Plain softmax baseline: ``logits = W x + b`` on un-normalised embeddings, mean CE loss.

    Args:
        num_classes: C >= 1.
        embedding_dim: d >= 1.
    """

    def __init__(self, num_classes: int, embedding_dim: int) -> None:
        super().__init__()
        check_positive_int("num_classes", num_classes)
        check_positive_int("embedding_dim", embedding_dim)
        self.num_classes = num_classes
        self.embedding_dim = embedding_dim
        self.linear = nn.Linear(embedding_dim, num_classes, bias=True)

    def logits(self, embeddings: Tensor, labels: Tensor | None = None) -> Tensor:
        """``(B, C)`` logits; ``labels`` is accepted for a uniform signature and only checked."""
        if labels is None:
            labels = torch.zeros(embeddings.shape[0], dtype=torch.long, device=embeddings.device)
        check_embeddings_and_labels(embeddings, labels, self.embedding_dim, self.num_classes)
        return self.linear(embeddings)

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.logits(embeddings, labels), labels.long())

    def class_centers(self) -> Tensor:
        """The ``(C, d)`` rows of ``W`` (float32 copy; the bias is not part of it)."""
        return self.linear.weight.detach().float().clone()

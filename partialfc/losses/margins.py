"""Additive / multiplicative angular margins on the target cosine (SphereFace, Liu et al.,
CVPR 2017; CosFace, Wang et al., CVPR 2018; ArcFace, Deng et al., CVPR 2019).

One function of cosines, shared by the dense heads and by Partial FC:

    logits[i, j] = scale * cos[i, j]                      for j != target_col[i]
    logits[i, t] = scale * f(theta_it),  t = target_col[i], theta = arccos(cos)

with the combined margin (all angles in radians)

    f(theta) = cos(m1 * theta + m2_rad) - m3                     for theta <= theta*
    f(theta) = cos(theta) - c                                    for theta >  theta*
    theta*   = (pi - m2_rad) / m1
    c        = m3 + max(m2_rad * sin(m2_rad), 1 + cos(theta*))

Past ``theta*`` the margin branch would turn back up (cos of an angle beyond pi), so the target
logit would *reward* moving away from the center. The continuation ``cos(theta) - c`` is
decreasing, and ``c`` is the smallest shift that keeps ``f`` non-increasing across ``theta*``
(``1 + cos(theta*)``) unless ArcFace's own constant ``m * sin(m)`` is larger; for ArcFace
(m1 = 1, m3 = 0, m2 = 0.5) this reproduces its published fallback exactly: switch at
``cos(theta) <= cos(pi - 0.5) = -0.877583`` to ``cos(theta) - 0.239713``.

Numerics: the margin is computed on the B gathered target cosines only (never on the full
matrix), in float32 even for bfloat16 inputs (float64 stays float64), with
``sin(theta) = sqrt(max((1 - cos)(1 + cos), eps))`` and ``theta = atan2(sin, cos)``, so values
and gradients stay finite at |cos| = 1. Gradients are the true ones (no ``no_grad`` shortcut).
"""

from __future__ import annotations

import math
import numbers

import torch
from torch import Tensor, nn

__all__ = [
    "angle_from_cos",
    "CombinedMargin",
    "ArcFaceMargin",
    "CosFaceMargin",
    "SphereFaceMargin",
    "NormFaceMargin",
]


def _is_finite_number(x: float) -> bool:
    return isinstance(x, numbers.Real) and not isinstance(x, bool) and math.isfinite(x)


def _sin_from_cos(cos: Tensor) -> Tensor:
    eps = torch.finfo(cos.dtype).eps
    return ((1.0 - cos) * (1.0 + cos)).clamp_min(eps).sqrt()


def angle_from_cos(cos: Tensor) -> Tensor:
    """Angle in radians, ``arccos(cos)``, with finite gradients at |cos| = 1.

    Computed as ``atan2(sqrt(max(1 - cos^2, eps)), cos)`` in float32 or wider; ``cos`` is
    clamped into [-1, 1] first. Away from |cos| = 1 this equals ``torch.acos`` exactly up to
    rounding, with the same gradient ``-1 / sin(theta)``.
    """
    work = cos.to(torch.promote_types(cos.dtype, torch.float32)).clamp(-1.0, 1.0)
    return torch.atan2(_sin_from_cos(work), work)


class CombinedMargin(nn.Module):
    """Combined angular margin ``cos(m1*theta + m2_rad) - m3`` on the target class, times ``scale``.

    Args:
        m1: multiplicative angular margin (SphereFace, real-valued), ``m1 > 0``. Default 1.0.
        m2_rad: additive angular margin in radians (ArcFace), ``0 <= m2_rad < pi``. Default 0.0.
        m3: additive cosine margin (CosFace), ``0 <= m3 < 1``. Default 0.0.
        scale: logit scale ``s > 0``. Default 64.0.
        easy_margin: apply the margin only where ``cos(theta) > 0`` (the target logit is then not
            monotone at theta = pi/2; off by default).

    The attributes ``m1``, ``m2_rad``, ``m3``, ``scale`` are plain floats; schedules change them
    between steps (see :mod:`partialfc.losses.schedules`). They are re-validated at every call.
    The module has no parameters.
    """

    def __init__(
        self,
        m1: float = 1.0,
        m2_rad: float = 0.0,
        m3: float = 0.0,
        scale: float = 64.0,
        easy_margin: bool = False,
    ) -> None:
        super().__init__()
        self.m1 = m1
        self.m2_rad = m2_rad
        self.m3 = m3
        self.scale = scale
        self.easy_margin = bool(easy_margin)
        self.check_hyperparameters()

    # ------------------------------------------------------------------ hyper-parameters
    def check_hyperparameters(self) -> None:
        """Raise ``ValueError`` naming the first hyper-parameter outside its valid range."""
        if not _is_finite_number(self.m1) or self.m1 <= 0:
            raise ValueError(f"m1 must be a finite number > 0, got m1={self.m1!r}")
        if not _is_finite_number(self.m2_rad) or not 0.0 <= self.m2_rad < math.pi:
            raise ValueError(f"m2_rad must be in [0, pi) radians, got m2_rad={self.m2_rad!r}")
        if not _is_finite_number(self.m3) or not 0.0 <= self.m3 < 1.0:
            raise ValueError(f"m3 must be in [0, 1), got m3={self.m3!r}")
        if not _is_finite_number(self.scale) or self.scale <= 0:
            raise ValueError(f"scale must be a finite number > 0, got scale={self.scale!r}")

    @property
    def is_identity(self) -> bool:
        """True when no margin is active (NormFace): the output is just ``scale * cos``."""
        return self.m1 == 1.0 and self.m2_rad == 0.0 and self.m3 == 0.0

    @property
    def theta_star_rad(self) -> float:
        """Angle ``(pi - m2_rad) / m1`` past which the continuation is used (may exceed pi)."""
        return (math.pi - self.m2_rad) / self.m1

    @property
    def tail_shift(self) -> float:
        """Shift ``c`` of the continuation ``cos(theta) - c`` past ``theta_star_rad``."""
        return self.m3 + max(
            self.m2_rad * math.sin(self.m2_rad), 1.0 + math.cos(self.theta_star_rad)
        )

    # ------------------------------------------------------------------ the margin function
    def target_logit_from_angle(self, theta_rad: Tensor) -> Tensor:
        """Unscaled target logit ``f(theta)`` for angles in radians in [0, pi] (any shape).

        For plots and tests (e.g. monotonicity over [0, pi]).

        Follows the same branches as :meth:`forward` (including ``easy_margin``).
        """
        return self._margin_from_cos_sin(torch.cos(theta_rad), torch.sin(theta_rad))

    def target_logit(self, cos: Tensor) -> Tensor:
        """Unscaled target logit ``f(arccos(cos))`` for cosines (any shape), float32 or wider."""
        work = cos.to(torch.promote_types(cos.dtype, torch.float32)).clamp(-1.0, 1.0)
        return self._margin_from_cos_sin(work, _sin_from_cos(work))

    def scaled_target_logit(self, cos: Tensor) -> Tensor:
        """``scale * f(arccos(cos))`` of target cosines (any shape), float32 or wider: the
        values :meth:`forward` writes on the target columns, without the other columns."""
        self.check_hyperparameters()
        if self.is_identity:
            return cos.to(torch.promote_types(cos.dtype, torch.float32)) * self.scale
        return self.target_logit(cos) * self.scale

    def _margin_from_cos_sin(self, cos: Tensor, sin: Tensor) -> Tensor:
        theta = torch.atan2(sin, cos)
        margin_branch = torch.cos(self.m1 * theta + self.m2_rad) - self.m3
        if self.theta_star_rad < math.pi:
            tail = cos - self.tail_shift
            out = torch.where(theta <= self.theta_star_rad, margin_branch, tail)
        else:
            out = margin_branch
        if self.easy_margin:
            out = torch.where(cos > 0, out, cos)
        return out

    # ------------------------------------------------------------------ forward
    def forward(self, cos: Tensor, target_col: Tensor) -> Tensor:
        """Scaled logits with the margin on each row's target column.

        Args:
            cos: ``(B, N)`` cosines in [-1, 1] (any float dtype).
            target_col: ``(B,)`` integer column of each row's class in ``cos``, or -1 when the
                row's class is not among the columns (that row then gets no margin).

        Returns:
            ``(B, N)`` logits, float32 for half/bfloat16 input, else the input dtype.
        """
        self.check_hyperparameters()
        if cos.dim() != 2:
            raise ValueError(f"cos must be 2-D (B, N), got shape {tuple(cos.shape)}")
        if not cos.is_floating_point():
            raise ValueError(f"cos must be a floating tensor, got dtype {cos.dtype}")
        if target_col.dim() != 1 or target_col.shape[0] != cos.shape[0]:
            raise ValueError(
                f"target_col must have shape ({cos.shape[0]},) to match cos {tuple(cos.shape)}, "
                f"got {tuple(target_col.shape)}"
            )
        if target_col.dtype.is_floating_point or target_col.dtype == torch.bool:
            raise ValueError(f"target_col must be an integer tensor, got dtype {target_col.dtype}")
        num_cols = cos.shape[1]
        if target_col.numel() and bool(((target_col < -1) | (target_col >= num_cols)).any()):
            bad = target_col[(target_col < -1) | (target_col >= num_cols)][0].item()
            raise ValueError(f"target_col values must be in [-1, {num_cols}), got {bad}")

        out_dtype = torch.promote_types(cos.dtype, torch.float32)
        logits = cos.to(out_dtype) * self.scale
        if self.is_identity or cos.shape[0] == 0 or num_cols == 0:
            return logits

        target_col = target_col.long()
        has_target = target_col >= 0
        index = target_col.clamp_min(0).unsqueeze(1)
        target_cos = cos.gather(1, index).squeeze(1).to(out_dtype)
        margined = self.target_logit(target_cos) * self.scale
        unchanged = target_cos * self.scale
        logits.scatter_(1, index, torch.where(has_target, margined, unchanged).unsqueeze(1))
        return logits

    def extra_repr(self) -> str:
        return (
            f"m1={self.m1}, m2_rad={self.m2_rad}, m3={self.m3}, scale={self.scale}, "
            f"easy_margin={self.easy_margin}"
        )


class ArcFaceMargin(CombinedMargin):
    """ArcFace: ``cos(theta + margin_rad)``. Defaults ``margin_rad=0.5``, ``scale=64.0``."""

    def __init__(
        self, margin_rad: float = 0.5, scale: float = 64.0, easy_margin: bool = False
    ) -> None:
        super().__init__(m1=1.0, m2_rad=margin_rad, m3=0.0, scale=scale, easy_margin=easy_margin)

    @property
    def margin_rad(self) -> float:
        return self.m2_rad

    @margin_rad.setter
    def margin_rad(self, value: float) -> None:
        self.m2_rad = value


class CosFaceMargin(CombinedMargin):
    """CosFace / AM-softmax: ``cos(theta) - margin``. Defaults ``margin=0.35``, ``scale=64.0``."""

    def __init__(self, margin: float = 0.35, scale: float = 64.0) -> None:
        super().__init__(m1=1.0, m2_rad=0.0, m3=margin, scale=scale)

    @property
    def margin(self) -> float:
        return self.m3

    @margin.setter
    def margin(self, value: float) -> None:
        self.m3 = value


class SphereFaceMargin(CombinedMargin):
    """SphereFace as re-implemented in the ArcFace paper: ``cos(m1 * theta)`` with real-valued
    ``m1`` via arccos (not the integer-m Chebyshev form). Defaults ``m1=1.35``, ``scale=64.0``."""

    def __init__(self, m1: float = 1.35, scale: float = 64.0) -> None:
        super().__init__(m1=m1, m2_rad=0.0, m3=0.0, scale=scale)


class NormFaceMargin(CombinedMargin):
    """NormFace: no margin, ``scale * cos(theta)``. Default ``scale=64.0``."""

    def __init__(self, scale: float = 64.0) -> None:
        super().__init__(m1=1.0, m2_rad=0.0, m3=0.0, scale=scale)

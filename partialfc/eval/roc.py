"""ROC from genuine and impostor scores, with ties handled exactly; AUC; equal error rate.

A pair is accepted when ``score >= t``. For every distinct score ``t`` (descending),
``TAR(t) = #{genuine >= t} / n_genuine`` and ``FAR(t) = #{impostor >= t} / n_impostor``
(Fawcett, Pattern Recognition Letters 2006). Tied scores move the curve diagonally in
one step, so the area under it equals the Mann–Whitney statistic with ties counted one half.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import as_scores
from .results import Result


@dataclass
class RocCurve(Result):
    """Operating points, one per distinct score plus the all-reject point at ``+inf``.

    ``true_accepts[i]`` / ``false_accepts[i]`` are the exact counts at ``thresholds[i]``.
    """

    thresholds: np.ndarray
    true_accepts: np.ndarray
    false_accepts: np.ndarray
    n_genuine: int
    n_impostor: int

    @property
    def tar(self) -> np.ndarray:
        return self.true_accepts / self.n_genuine

    @property
    def far(self) -> np.ndarray:
        return self.false_accepts / self.n_impostor

    @property
    def frr(self) -> np.ndarray:
        # from the rejected count, not 1 - TAR: the subtraction rounds, so FAR = FRR points
        # (e.g. 2/3 vs 1 - 1/3) would compare unequal
        return (self.n_genuine - self.true_accepts) / self.n_genuine

    @property
    def auc(self) -> float:
        """Trapezoidal area under (FAR, TAR); equals P(genuine > impostor) + ½ P(tie)."""
        tar, far = self.tar, self.far
        return float(np.sum(np.diff(far) * (tar[1:] + tar[:-1])) / 2.0)

    def to_dict(self):
        out = super().to_dict()
        out["auc"] = self.auc
        return out


def roc_curve(genuine, impostor) -> RocCurve:
    """Exact ROC of ``genuine`` vs ``impostor`` scores (1-D arrays of finite floats)."""
    gen = np.sort(as_scores(genuine, "genuine"))
    imp = np.sort(as_scores(impostor, "impostor"))
    thresholds = np.unique(np.concatenate([gen, imp]))[::-1]
    # count >= t  ==  n - (number strictly below t)
    true_accepts = gen.size - np.searchsorted(gen, thresholds, side="left")
    false_accepts = imp.size - np.searchsorted(imp, thresholds, side="left")
    return RocCurve(
        thresholds=np.concatenate([[np.inf], thresholds]),
        true_accepts=np.concatenate([[0], true_accepts]).astype(np.int64),
        false_accepts=np.concatenate([[0], false_accepts]).astype(np.int64),
        n_genuine=int(gen.size),
        n_impostor=int(imp.size),
    )


def roc_auc(genuine, impostor) -> float:
    """Area under the exact ROC (see :func:`roc_curve`)."""
    return roc_curve(genuine, impostor).auc


@dataclass
class EqualErrorRate(Result):
    """The point where FAR = FRR.

    ``eer`` is where the ROC's straight segment crosses FAR = FRR (exact when an operating
    point has FAR = FRR). ``threshold`` is the highest score threshold at or past the crossing,
    and ``far``/``frr`` with their counts are what that threshold actually achieves.
    """

    eer: float
    threshold: float
    far: float
    frr: float
    false_accepts: int
    false_rejects: int
    n_genuine: int
    n_impostor: int


def equal_error_rate(genuine=None, impostor=None, *, roc: RocCurve | None = None) -> EqualErrorRate:
    """EER from scores (or from a precomputed ``roc``)."""
    if roc is None:
        roc = roc_curve(genuine, impostor)
    far, frr = roc.far, roc.frr
    # FAR rises and FRR falls as the threshold goes down: first point with FAR >= FRR.
    i = int(np.argmax(far >= frr))
    if far[i] == frr[i] or i == 0:
        eer = float(far[i])
    else:
        # crossing of the segment (far[i-1], frr[i-1]) -> (far[i], frr[i]) with FAR = FRR
        d0 = frr[i - 1] - far[i - 1]
        d1 = far[i] - frr[i]
        w = d0 / (d0 + d1)
        eer = float(far[i - 1] + w * (far[i] - far[i - 1]))
    return EqualErrorRate(
        eer=eer,
        threshold=float(roc.thresholds[i]),
        far=float(far[i]),
        frr=float(frr[i]),
        false_accepts=int(roc.false_accepts[i]),
        false_rejects=int(roc.n_genuine - roc.true_accepts[i]),
        n_genuine=roc.n_genuine,
        n_impostor=roc.n_impostor,
    )

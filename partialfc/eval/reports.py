"""Protocol-level results: a verification or identification report with every count behind it.

``verification_report`` bundles the exact ROC, AUC, EER, TAR at each resolvable FAR (FARs the
impostor count cannot resolve are listed, not silently dropped) and optionally k-fold
accuracy. ``identification_report`` bundles CMC and open-set FNIR@FPIR.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .accuracy import KFoldAccuracy, kfold_accuracy
from .identification import (
    CmcCurve,
    MatedSearch,
    OpenSetPoint,
    cmc_from_ranks,
    mated_search,
    open_set_identification,
)
from .pair_scoring import PairScoreSummary
from .results import Result
from .roc import EqualErrorRate, RocCurve, equal_error_rate, roc_curve
from .tar_at_far import TarAtFar, tar_at_far

DEFAULT_FARS = (1e-6, 1e-5, 1e-4, 1e-3, 1e-2, 1e-1)


def roc_points(roc: RocCurve, max_points: int = 200) -> list[dict]:
    """At most ``max_points`` ROC operating points, log-spaced in FAR (for JSON and plots)."""
    far = roc.far
    keep = np.unique(
        np.concatenate(
            [
                np.searchsorted(far, np.geomspace(1.0 / max(roc.n_impostor, 1), 1.0, max_points)),
                [0, far.size - 1],
            ]
        ).clip(0, far.size - 1)
    )
    return [
        {
            "threshold": float(roc.thresholds[i]),
            "far": float(far[i]),
            "tar": float(roc.tar[i]),
            "false_accepts": int(roc.false_accepts[i]),
            "true_accepts": int(roc.true_accepts[i]),
        }
        for i in keep
    ]


@dataclass
class VerificationReport(Result):
    name: str
    n_genuine: int
    n_impostor: int
    auc: float
    eer: EqualErrorRate
    tar_at_far: list[TarAtFar]
    unresolved: list[str]  # FARs refused, with the reason
    kfold_accuracy: KFoldAccuracy | None = None
    notes: list[str] = field(default_factory=list)
    roc: RocCurve | None = field(default=None, repr=False)

    def to_dict(self):
        roc, self.roc = self.roc, None  # the full curve can hold millions of points
        try:
            out = super().to_dict()
        finally:
            self.roc = roc
        out["roc"] = roc_points(roc) if roc is not None else None
        return out


def verification_report(
    name: str,
    genuine=None,
    impostor=None,
    *,
    fars=DEFAULT_FARS,
    is_genuine=None,
    scores=None,
    folds=None,
    n_folds: int | None = None,
    summary: PairScoreSummary | None = None,
    notes=(),
) -> VerificationReport:
    """Verification report from genuine/impostor scores, or from pair ``scores`` +
    ``is_genuine`` (which also enables k-fold accuracy via ``folds`` or ``n_folds``), or from
    a large-scale :class:`PairScoreSummary` (ROC/EER at histogram resolution, TAR@FAR exact).
    """
    notes = list(notes)
    kfold = None
    if scores is not None:
        scores = np.asarray(scores, dtype=np.float64)
        same = np.asarray(is_genuine, dtype=bool)
        genuine, impostor = scores[same], scores[~same]
        if folds is not None:
            kfold = kfold_accuracy(scores, same, folds=folds)
        elif n_folds is not None and scores.size < n_folds:
            notes.append(
                f"{n_folds}-fold accuracy left out: it needs at least {n_folds} pairs, "
                f"{scores.size} given"
            )
        elif n_folds is not None:
            kfold = kfold_accuracy(scores, same, n_folds=n_folds)
    if summary is not None:
        roc = summary.roc(genuine)
        notes.append(
            f"ROC/EER at histogram resolution (bin width {summary.bin_width:.2g}); TAR@FAR "
            f"exact for FAR <= {summary.max_exact_far:.2g}"
        )
    else:
        roc = roc_curve(genuine, impostor)
    results, unresolved = [], []
    for far in fars:
        try:
            if summary is not None:
                results.append(summary.tar_at_far(far, genuine))
            else:
                results.append(tar_at_far(genuine, impostor, far))
        except ValueError as err:  # InsufficientPairsError, or too few top scores kept
            unresolved.append(str(err))
    return VerificationReport(
        name=name,
        n_genuine=roc.n_genuine,
        n_impostor=roc.n_impostor,
        auc=roc.auc,
        eer=equal_error_rate(roc=roc),
        tar_at_far=results,
        unresolved=unresolved,
        kfold_accuracy=kfold,
        notes=notes,
        roc=roc,
    )


@dataclass
class IdentificationReport(Result):
    name: str
    n_gallery_identities: int
    n_mated_probes: int
    cmc: CmcCurve
    open_set: list[OpenSetPoint] = field(default_factory=list)
    n_nonmated_probes: int = 0
    notes: list[str] = field(default_factory=list)


def identification_report(
    name: str,
    gallery_embeddings: np.ndarray,
    gallery_labels,
    probe_embeddings: np.ndarray,
    probe_labels,
    *,
    max_rank: int = 20,
    fpirs=(1e-3, 1e-2, 1e-1),
    chunk: int = 2048,
    notes=(),
) -> IdentificationReport:
    """Closed-set CMC over the probes whose identity is enrolled, and open-set FNIR@FPIR
    with the others as non-mated probes (exact scores, computed in probe chunks, in float64
    when either embedding array is float64 and float32 otherwise)."""
    g, p = np.asarray(gallery_embeddings), np.asarray(probe_embeddings)
    dtype = np.float64 if np.float64 in (g.dtype, p.dtype) else np.float32  # keep float64
    g, p = g.astype(dtype, copy=False), p.astype(dtype, copy=False)
    gallery_labels = np.asarray(gallery_labels).reshape(-1)
    probe_labels = np.asarray(probe_labels).reshape(-1)
    if g.shape[0] != gallery_labels.size or p.shape[0] != probe_labels.size:
        raise ValueError("embeddings and labels disagree in length")
    mated_mask = np.isin(probe_labels, gallery_labels)
    if not mated_mask.any():
        raise ValueError(f"{name}: no probe identity is enrolled in the gallery")
    ranks, mated_scores, nonmated_top = [], [], []
    for start in range(0, p.shape[0], chunk):
        sim = p[start : start + chunk] @ g.T
        m = mated_mask[start : start + chunk]
        if m.any():
            found = mated_search(sim[m], probe_labels[start : start + chunk][m], gallery_labels)
            ranks.append(found.ranks)
            mated_scores.append(found.mated_scores)
        if (~m).any():
            nonmated_top.append(sim[~m].max(axis=1))
    mated = MatedSearch(ranks=np.concatenate(ranks), mated_scores=np.concatenate(mated_scores))
    open_set = []
    nonmated = np.concatenate(nonmated_top) if nonmated_top else np.empty(0)
    notes = list(notes)
    if nonmated.size:
        open_set = open_set_identification(mated, nonmated, target_fpirs=fpirs)
        resolved = {p.target_fpir for p in open_set}
        notes += [
            f"FPIR = {f:g} not reported: only {nonmated.size} non-mated probes"
            for f in fpirs
            if float(f) not in resolved
        ]
    return IdentificationReport(
        name=name,
        n_gallery_identities=int(np.unique(gallery_labels).size),
        n_mated_probes=int(mated.ranks.size),
        cmc=cmc_from_ranks(mated.ranks, max_rank=min(max_rank, np.unique(gallery_labels).size)),
        open_set=open_set,
        n_nonmated_probes=int(nonmated.size),
        notes=notes,
    )

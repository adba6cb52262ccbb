"""Verification accuracy: at a threshold, best over thresholds, and LFW-style k-fold.

LFW protocol: the pairs are split into contiguous folds (LFW's ``pairs.txt`` lists its 10
folds in order); for each fold the threshold maximising accuracy on the *other* folds is
applied to it; report the mean ± standard deviation of the fold accuracies. Accuracy hides
which errors were made (LFW, Huang et al. 2007), so counts of false accepts/rejects come with it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ._validate import as_bool, as_scores
from .intervals import Proportion, proportion
from .results import Result


@dataclass(frozen=True)
class AccuracyAtThreshold(Result):
    threshold: float
    accuracy: Proportion
    false_accepts: int
    false_rejects: int
    n_genuine: int
    n_impostor: int


def accuracy_at_threshold(scores, is_genuine, threshold: float) -> AccuracyAtThreshold:
    """Fraction of pairs decided correctly when accepting ``score >= threshold``."""
    s = as_scores(scores, "scores")
    g = as_bool(is_genuine, "is_genuine", s.size)
    accept = s >= threshold
    false_accepts = int(np.count_nonzero(accept & ~g))
    false_rejects = int(np.count_nonzero(~accept & g))
    return AccuracyAtThreshold(
        threshold=float(threshold),
        accuracy=proportion(s.size - false_accepts - false_rejects, s.size),
        false_accepts=false_accepts,
        false_rejects=false_rejects,
        n_genuine=int(g.sum()),
        n_impostor=int((~g).sum()),
    )


def best_threshold(scores, is_genuine) -> float:
    """Threshold maximising accuracy on these pairs (exact, O(n log n)).

    Candidates are the midpoints between consecutive distinct scores, the lowest score − 1
    and the highest + 1 (accept all, reject all); among equally accurate candidates the middle
    one is taken (of an even number, the upper of the two middle ones).
    """
    s = as_scores(scores, "scores")
    g = as_bool(is_genuine, "is_genuine", s.size)
    values = np.unique(s)
    candidates = np.concatenate(
        [[values[0] - 1.0], (values[:-1] + values[1:]) / 2.0, [values[-1] + 1.0]]
    )
    gen = np.sort(s[g])
    imp = np.sort(s[~g])
    correct = (gen.size - np.searchsorted(gen, candidates, side="left")) + np.searchsorted(
        imp, candidates, side="left"
    )
    best = np.flatnonzero(correct == correct.max())
    return float(candidates[best[best.size // 2]])


@dataclass(frozen=True)
class KFoldAccuracy(Result):
    """Per-fold accuracy with the threshold chosen on the other folds (``fold_accuracy``), and
    each fold's accuracy at its own best threshold (``fold_best_accuracy``: an optimistic bound;
    the gap between the two is what carrying the threshold from the other folds costs)."""

    mean: float
    std: float
    fold_accuracy: list[Proportion]
    fold_threshold: list[float]
    n_pairs: int
    fold_best_accuracy: list[Proportion] = field(default_factory=list)

    def __str__(self) -> str:
        return f"{100 * self.mean:.2f} ± {100 * self.std:.2f}% ({len(self.fold_accuracy)} folds)"


def fold_ids(n_pairs: int, n_folds: int) -> np.ndarray:
    """Contiguous fold index of each pair (sizes differ by at most one)."""
    if not 2 <= n_folds <= n_pairs:
        raise ValueError(f"n_folds must be in [2, {n_pairs}], got {n_folds}")
    return np.repeat(np.arange(n_folds), np.diff(np.linspace(0, n_pairs, n_folds + 1).astype(int)))


def kfold_accuracy(scores, is_genuine, n_folds: int = 10, folds=None) -> KFoldAccuracy:
    """LFW-style accuracy; ``folds`` (fold index per pair) overrides contiguous splitting."""
    s = as_scores(scores, "scores")
    g = as_bool(is_genuine, "is_genuine", s.size)
    f = fold_ids(s.size, n_folds) if folds is None else np.asarray(folds).reshape(-1)
    if f.size != s.size:
        raise ValueError(f"folds has {f.size} entries, expected {s.size}")
    accuracies, thresholds, best = [], [], []
    for fold in np.unique(f):
        test = f == fold
        t = best_threshold(s[~test], g[~test])
        accuracies.append(accuracy_at_threshold(s[test], g[test], t).accuracy)
        thresholds.append(t)
        own = best_threshold(s[test], g[test])
        best.append(accuracy_at_threshold(s[test], g[test], own).accuracy)
    rates = np.array([a.rate for a in accuracies])
    return KFoldAccuracy(
        mean=float(rates.mean()),
        std=float(rates.std()),
        fold_accuracy=accuracies,
        fold_threshold=thresholds,
        n_pairs=int(s.size),
        fold_best_accuracy=best,
    )

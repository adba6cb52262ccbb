"""Two scorings of the same verification pairs compared on k-fold accuracy, paired.

Two models (or one network with two descriptors) scored on the same pairs make their errors on
the same pairs, so their accuracies are compared pair by pair, not as two independent rates:

* **McNemar's test** (Psychometrika 12, 1947): of the pairs that exactly one scoring decides
  correctly (each fold at the threshold carried from the other folds, as
  :func:`partialfc.eval.accuracy.kfold_accuracy` decides), ``b`` favour A and ``c`` favour B;
  under "equally accurate" ``b ~ Binomial(b + c, 1/2)``, and the exact two-sided p-value is
  ``min(1, 2 · P(X ≤ min(b, c)))``.
* **A paired bootstrap** (Efron & Tibshirani, *An Introduction to the Bootstrap*, 1993, ch. 13):
  the pairs are resampled with replacement within each (fold, genuine / impostor) stratum, so
  every resample keeps the protocol's fold sizes and balance; both scorings are scored on the
  same resample, thresholds chosen again; the percentile interval of ``acc_A − acc_B``. The
  threshold's own noise (it is chosen on a few hundred pairs) is inside the interval.

Scores may be ``(P,)`` or ``(R, P)``: ``R`` repeats of a model (seeds, say) on the same ``P``
pairs, whose accuracy is the mean of the rows'. McNemar's counts are then summed over the rows,
which treats the repeats' decisions as independent; they are not (the same pairs, often much of
the same model), so with repeats the p-value is optimistic and the bootstrap interval, which
resamples pairs once for all rows, is the measure to read.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.stats import binom

from ._validate import as_bool
from .accuracy import best_threshold
from .results import Result


@dataclass(frozen=True)
class PairedAccuracyComparison(Result):
    """``accuracy_a − accuracy_b`` (k-fold, thresholds carried) with its bootstrap interval and
    McNemar's test; ``only_a_right`` / ``only_b_right``: McNemar's ``b`` and ``c``."""

    accuracy_a: float
    accuracy_b: float
    difference: float
    interval: tuple[float, float]
    confidence: float
    resamples: int
    only_a_right: int
    only_b_right: int
    mcnemar_p: float
    n_pairs: int
    n_repeats: int

    def __str__(self) -> str:
        low, high = self.interval
        return (
            f"{100 * self.difference:+.2f} points [{100 * low:+.2f}, {100 * high:+.2f}] "
            f"({self.only_a_right} vs {self.only_b_right} pairs, McNemar p = {self.mcnemar_p:.3g})"
        )


def mcnemar_exact_p(only_a_right: int, only_b_right: int) -> float:
    """Exact two-sided McNemar p-value: ``min(1, 2 · P(X ≤ min(b, c)))``, X ~ Bin(b + c, ½);
    1 when no pair is discordant."""
    if only_a_right < 0 or only_b_right < 0:
        raise ValueError(f"counts must be >= 0, got {only_a_right} and {only_b_right}")
    n = only_a_right + only_b_right
    if n == 0:
        return 1.0
    return float(min(1.0, 2.0 * binom.cdf(min(only_a_right, only_b_right), n, 0.5)))


def _rows(scores, name: str, n_pairs: int | None = None) -> np.ndarray:
    s = np.asarray(scores, dtype=np.float64)
    if s.ndim == 1:
        s = s[None, :]
    if s.ndim != 2 or s.shape[1] == 0:
        raise ValueError(f"{name} must be (pairs,) or (repeats, pairs), got shape {s.shape}")
    if n_pairs is not None and s.shape[1] != n_pairs:
        raise ValueError(f"{name} has {s.shape[1]} pairs, expected {n_pairs}")
    if not np.isfinite(s).all():
        raise ValueError(f"{name} contains NaN or inf")
    return s


def correct_at_carried_threshold(scores, is_genuine, folds) -> np.ndarray:
    """``(pairs,)`` bool: whether each pair is decided correctly (accept ``score >= t``) at the
    threshold that is best on the other folds, as :func:`kfold_accuracy` decides it."""
    scores = _rows(scores, "scores")
    if scores.shape[0] != 1:
        raise ValueError(f"scores must be (pairs,), got shape {np.shape(scores)}")
    same = as_bool(is_genuine, "is_genuine", scores.shape[1])
    folds = np.asarray(folds).reshape(-1)
    if folds.size != same.size:
        raise ValueError(f"folds has {folds.size} entries, expected {same.size}")
    return _correct_by_carried_threshold(scores[0], same, folds)


def _correct_by_carried_threshold(scores: np.ndarray, same: np.ndarray, folds: np.ndarray):
    right = np.empty(scores.size, dtype=bool)
    for fold in np.unique(folds):
        test = folds == fold
        threshold = best_threshold(scores[~test], same[~test])
        right[test] = (scores[test] >= threshold) == same[test]
    return right


def _fold_mean(right: np.ndarray, folds: np.ndarray) -> float:
    """Mean over folds of the fraction decided right (as ``kfold_accuracy(...).mean``)."""
    return float(np.mean([right[folds == fold].mean() for fold in np.unique(folds)]))


def _kfold_mean(scores: np.ndarray, same: np.ndarray, folds: np.ndarray) -> float:
    """Mean over folds of the carried-threshold accuracy."""
    return _fold_mean(_correct_by_carried_threshold(scores, same, folds), folds)


def compare_kfold_accuracy(
    scores_a,
    scores_b,
    is_genuine,
    folds,
    resamples: int = 2000,
    confidence: float = 0.95,
    seed: int = 0,
) -> PairedAccuracyComparison:
    """Scoring A against scoring B of the same pairs (module docstring). ``folds``: the fold
    of each pair (two folds or more); ``resamples`` (default 2,000) bootstrap resamples, drawn
    from ``numpy.random.default_rng(seed)`` (default 0); ``confidence`` (default 0.95)."""
    a = _rows(scores_a, "scores_a")
    b = _rows(scores_b, "scores_b", a.shape[1])
    if b.shape[0] != a.shape[0]:
        raise ValueError(
            f"scores_b has {b.shape[0]} repeats, expected {a.shape[0]} as scores_a "
            "(row r of each is the same repeat)"
        )
    n = a.shape[1]
    same = as_bool(is_genuine, "is_genuine", n)
    fold = np.asarray(folds).reshape(-1)
    if fold.size != n:
        raise ValueError(f"folds has {fold.size} entries, expected {n}")
    if np.unique(fold).size < 2:
        raise ValueError("folds: k-fold accuracy needs two folds or more")
    if resamples < 1:
        raise ValueError(f"resamples must be >= 1, got {resamples}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")

    def accuracy(rows, index):
        return float(np.mean([_kfold_mean(r[index], same[index], fold[index]) for r in rows]))

    # every pair decided once per row: McNemar's counts and the accuracies both come from it
    right_a = [_correct_by_carried_threshold(row, same, fold) for row in a]
    right_b = [_correct_by_carried_threshold(row, same, fold) for row in b]
    only_a = sum(int(np.count_nonzero(ra & ~rb)) for ra, rb in zip(right_a, right_b, strict=True))
    only_b = sum(int(np.count_nonzero(~ra & rb)) for ra, rb in zip(right_a, right_b, strict=True))
    strata = [
        np.flatnonzero((fold == f) & (same == g)) for f in np.unique(fold) for g in (True, False)
    ]
    strata = [s for s in strata if s.size]
    rng = np.random.default_rng(seed)
    differences = np.empty(resamples)
    for i in range(resamples):
        index = np.concatenate([rng.choice(s, size=s.size, replace=True) for s in strata])
        differences[i] = accuracy(a, index) - accuracy(b, index)
    tail = (1.0 - confidence) / 2.0
    accuracy_a = float(np.mean([_fold_mean(r, fold) for r in right_a]))
    accuracy_b = float(np.mean([_fold_mean(r, fold) for r in right_b]))
    return PairedAccuracyComparison(
        accuracy_a=accuracy_a,
        accuracy_b=accuracy_b,
        difference=accuracy_a - accuracy_b,
        interval=(float(np.quantile(differences, tail)), float(np.quantile(differences, 1 - tail))),
        confidence=confidence,
        resamples=resamples,
        only_a_right=only_a,
        only_b_right=only_b,
        mcnemar_p=mcnemar_exact_p(only_a, only_b),
        n_pairs=n,
        n_repeats=a.shape[0],
    )

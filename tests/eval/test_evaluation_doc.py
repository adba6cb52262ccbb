"""The worked examples of docs/evaluation.md, recomputed: the page cannot drift from the code."""

from pathlib import Path

import numpy as np
import pytest
from sklearn.metrics import roc_curve

from partialfc.eval import tar_at_far

DOC = (Path(__file__).resolve().parents[2] / "docs" / "evaluation.md").read_text()
FLAT_DOC = " ".join(DOC.split())  # line breaks and column padding do not matter

IMPOSTOR = np.array([0.9, 0.6, 0.4, 0.3, 0.2, 0.1, 0.0, -0.1, -0.2, -0.3])
GENUINE = np.array([0.95, 0.8, 0.7, 0.6, 0.35])
TARGET_FAR = 0.18


def sklearn_roc():
    labels = np.r_[np.ones(GENUINE.size), np.zeros(IMPOSTOR.size)]
    return roc_curve(labels, np.r_[GENUINE, IMPOSTOR])


def nearest_roc_point(fpr, tpr, thresholds, target):
    """The IJB scripts' rule: on the flipped sklearn ROC, the first point whose FPR is
    closest to the target."""
    fpr, tpr, thresholds = fpr[::-1], tpr[::-1], thresholds[::-1]
    i = int(np.argmin(np.abs(fpr - target)))  # argmin returns the first minimum
    return fpr[i], tpr[i], thresholds[i]


def test_worked_example_three_conventions():
    ours = tar_at_far(GENUINE, IMPOSTOR, TARGET_FAR)
    assert ours.allowed_false_accepts == 1
    assert (ours.tar.k, ours.tar.n, ours.far.k, ours.far.n) == (3, 5, 1, 10)
    assert ours.threshold == np.nextafter(0.6, 1.0)

    fpr, tpr, thresholds = sklearn_roc()
    points = [(float(f), float(t)) for f, t in zip(fpr, tpr, strict=True)]
    assert points == [(0, 0), (0, 0.2), (0.1, 0.2), (0.1, 0.6), (0.2, 0.8), (0.3, 0.8),
                      (0.3, 1.0), (1, 1)]  # fmt: skip
    interpolated = float(np.interp(TARGET_FAR, fpr, tpr))
    assert interpolated == pytest.approx(0.76)
    # no threshold realises it: every achievable TAR is a multiple of 1/5
    assert all(abs(interpolated - j / 5) > 0.01 for j in range(6))

    near_fpr, near_tpr, near_threshold = nearest_roc_point(fpr, tpr, thresholds, TARGET_FAR)
    assert (near_fpr, near_tpr, near_threshold) == (0.2, 0.8, 0.6)
    assert near_fpr > TARGET_FAR

    # the page shows these values
    roc_text = ", ".join(f"({f:g}, {t:g})" for f, t in points)
    assert f"(FPR, TPR) = {roc_text}." in FLAT_DOC
    rows = [
        f"| this project (largest TAR, at most k false accepts) | **{ours.tar.rate:.2f}** "
        f"({ours.tar.k}/{ours.tar.n}) | {ours.far.rate:.2f} ({ours.far.k}/{ours.far.n}) |",
        f"| sklearn `roc_curve` + `np.interp` | **{interpolated:.2f}** |",
        f"| nearest ROC point (InsightFace IJB scripts) | **{near_tpr:.2f}** "
        f"({round(near_tpr * 5)}/5) | {near_fpr:.2f} ({round(near_fpr * 10)}/10), above the target",
    ]
    for row in rows:
        assert row in FLAT_DOC, row
    assert "impostor: " + " ".join(f"{v:g}" for v in IMPOSTOR) in FLAT_DOC
    assert "genuine : " + " ".join(f"{v:g}" for v in GENUINE) in FLAT_DOC
    assert f"target FAR = {TARGET_FAR:g}, so `k = {ours.allowed_false_accepts}`" in FLAT_DOC


def test_smallest_example():
    imp = [0.9, 0.5] + [0.0] * 8
    r = tar_at_far([0.7], imp, 0.1)
    assert (r.allowed_false_accepts, r.tar.k, r.tar.n, r.far.k, r.far.n) == (1, 1, 1, 1, 10)
    assert r.threshold == np.nextafter(0.5, 1.0)
    # the k-th highest impostor as threshold: no genuine pair accepted
    assert np.count_nonzero(np.array([0.7]) >= np.sort(imp)[::-1][0]) == 0
    assert "TAR = 1/1 at FAR = 1/10" in FLAT_DOC and "TAR = 0/1" in FLAT_DOC

"""ROC, AUC and EER against brute force computed straight from the scores, plus hand-made
cases for the EER's corner cases (an exact FAR = FRR point, a crossing on the first segment)."""

from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pytest

from partialfc.eval.roc import equal_error_rate, roc_auc, roc_curve


def _brute_force_points(genuine, impostor):
    """(threshold, accepted genuine, accepted impostors) from +inf down, by counting."""
    points = [(np.inf, 0, 0)]
    for t in sorted(set(genuine) | set(impostor), reverse=True):
        points.append((t, sum(g >= t for g in genuine), sum(i >= t for i in impostor)))
    return points


def _brute_force_eer(genuine, impostor):
    """First operating point with FAR >= FRR; the crossing on the segment that reaches it."""
    ng, ni = len(genuine), len(impostor)
    pts = [
        (t, Fraction(ni and fa, ni), 1 - Fraction(ta, ng))
        for t, ta, fa in _brute_force_points(genuine, impostor)
    ]
    k = next(k for k, (_, far, frr) in enumerate(pts) if far >= frr)
    t, far, frr = pts[k]
    if far == frr:
        return t, far, far, frr
    _, far0, frr0 = pts[k - 1]
    s = (frr0 - far0) / ((frr0 - far0) + (far - frr))
    return t, far0 + s * (far - far0), far, frr


def _random_scores(rng):
    ng, ni = rng.integers(1, 15, 2)
    levels = int(rng.integers(2, 12))  # few levels: many ties
    return (rng.integers(0, levels, ng) / 4).tolist(), (rng.integers(0, levels, ni) / 4).tolist()


def test_roc_counts_and_eer_match_brute_force_on_tied_scores():
    rng = np.random.default_rng(11)
    for _ in range(300):
        genuine, impostor = _random_scores(rng)
        roc = roc_curve(genuine, impostor)
        points = _brute_force_points(genuine, impostor)
        assert roc.thresholds.tolist() == [p[0] for p in points]
        assert roc.true_accepts.tolist() == [p[1] for p in points]
        assert roc.false_accepts.tolist() == [p[2] for p in points]
        assert roc.true_accepts.dtype.kind == "i" and roc.false_accepts.dtype.kind == "i"

        t, eer, far, frr = _brute_force_eer(genuine, impostor)
        e = equal_error_rate(genuine, impostor)
        assert e.eer == pytest.approx(float(eer), abs=1e-12)
        assert (e.threshold, e.far, e.frr) == (t, float(far), float(frr))
        assert e.false_accepts == round(far * len(impostor))
        assert e.false_rejects == round(frr * len(genuine))
        assert (e.n_genuine, e.n_impostor) == (len(genuine), len(impostor))
        assert equal_error_rate(roc=roc) == e


def test_eer_at_an_exact_far_equals_frr_point_is_that_point_exactly():
    # at threshold 4: 1 of 6 genuine and 5 of 6 impostors accepted, FAR = FRR = 5/6; the
    # segment before it starts at FAR 1/3, and 1/3 + (5/6 - 1/3) rounds differently from 5/6
    genuine = [2.0, 1.0, 3.0, 7.0, 1.0, 1.0]
    impostor = [2.0, 4.0, 4.0, 7.0, 7.0, 4.0]
    e = equal_error_rate(genuine, impostor)
    assert e.eer == 5 / 6
    assert (e.threshold, e.far, e.frr) == (4.0, 5 / 6, 5 / 6)
    assert (e.false_accepts, e.false_rejects) == (5, 5)


def test_eer_finds_a_far_equals_frr_point_that_1_minus_tar_would_miss():
    # at threshold 1.25 FAR = FRR = 2/3, but 1 - 1/3 rounds to 0.6666666666666667 > 2/3
    e = equal_error_rate([0.75, 0.75, 1.5], [1.25, 1.75, 0.25])
    assert (e.eer, e.threshold, e.far, e.frr) == (2 / 3, 1.25, 2 / 3, 2 / 3)
    assert (e.false_accepts, e.false_rejects) == (2, 2)


def test_eer_reports_the_equal_point_not_the_next_one():
    # thresholds 3, 2.5, 2, 1: at 2.5 FAR = FRR = 1/2; at 2 FAR = 1/2 > FRR = 0
    e = equal_error_rate([2.0, 3.0], [1.0, 2.5])
    assert (e.eer, e.threshold, e.far, e.frr) == (0.5, 2.5, 0.5, 0.5)
    assert (e.false_accepts, e.false_rejects) == (1, 1)


def test_eer_crossing_on_the_first_segment_is_interpolated():
    # (FAR, FRR) goes from (0, 1) at +inf to (1, 1/2) at threshold 3: crossing at 2/3
    e = equal_error_rate([1.0, 3.0], [3.0, 3.0])
    assert e.eer == pytest.approx(2 / 3, abs=1e-15)
    assert (e.threshold, e.far, e.frr) == (3.0, 1.0, 0.5)


def test_auc_is_the_mann_whitney_statistic_with_ties_counted_half():
    rng = np.random.default_rng(5)
    for _ in range(100):
        genuine, impostor = _random_scores(rng)
        wins = sum((g > i) + 0.5 * (g == i) for g in genuine for i in impostor)
        expected = wins / (len(genuine) * len(impostor))
        assert roc_auc(genuine, impostor) == pytest.approx(expected, abs=1e-12)
        roc = roc_curve(genuine, impostor)
        out = json.loads(json.dumps(roc.to_dict()))
        assert out["auc"] == pytest.approx(expected, abs=1e-12)
        assert out["true_accepts"] == roc.true_accepts.tolist()

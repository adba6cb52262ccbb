"""ROC / EER / TAR@FAR / accuracy: a hand-worked ROC, scikit-learn cross-checks."""

import json

import numpy as np
import pytest
from scipy.stats import beta
from sklearn.metrics import roc_auc_score
from sklearn.metrics import roc_curve as sk_roc_curve

from partialfc.eval import (
    InsufficientPairsError,
    accuracy_at_threshold,
    best_threshold,
    equal_error_rate,
    kfold_accuracy,
    proportion,
    roc_curve,
    tar_at_far,
    tar_at_zero_far,
)

# A ROC by hand: twenty pairs, ten genuine, ten impostor; the best impostor scores 0.52, the
# eighth-best genuine 0.55, and exactly two impostors and two genuines are on the wrong side of
# t = 0.45.
WORKED_GENUINE = [0.91, 0.85, 0.80, 0.77, 0.72, 0.68, 0.61, 0.55, 0.38, 0.30]
WORKED_IMPOSTOR = [0.52, 0.45, 0.39, 0.33, 0.27, 0.21, 0.15, 0.10, 0.04, -0.02]


def test_worked_roc_tar_at_zero_far_is_080_at_055():
    r = tar_at_zero_far(WORKED_GENUINE, WORKED_IMPOSTOR)
    assert r.tar.rate == pytest.approx(0.80) and (r.tar.k, r.tar.n) == (8, 10)
    assert r.threshold == pytest.approx(0.55)
    assert (r.far.k, r.far.n) == (0, 10)
    # 95% upper bound on FAR with 0 of 10 observed: 1 - 0.025**(1/10)
    assert r.far.upper == pytest.approx(1 - 0.025**0.1)


def test_worked_roc_eer_is_20_percent_at_045():
    e = equal_error_rate(WORKED_GENUINE, WORKED_IMPOSTOR)
    assert e.eer == pytest.approx(0.20)
    assert e.threshold == pytest.approx(0.45)
    assert (e.false_accepts, e.false_rejects) == (2, 2)


def test_worked_roc_accuracy_16_of_20_at_045_and_best_is_higher():
    scores = WORKED_GENUINE + WORKED_IMPOSTOR
    same = [True] * 10 + [False] * 10
    a = accuracy_at_threshold(scores, same, 0.45)
    assert (a.accuracy.k, a.accuracy.n) == (16, 20)
    assert (a.false_accepts, a.false_rejects) == (2, 2)
    # the accuracy-optimal threshold sits in the gap (0.52, 0.55): 18/20
    t = best_threshold(scores, same)
    assert 0.52 < t < 0.55
    assert accuracy_at_threshold(scores, same, t).accuracy.k == 18


def test_worked_roc_points_by_hand():
    roc = roc_curve(WORKED_GENUINE, WORKED_IMPOSTOR)
    i = int(np.flatnonzero(roc.thresholds == 0.52)[0])
    assert (roc.true_accepts[i], roc.false_accepts[i]) == (8, 1)
    # AUC = P(gen > imp), counted by hand: genuine 0.38 loses to 0.52, 0.45, 0.39 (3) and
    # genuine 0.30 also to 0.33 (4): 7 of the 100 genuine-impostor pairs are lost
    assert roc.auc == pytest.approx(1 - 7 / 100)


def _sklearn_points(gen, imp):
    y = np.r_[np.ones(len(gen)), np.zeros(len(imp))]
    s = np.r_[gen, imp]
    fpr, tpr, thr = sk_roc_curve(y, s, drop_intermediate=False)
    return fpr, tpr, thr, roc_auc_score(y, s)


@pytest.mark.parametrize("tied", [False, True])
def test_roc_matches_sklearn(tied):
    rng = np.random.default_rng(1)
    gen = rng.normal(0.5, 0.2, 700)
    imp = rng.normal(0.1, 0.2, 1300)
    if tied:  # heavy ties within and across the two classes
        gen, imp = np.round(gen, 1), np.round(imp, 1)
    roc = roc_curve(gen, imp)
    fpr, tpr, thr, auc = _sklearn_points(gen, imp)
    np.testing.assert_allclose(roc.far, fpr, rtol=0, atol=1e-15)
    np.testing.assert_allclose(roc.tar, tpr, rtol=0, atol=1e-15)
    np.testing.assert_allclose(roc.thresholds[1:], thr[1:])
    assert roc.auc == pytest.approx(auc, abs=1e-12)


def test_auc_with_ties_is_mann_whitney_half_credit():
    gen, imp = [0.5, 0.5, 0.7], [0.5, 0.2]
    # pairs: (0.5,0.5) x2 ties -> 0.5 each; (0.5,0.2) x2 wins; (0.7, both) wins -> 5/6
    assert roc_curve(gen, imp).auc == pytest.approx(5 / 6)


def test_eer_interpolates_when_no_exact_crossing():
    e = equal_error_rate([0.9, 0.8, 0.3], [0.7, 0.2])
    # points (FAR, FRR): t=0.8 -> (0, 1/3); t=0.7 -> (1/2, 1/3): crossing on that segment
    # FRR stays 1/3 while FAR goes 0 -> 1/2, so EER = 1/3 at threshold 0.7
    assert e.eer == pytest.approx(1 / 3)
    assert e.threshold == pytest.approx(0.7)
    assert (e.far, e.frr) == (0.5, pytest.approx(1 / 3))


def test_tar_at_far_threshold_sits_just_above_the_k_plus_first_impostor_and_counts():
    rng = np.random.default_rng(2)
    gen = rng.normal(0.6, 0.15, 2000)
    imp = rng.normal(0.0, 0.1, 50_000)
    r = tar_at_far(gen, imp, 1e-3)
    k = 50
    boundary = np.sort(imp)[::-1][k]  # the 51st highest impostor: accepting it makes k + 1
    assert r.threshold == np.nextafter(boundary, np.inf) and r.allowed_false_accepts == k
    assert r.far.k == np.count_nonzero(imp > boundary) == k and r.far.n == 50_000
    assert r.tar.k == np.count_nonzero(gen > boundary) and r.tar.n == 2000
    assert r.tar.k == 1942
    # Clopper-Pearson bounds recomputed from the beta quantiles
    assert r.tar.lower == pytest.approx(beta.ppf(0.025, r.tar.k, 2000 - r.tar.k + 1))
    assert r.far.upper == pytest.approx(beta.ppf(0.975, k + 1, 50_000 - k))
    assert r.far.lower < 1e-3 < r.far.upper
    json.dumps(r.to_dict())


def test_tar_at_far_refuses_unresolvable_far():
    with pytest.raises(InsufficientPairsError, match=r"only 999 impostor pairs .* FAR = 0\.001"):
        tar_at_far(np.ones(5), np.zeros(999), 1e-3)
    assert isinstance(InsufficientPairsError("x"), ValueError)


def test_tar_at_far_never_exceeds_target_on_ties():
    imp = np.array([0.9, 0.8, 0.8, 0.8, 0.1, 0.1, 0.1, 0.1, 0.1, 0.1])
    r = tar_at_far([0.85, 0.8, 0.5], imp, 0.2)  # k = 2, but 0.8 is tied three times
    assert r.allowed_false_accepts == 2
    assert r.far.k == 1 and r.threshold > 0.8
    assert r.tar.k == 1


def test_proportion_interval_edges():
    p = proportion(0, 100)
    assert p.lower == 0.0 and p.upper == pytest.approx(1 - 0.025 ** (1 / 100))
    assert proportion(100, 100).upper == 1.0


def test_kfold_threshold_comes_from_other_folds():
    # 3 folds of 4 pairs. Folds 1 and 2 separate cleanly at any t in (0.4, 0.6) -> 0.5;
    # fold 0 would prefer t ~ 0.75 by itself but is scored at 0.5 chosen on folds 1+2.
    scores = [0.8, 0.7, 0.55, 0.3, 0.9, 0.6, 0.4, 0.1, 0.95, 0.6, 0.4, 0.2]
    same = [1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    r = kfold_accuracy(scores, same, n_folds=3)
    assert r.fold_threshold[0] == pytest.approx(0.5)
    assert (r.fold_accuracy[0].k, r.fold_accuracy[0].n) == (3, 4)  # 0.55 impostor accepted
    assert [a.k for a in r.fold_accuracy[1:]] == [4, 4]
    assert r.mean == pytest.approx((0.75 + 1 + 1) / 3)
    assert r.std == pytest.approx(np.std([0.75, 1, 1]))
    # at its own best threshold (~0.75 for fold 0) every fold is right on all 4 pairs
    assert [(a.k, a.n) for a in r.fold_best_accuracy] == [(4, 4)] * 3


def test_kfold_own_threshold_accuracy_bounds_the_carried_one():
    # two folds whose scores sit at different heights: each separates perfectly at its own
    # threshold, and each is scored at the other's (fold 1's best is 0.175, which accepts
    # fold 0's 0.2 impostor; fold 0's best is 0.4, which rejects both of fold 1's genuines)
    scores = [0.6, 0.7, 0.1, 0.2, 0.3, 0.35, 0.0, 0.05]
    same = [1, 1, 0, 0, 1, 1, 0, 0]
    r = kfold_accuracy(scores, same, folds=[0, 0, 0, 0, 1, 1, 1, 1])
    assert r.fold_threshold == pytest.approx([0.175, 0.4])
    assert [a.k for a in r.fold_accuracy] == [3, 2]
    assert [a.k for a in r.fold_best_accuracy] == [4, 4]


def test_kfold_own_threshold_accuracy_is_the_best_over_every_threshold():
    rng = np.random.default_rng(5)
    scores = np.round(np.concatenate([rng.normal(0.4, 0.2, 60), rng.normal(0.1, 0.2, 60)]), 2)
    same = np.r_[np.ones(60, bool), np.zeros(60, bool)]
    folds = rng.integers(0, 3, 120)
    r = kfold_accuracy(scores, same, folds=folds)
    for fold, best in enumerate(r.fold_best_accuracy):
        s, g = scores[folds == fold], same[folds == fold]
        by_hand = max(np.mean((s >= t) == g) for t in np.r_[s, np.inf])  # every cut point
        assert best.rate == pytest.approx(by_hand)
        assert best.rate >= r.fold_accuracy[fold].rate


def test_bad_input_names_the_argument():
    with pytest.raises(ValueError, match="impostor contains 1 non-finite"):
        roc_curve([0.1], [np.nan, 0.2])
    with pytest.raises(ValueError, match="genuine is empty"):
        roc_curve([], [0.2])


def test_kfold_accuracy_needs_as_many_pairs_as_folds():
    """A set of fewer pairs than folds reports the rest, with a note instead of a traceback."""
    from partialfc.eval.reports import verification_report

    scores = np.array([0.9, 0.8, 0.7, 0.2, 0.6, 0.1, 0.3, 0.05])
    same = np.array([1, 1, 1, 1, 0, 0, 0, 0], dtype=bool)
    few = verification_report("tiny", scores=scores, is_genuine=same, n_folds=10)
    assert few.kfold_accuracy is None
    assert few.notes == ["10-fold accuracy left out: it needs at least 10 pairs, 8 given"]
    assert few.auc == pytest.approx(14 / 16)  # impostors 0.6 and 0.3 above the genuine 0.2
    four = verification_report("tiny", scores=scores, is_genuine=same, n_folds=4)
    # contiguous folds of two pairs; the threshold chosen on the other six
    assert len(four.kfold_accuracy.fold_accuracy) == 4 and four.notes == []

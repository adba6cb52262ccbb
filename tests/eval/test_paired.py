"""Paired comparison of two scorings of the same pairs: McNemar's exact test by hand, the
accuracies against kfold_accuracy, the bootstrap interval's behaviour."""

import numpy as np
import pytest

from partialfc.eval import (
    compare_kfold_accuracy,
    correct_at_carried_threshold,
    kfold_accuracy,
    mcnemar_exact_p,
)


@pytest.mark.parametrize(
    ("b", "c", "expected"),
    [
        (2, 8, 2 * (1 + 10 + 45) / 2**10),  # 2 · P(X ≤ 2), X ~ Bin(10, ½) = 112/1024
        (8, 2, 2 * (1 + 10 + 45) / 2**10),
        (0, 6, 2 / 2**6),
        (1, 1, 1.0),  # 2 · P(X ≤ 1) = 2 · 3/4 > 1
        (0, 0, 1.0),
    ],
)
def test_mcnemar_exact_p_by_hand(b, c, expected):
    assert mcnemar_exact_p(b, c) == pytest.approx(expected, rel=1e-12)


def _pairs(rng, n_per_stratum=150, folds=2, noise=1.0):
    same = np.tile(np.repeat([True, False], n_per_stratum), folds)
    fold = np.repeat(np.arange(folds), 2 * n_per_stratum)
    signal = np.where(same, 1.0, -1.0)
    return signal, same, fold, lambda scale=noise: signal + scale * rng.standard_normal(signal.size)


def test_accuracies_and_counts_match_kfold_accuracy():
    rng = np.random.default_rng(1)
    _, same, fold, draw = _pairs(rng)
    a, b = draw(), draw()
    result = compare_kfold_accuracy(a, b, same, fold, resamples=50)
    expected_a = kfold_accuracy(a, same, folds=fold).mean
    expected_b = kfold_accuracy(b, same, folds=fold).mean
    assert result.accuracy_a == pytest.approx(expected_a, abs=1e-15)
    assert result.accuracy_b == pytest.approx(expected_b, abs=1e-15)
    # equal folds: the accuracy difference is the discordant pairs' balance over all pairs
    assert result.difference == pytest.approx(
        (result.only_a_right - result.only_b_right) / same.size, abs=1e-15
    )
    assert result.only_a_right + result.only_b_right > 0
    assert result.mcnemar_p == mcnemar_exact_p(result.only_a_right, result.only_b_right)


def test_decisions_at_the_carried_threshold_are_kfold_accuracys():
    rng = np.random.default_rng(10)
    _, same, fold, draw = _pairs(rng, folds=3)
    a = draw()
    right = correct_at_carried_threshold(a, same, fold)
    expected = kfold_accuracy(a, same, folds=fold)
    assert [right[fold == f].mean() for f in range(3)] == [
        pytest.approx(p.rate, abs=1e-15) for p in expected.fold_accuracy
    ]
    with pytest.raises(ValueError, match=r"scores must be \(pairs,\)"):
        correct_at_carried_threshold(np.stack([a, a]), same, fold)


def test_repeats_average_accuracies_and_sum_counts():
    rng = np.random.default_rng(2)
    _, same, fold, draw = _pairs(rng)
    a, b = np.stack([draw(), draw(), draw()]), np.stack([draw(), draw(), draw()])
    result = compare_kfold_accuracy(a, b, same, fold, resamples=20)
    rows = [
        compare_kfold_accuracy(x, y, same, fold, resamples=1) for x, y in zip(a, b, strict=True)
    ]
    assert result.n_repeats == 3
    assert result.accuracy_a == pytest.approx(np.mean([r.accuracy_a for r in rows]), abs=1e-15)
    assert result.accuracy_b == pytest.approx(np.mean([r.accuracy_b for r in rows]), abs=1e-15)
    assert result.only_a_right == sum(r.only_a_right for r in rows)
    assert result.only_b_right == sum(r.only_b_right for r in rows)


def test_identical_scorings_differ_by_nothing():
    rng = np.random.default_rng(3)
    _, same, fold, draw = _pairs(rng)
    a = draw()
    result = compare_kfold_accuracy(a, a.copy(), same, fold, resamples=100)
    assert result.difference == 0.0
    assert result.interval == (0.0, 0.0)
    assert (result.only_a_right, result.only_b_right, result.mcnemar_p) == (0, 0, 1.0)


def test_interval_excludes_zero_only_for_a_real_difference():
    rng = np.random.default_rng(4)
    _, same, fold, draw = _pairs(rng, n_per_stratum=300)
    good, bad = draw(0.5), draw(2.0)  # noise sd 0.5 against 2: ~98 % against ~69 % right
    clear = compare_kfold_accuracy(good, bad, same, fold, resamples=300)
    assert clear.interval[0] > 0.2 and clear.mcnemar_p < 1e-12
    assert clear.interval[0] <= clear.difference <= clear.interval[1]
    a, b = draw(), draw()  # two draws of the same model
    level = compare_kfold_accuracy(a, b, same, fold, resamples=300)
    assert level.interval[0] < 0 < level.interval[1]
    # the interval is of the difference's sampling spread: about √(discordant) / n wide
    width = level.interval[1] - level.interval[0]
    discordant = level.only_a_right + level.only_b_right
    assert 0.5 < width / (2 * 1.96 * np.sqrt(discordant) / same.size) < 2.0


def test_resamples_keep_each_fold_and_its_balance():
    # a constant scoring is right on exactly the impostors of a fold (a tie between accepting and
    # rejecting everything, on balanced folds, rejects): 50 % on any resample that keeps every
    # (fold, genuine / impostor) count, against 100 % for a separating scoring; a resample
    # that mixed the strata would move it
    rng = np.random.default_rng(9)
    signal, same, fold, _ = _pairs(rng, n_per_stratum=40)
    result = compare_kfold_accuracy(signal, np.zeros_like(signal), same, fold, resamples=200)
    assert (result.accuracy_a, result.accuracy_b) == (1.0, 0.5)
    assert result.interval == pytest.approx((0.5, 0.5), abs=1e-15)
    assert (result.only_a_right, result.only_b_right) == (same.sum(), 0)


def test_same_seed_same_interval():
    rng = np.random.default_rng(5)
    _, same, fold, draw = _pairs(rng)
    a, b = draw(), draw()
    first = compare_kfold_accuracy(a, b, same, fold, resamples=40, seed=7)
    again = compare_kfold_accuracy(a, b, same, fold, resamples=40, seed=7)
    other = compare_kfold_accuracy(a, b, same, fold, resamples=40, seed=8)
    assert first.interval == again.interval
    assert first.interval != other.interval


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"scores_b": np.zeros(5)}, "scores_b has 5 pairs"),
        ({"scores_a": np.full(600, np.nan)}, "scores_a contains NaN"),
        ({"folds": np.zeros(600, int)}, "two folds or more"),
        ({"folds": np.zeros(5, int)}, "folds has 5 entries"),
        ({"resamples": 0}, "resamples must be >= 1"),
        ({"confidence": 1.0}, "confidence must be in"),
        ({"confidence": 0.0}, r"^confidence must be in \(0, 1\), got 0.0$"),
        ({"is_genuine": np.ones(5, bool)}, r"^is_genuine has 5 entries, expected 600$"),
        ({"is_genuine": np.full(600, 2)}, "^is_genuine must be boolean"),
        (
            {"scores_a": np.zeros((2, 600)), "scores_b": np.zeros((3, 600))},
            (
                r"^scores_b has 3 repeats, expected 2 as scores_a "
                r"\(row r of each is the same repeat\)$"
            ),
        ),
        ({"scores_a": np.zeros((2, 0))}, r"^scores_a must be .* got shape \(2, 0\)$"),
        ({"scores_a": np.zeros((2, 2, 150))}, r"^scores_a must be .* got shape \(2, 2, 150\)$"),
        ({"folds": np.zeros(600, int)}, "^folds: k-fold accuracy needs two folds or more$"),
        ({"folds": np.zeros(5, int)}, r"^folds has 5 entries, expected 600$"),
    ],
)
def test_bad_input_names_the_argument(change, message):
    rng = np.random.default_rng(6)
    _, same, fold, draw = _pairs(rng)
    args = {"scores_a": draw(), "scores_b": draw(), "is_genuine": same, "folds": fold}
    args["resamples"] = 5
    args.update(change)
    with pytest.raises(ValueError, match=message):
        compare_kfold_accuracy(**args)


def test_a_score_at_the_carried_threshold_is_accepted():
    # fold 1 (impostor 0.25, genuine 0.75) hands fold 0 the threshold 0.5, at which fold 0's
    # genuine sits exactly: accepted (score >= t), as kfold_accuracy decides; fold 0 hands fold 1
    # 0.25, which accepts fold 1's impostor
    scores = [0.5, 0.0, 0.25, 0.75]
    same = [True, False, False, True]
    folds = [0, 0, 1, 1]
    assert correct_at_carried_threshold(scores, same, folds).tolist() == [True, True, False, True]
    expected = kfold_accuracy(scores, same, folds=folds)
    assert expected.fold_threshold == [0.5, 0.25]
    assert [a.rate for a in expected.fold_accuracy] == [1.0, 0.5]


def _unequal_folds(seed):
    """Three folds of 100, 60 and 40 genuine + impostor pairs, and two noisy scorings."""
    rng = np.random.default_rng(seed)
    sizes = (100, 60, 40)
    same = np.concatenate([np.repeat([True, False], k // 2) for k in sizes])
    fold = np.repeat(np.arange(3), sizes)
    signal = np.where(same, 1.0, -1.0)
    a = signal + rng.standard_normal(signal.size)
    b = signal + 1.3 * rng.standard_normal(signal.size)
    return a, b, same, fold


def test_unequal_folds_are_averaged_fold_by_fold():
    a, b, same, fold = _unequal_folds(11)
    result = compare_kfold_accuracy(a, b, same, fold, resamples=5)
    # the mean of the three folds' rates, not the rate over all pairs
    for accuracy, scores in ((result.accuracy_a, a), (result.accuracy_b, b)):
        expected = kfold_accuracy(scores, same, folds=fold)
        assert accuracy == pytest.approx(expected.mean, abs=1e-15)
        right = correct_at_carried_threshold(scores, same, fold)
        assert abs(expected.mean - right.mean()) > 1e-3  # the two differ on these folds
    assert result.n_pairs == 200 and result.n_repeats == 1


def test_interval_is_the_stratified_bootstrap_recomputed_by_hand():
    # every resample draws, with numpy.random.default_rng(seed), each (fold, genuine then
    # impostor) stratum in fold order with replacement at its own size; both scorings are
    # scored on it by kfold_accuracy, and the interval is the (1 - confidence) / 2 quantiles
    a, b, same, fold = _unequal_folds(12)
    seed, resamples, confidence = 3, 40, 0.8
    rng = np.random.default_rng(seed)
    strata = [np.flatnonzero((fold == f) & (same == g)) for f in range(3) for g in (True, False)]
    differences = []
    for _ in range(resamples):
        index = np.concatenate([rng.choice(s, size=s.size, replace=True) for s in strata])
        accuracy = [kfold_accuracy(x[index], same[index], folds=fold[index]).mean for x in (a, b)]
        differences.append(accuracy[0] - accuracy[1])
    result = compare_kfold_accuracy(
        a, b, same, fold, resamples=resamples, confidence=confidence, seed=seed
    )
    assert result.interval == pytest.approx(
        (np.quantile(differences, 0.1), np.quantile(differences, 0.9)), abs=1e-12
    )
    assert (result.resamples, result.confidence) == (resamples, confidence)


def test_defaults_are_2000_resamples_95_percent_and_seed_0():
    rng = np.random.default_rng(13)
    _, same, fold, draw = _pairs(rng, n_per_stratum=10)
    a, b = draw(), draw()
    default = compare_kfold_accuracy(a, b, same, fold)
    explicit = compare_kfold_accuracy(a, b, same, fold, resamples=2000, confidence=0.95, seed=0)
    assert default == explicit
    assert (default.resamples, default.confidence, default.n_pairs) == (2000, 0.95, 40)


def test_folds_may_come_as_a_column():
    rng = np.random.default_rng(14)
    _, same, fold, draw = _pairs(rng, n_per_stratum=20, folds=3)
    a, b = draw(), draw()
    flat = compare_kfold_accuracy(a, b, same, fold, resamples=10)
    column = compare_kfold_accuracy(a, b, same, fold[:, None], resamples=10)
    assert column == flat
    assert np.array_equal(
        correct_at_carried_threshold(a, same, fold[:, None]),
        correct_at_carried_threshold(a, same, fold),
    )


def test_correct_at_carried_threshold_names_bad_input():
    rng = np.random.default_rng(16)
    _, same, fold, draw = _pairs(rng)
    a = draw()
    cases = [
        ((np.stack([a, a]), same, fold), r"^scores must be \(pairs,\), got shape \(2, 600\)$"),
        ((np.full(600, np.inf), same, fold), "^scores contains NaN or inf$"),
        ((a, same[:5], fold), r"^is_genuine has 5 entries, expected 600$"),
        ((a, same, fold[:5]), r"^folds has 5 entries, expected 600$"),
    ]
    for args, message in cases:
        with pytest.raises(ValueError, match=message):
            correct_at_carried_threshold(*args)


def test_mcnemar_refuses_negative_counts():
    for b, c in ((-1, 3), (3, -1)):
        with pytest.raises(ValueError, match=rf"^counts must be >= 0, got {b} and {c}$"):
            mcnemar_exact_p(b, c)


def test_comparison_prints_points_interval_counts_and_p():
    from partialfc.eval.paired import PairedAccuracyComparison

    result = PairedAccuracyComparison(
        accuracy_a=0.8990,
        accuracy_b=0.9092,
        difference=-0.0102,
        interval=(-0.0169, 0.0057),
        confidence=0.95,
        resamples=2000,
        only_a_right=35,
        only_b_right=69,
        mcnemar_p=0.0012345,
        n_pairs=1109,
        n_repeats=3,
    )
    assert str(result) == "-1.02 points [-1.69, +0.57] (35 vs 69 pairs, McNemar p = 0.00123)"

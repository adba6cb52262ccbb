"""partialfc/eval/accuracy.py: every field of the results, the tie and edge rules of the
threshold search, the fold split, and the errors that name the argument."""

import numpy as np
import pytest

from partialfc.eval import accuracy_at_threshold, best_threshold, kfold_accuracy
from partialfc.eval.accuracy import fold_ids

# ten genuine and six impostor pairs; at t = 0.45 one impostor (0.52) is accepted and two
# genuines (0.38, 0.30) are rejected, and 0.45 itself is accepted (score >= t)
GENUINE = [0.91, 0.85, 0.80, 0.77, 0.72, 0.68, 0.61, 0.55, 0.38, 0.30]
IMPOSTOR = [0.52, 0.45, 0.39, 0.33, 0.27, 0.21]
SCORES = GENUINE + IMPOSTOR
SAME = [True] * 10 + [False] * 6


def test_accuracy_at_threshold_fills_every_field():
    a = accuracy_at_threshold(SCORES, SAME, 0.45)
    assert type(a.threshold) is float and a.threshold == 0.45
    assert (a.false_accepts, a.false_rejects) == (2, 2)  # 0.52 and 0.45 (accepted at >=)
    assert (a.accuracy.k, a.accuracy.n) == (12, 16)
    assert (a.n_genuine, a.n_impostor) == (10, 6)


def test_best_threshold_below_or_above_every_score_is_one_away():
    # all genuine: only a threshold below every score is right on all of them
    assert best_threshold([0.2, 0.7, 0.4], [True] * 3) == pytest.approx(0.2 - 1.0)
    # all impostor: only one above every score
    assert best_threshold([0.2, 0.7, 0.4], [False] * 3) == pytest.approx(0.7 + 1.0)


def test_best_threshold_takes_the_middle_of_equally_good_thresholds():
    # impostors and genuines alternate: 0.1 i, 0.3 g, 0.5 i, ..., 1.9 g. Cutting just above any
    # impostor (0.2, 0.6, 1.0, 1.4, 1.8) is right on 6 of 10; the middle of the five is 1.0
    impostor = [0.1, 0.5, 0.9, 1.3, 1.7]
    genuine = [0.3, 0.7, 1.1, 1.5, 1.9]
    scores = impostor + genuine
    same = [False] * 5 + [True] * 5
    for t in (0.2, 0.6, 1.0, 1.4, 1.8):
        assert accuracy_at_threshold(scores, same, t).accuracy.k == 6
    assert best_threshold(scores, same) == pytest.approx(1.0)


def test_fold_ids_are_contiguous_and_differ_by_at_most_one():
    assert fold_ids(10, 3).tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 2]
    assert fold_ids(4, 2).tolist() == [0, 0, 1, 1]  # two folds: the validation protocol
    assert fold_ids(3, 3).tolist() == [0, 1, 2]  # as many folds as pairs
    for n_folds in (1, 4):
        with pytest.raises(ValueError, match=rf"n_folds must be in \[2, 3\], got {n_folds}"):
            fold_ids(3, n_folds)


def test_kfold_accuracy_defaults_to_ten_contiguous_folds():
    rng = np.random.default_rng(0)
    scores = rng.normal(size=40)
    same = np.tile([True, False], 20)
    r = kfold_accuracy(scores, same)
    assert len(r.fold_accuracy) == 10 and [a.n for a in r.fold_accuracy] == [4] * 10
    assert r.n_pairs == 40
    # the same folds given explicitly, as a column, give the same result
    column = kfold_accuracy(scores, same, folds=fold_ids(40, 10)[:, None])
    assert [a.k for a in column.fold_accuracy] == [a.k for a in r.fold_accuracy]
    assert column.fold_threshold == r.fold_threshold


def test_kfold_accuracy_prints_mean_std_and_fold_count():
    scores = [0.8, 0.7, 0.55, 0.3, 0.9, 0.6, 0.4, 0.1, 0.95, 0.6, 0.4, 0.2]
    same = [1, 1, 0, 0, 1, 1, 0, 0, 1, 1, 0, 0]
    r = kfold_accuracy(scores, same, n_folds=3)  # folds right on 3, 4 and 4 of 4 pairs
    assert str(r) == "91.67 ± 11.79% (3 folds)"


@pytest.mark.parametrize(
    "call",
    [
        lambda s, g: accuracy_at_threshold(s, g, 0.5),
        best_threshold,
        kfold_accuracy,
    ],
    ids=["accuracy_at_threshold", "best_threshold", "kfold_accuracy"],
)
def test_bad_input_names_the_argument(call):
    good_scores = [0.1, 0.9, 0.4, 0.6]
    with pytest.raises(ValueError, match="^scores contains 1 non-finite"):
        call([0.1, np.nan, 0.4, 0.6], [0, 1, 0, 1])
    with pytest.raises(ValueError, match="^is_genuine has 3 entries, expected 4$"):
        call(good_scores, [0, 1, 0])
    with pytest.raises(ValueError, match="^is_genuine must be boolean"):
        call(good_scores, [0, 2, 0, 1])


def test_kfold_accuracy_refuses_folds_of_another_length():
    with pytest.raises(ValueError, match="^folds has 3 entries, expected 4$"):
        kfold_accuracy([0.1, 0.9, 0.4, 0.6], [0, 1, 0, 1], folds=[0, 1, 1])

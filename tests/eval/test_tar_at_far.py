"""TAR@FAR building blocks (partialfc/eval/tar_at_far.py): every returned field, the
confidence level, the zero-FAR rule, the ``>=`` acceptance at the threshold itself, and the
errors that name the argument."""

import numpy as np
import pytest

from partialfc.eval import (
    InsufficientPairsError,
    clopper_pearson,
    impostor_threshold,
    tar_at_far,
    tar_at_threshold,
    tar_at_zero_far,
)
from partialfc.eval.tar_at_far import next_above, threshold_from_top_impostors, top_descending


def _assert_interval(p, k, n, confidence):
    """``p`` is k of n with the Clopper-Pearson bounds at ``confidence``."""
    assert (p.k, p.n, p.confidence) == (k, n, confidence)
    assert (p.lower, p.upper) == pytest.approx(clopper_pearson(k, n, confidence))


def test_every_field_of_tar_at_far_by_hand():
    # 10 impostors, FAR 0.2 -> k = 2; the 3rd highest impostor is 0.6, so the threshold is the
    # next float64 above 0.6: impostors 0.9, 0.8 and genuine 0.7, 0.65 are accepted
    gen, imp = [0.7, 0.65, 0.6, 0.1], [0.9, 0.8, 0.6, 0.5] + [0.0] * 6
    r = tar_at_far(gen, imp, 0.2)
    assert r.target_far == 0.2 and r.allowed_false_accepts == 2
    assert r.threshold == np.nextafter(0.6, np.inf)
    _assert_interval(r.tar, 2, 4, 0.95)
    _assert_interval(r.far, 2, 10, 0.95)
    chosen = impostor_threshold(imp, 0.2)
    assert (chosen.target_far, chosen.threshold, chosen.allowed_false_accepts) == (
        0.2,
        r.threshold,
        2,
    )
    assert (chosen.false_accepts, chosen.n_impostor) == (2, 10)


def test_confidence_reaches_both_intervals():
    gen, imp = [0.7, 0.65, 0.6, 0.1], [0.9, 0.8, 0.6, 0.5] + [0.0] * 6
    r = tar_at_far(gen, imp, 0.2, confidence=0.5)
    _assert_interval(r.tar, 2, 4, 0.5)
    _assert_interval(r.far, 2, 10, 0.5)
    r = tar_at_threshold(gen, impostor_threshold(imp, 0.2), confidence=0.8)
    _assert_interval(r.tar, 2, 4, 0.8)
    _assert_interval(r.far, 2, 10, 0.8)
    z = tar_at_zero_far(gen, imp, confidence=0.5)
    _assert_interval(z.tar, 0, 4, 0.5)
    _assert_interval(z.far, 0, 10, 0.5)


def test_tar_at_threshold_defaults_to_95_percent():
    r = tar_at_threshold([0.7, 0.1], impostor_threshold([0.9, 0.5, 0.2, 0.1], 0.25))
    _assert_interval(r.tar, 1, 2, 0.95)
    _assert_interval(r.far, 1, 4, 0.95)


def test_a_score_equal_to_the_threshold_is_accepted():
    # the threshold is the next float64 above the 2nd impostor 0.5, i.e. exactly the highest
    # impostor and the genuine score: both are accepted (score >= threshold)
    above = float(np.nextafter(0.5, np.inf))
    imp = [above, 0.5] + [0.0] * 8
    r = tar_at_far([above, 0.5], imp, 0.1)
    assert r.threshold == above
    assert (r.far.k, r.tar.k) == (1, 1)
    chosen = threshold_from_top_impostors(np.array([above, 0.5]), 10, 0.1)
    assert chosen.false_accepts == 1


def test_far_one_reports_its_target():
    chosen = threshold_from_top_impostors(np.array([0.3, 0.1]), 2, 1.0)
    assert (chosen.target_far, chosen.threshold, chosen.false_accepts) == (1.0, -np.inf, 2)


def test_integer_scores_give_the_threshold_of_their_float_values():
    # e.g. a matcher's 0..255 scale: descending uint8 scores are sorted, not wrapped around
    top = np.array([200, 120, 90, 3], dtype=np.uint8)
    chosen = threshold_from_top_impostors(top, 10, 0.2)
    assert chosen.threshold == np.nextafter(90.0, np.inf) and chosen.false_accepts == 2


def test_a_row_of_top_scores_is_read_as_its_values():
    top = np.array([[0.9, 0.8, 0.6, 0.5]])  # shape (1, 4)
    chosen = threshold_from_top_impostors(top, 10, 0.2)
    assert chosen.threshold == np.nextafter(0.6, np.inf) and chosen.false_accepts == 2


def test_zero_far_threshold_is_the_lowest_genuine_strictly_above_every_impostor():
    # 0.5 ties the best impostor, so it is not above it: threshold 0.9, TAR 1 of 2
    z = tar_at_zero_far([0.5, 0.9], [0.5, 0.1])
    assert z.threshold == 0.9 and z.tar.k == 1
    assert (z.target_far, z.allowed_false_accepts, z.far.k, z.far.n) == (0.0, 0, 0, 2)


def test_zero_far_with_no_genuine_above_is_just_above_the_best_impostor():
    z = tar_at_zero_far([0.2, 0.5], [0.5, 0.1])
    assert z.threshold == np.nextafter(0.5, np.inf) and z.tar.k == 0
    assert (z.target_far, z.allowed_false_accepts) == (0.0, 0)


def test_top_descending_counts_and_order():
    s = np.array([0.3, 0.9, 0.1, 0.5])
    assert top_descending(s, 0).size == 0
    assert top_descending(s, -3).size == 0
    assert top_descending(s, 1).tolist() == [0.9]
    assert top_descending(s, 2).tolist() == [0.9, 0.5]
    assert top_descending(s, 4).tolist() == [0.9, 0.5, 0.3, 0.1]
    assert top_descending(s, 9).tolist() == [0.9, 0.5, 0.3, 0.1]


def test_next_above_steps_in_the_given_precision():
    assert next_above(0.5) == np.nextafter(0.5, 1.0)
    assert next_above(0.1, np.float32) == float(np.float32(0.1))  # float32(0.1) > 0.1
    assert next_above(0.5, np.float32) == float(np.nextafter(np.float32(0.5), np.float32(1)))
    with pytest.raises(ValueError, match=r"^score_dtype must be a floating dtype, got int32$"):
        next_above(0.5, np.int32)


def test_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^impostor contains 1 non-finite value\(s\)$"):
        tar_at_far([0.5], [0.1, np.nan], 0.5)
    with pytest.raises(ValueError, match=r"^impostor is empty$"):
        impostor_threshold([], 0.5)
    with pytest.raises(ValueError, match=r"^genuine contains 1 non-finite value\(s\)$"):
        tar_at_far([np.inf], [0.1, 0.2], 0.5)
    with pytest.raises(ValueError, match=r"^genuine is empty$"):
        tar_at_threshold([], impostor_threshold([0.1, 0.2], 0.5))
    with pytest.raises(ValueError, match=r"^genuine is empty$"):
        tar_at_zero_far([], [0.1])
    with pytest.raises(ValueError, match=r"^impostor is empty$"):
        tar_at_zero_far([0.1], [])
    with pytest.raises(ValueError, match=r"^target_far must be in \(0, 1\], got 1\.5$"):
        threshold_from_top_impostors(np.array([0.2, 0.1]), 2, 1.5)


def test_insufficient_pairs_says_how_many_are_needed():
    with pytest.raises(InsufficientPairsError) as err:
        threshold_from_top_impostors(np.zeros(3), 3, 0.25, what="probes")
    # 1 / 0.25 = 4 pairs for one false accept, 100 / 0.25 = 400 for +-10%
    assert str(err.value) == (
        "only 3 probes — cannot resolve FAR = 0.25: at least 4 are needed to admit one false "
        "accept, and about 400 to measure it to ±10%"
    )


def test_too_short_or_unsorted_head_is_refused():
    # FAR 0.2 of 10 -> k = 2 -> the top 3 scores are needed
    for kept in (0, 1, 2):
        with pytest.raises(ValueError, match=rf"^top_impostor_desc: need the top 3 .* got {kept}$"):
            threshold_from_top_impostors(np.array([0.9, 0.8][:kept]), 10, 0.2)
    with pytest.raises(ValueError, match=r"^top_impostor_desc must be sorted in descending order$"):
        threshold_from_top_impostors(np.array([0.8, 0.9, 0.7]), 10, 0.2)

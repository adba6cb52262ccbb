"""The TAR@FAR threshold rule against a brute-force maximum, on every path that uses it:
exact scores, the all-pairs summary, open-set FNIR@FPIR and the deployment calibration."""

import numpy as np
import pytest

from partialfc.deploy import decide, threshold_from_impostors
from partialfc.eval import InsufficientPairsError, tar_at_far
from partialfc.eval.identification import MatedSearch, open_set_identification
from partialfc.eval.pair_scoring import PairScoreSummary


def brute_force_max_tar(gen, imp, far):
    """Largest #{genuine >= t} over every threshold t with #{impostor >= t} <= k."""
    gen, imp = np.asarray(gen, dtype=np.float64), np.asarray(imp, dtype=np.float64)
    k = int(np.floor(far * imp.size + 1e-9))
    candidates = np.r_[np.unique(np.r_[gen, imp]), np.inf]
    admissible = [t for t in candidates if np.count_nonzero(imp >= t) <= k]
    return max(np.count_nonzero(gen >= t) for t in admissible), min(admissible), k


def summary_of(gen, imp, keep=None):
    """A pair-score summary holding the ``keep`` highest impostor scores (all by default)."""
    top = np.sort(np.asarray(imp, dtype=np.float64))[::-1]
    return PairScoreSummary(
        n_impostor=len(imp),
        impostor_histogram=np.zeros(1, dtype=np.int64),
        top_impostor_scores=top if keep is None else top[:keep],
        genuine_scores=np.asarray(gen, dtype=np.float64),
    )


def verifier_true_accepts(gen, threshold):
    """Genuine pairs that ``decide`` accepts, fed unit vectors whose float32 cosine is the
    genuine score."""
    g = np.asarray(gen, dtype=np.float32)
    a = np.tile(np.array([1.0, 0.0], dtype=np.float32), (g.size, 1))
    b = np.stack([g, np.sqrt(1 - g.astype(np.float64) ** 2).astype(np.float32)], axis=1)
    v = decide(a, b, threshold)
    np.testing.assert_array_equal(v.score, g)
    return int(v.accept.sum())


def every_path(gen, imp, far):
    """(true accepts, false accepts) from each path at ``far``."""
    exact = tar_at_far(gen, imp, far)
    k = exact.allowed_false_accepts
    pairs = summary_of(gen, imp).tar_at_far(far)
    head_only = summary_of(gen, imp, keep=min(k + 1, len(imp))).tar_at_far(far)
    mated = MatedSearch(ranks=np.ones(len(gen), dtype=np.int64), mated_scores=np.asarray(gen))
    (open_set,) = open_set_identification(mated, imp, target_fpirs=[far])
    calibrated = threshold_from_impostors(imp, far)
    return {
        "tar_at_far": (exact.tar.k, exact.far.k),
        "score_all_pairs summary": (pairs.tar.k, pairs.far.k),
        "summary, top k+1 kept": (head_only.tar.k, head_only.far.k),
        "open-set FNIR@FPIR": (open_set.fnir.n - open_set.fnir.k, open_set.fpir.k),
        "calibrate + decide": (verifier_true_accepts(gen, calibrated), calibrated.false_accepts),
    }


def test_minimal_case_by_hand():
    # impostors 0.9, 0.5 and eight 0.0; FAR 0.1 -> k = 1 false accept allowed. Accepting
    # score >= t with t just above 0.5 admits one impostor (0.9) and the genuine 0.7; a
    # threshold at the highest impostor (0.9) would accept no genuine pair at all.
    gen, imp = [0.7], [0.9, 0.5] + [0.0] * 8
    r = tar_at_far(gen, imp, 0.1)
    assert r.allowed_false_accepts == 1
    assert r.threshold == np.nextafter(0.5, 1.0)
    assert (r.tar.k, r.tar.n, r.far.k, r.far.n) == (1, 1, 1, 10)
    for path, counts in every_path(gen, imp, 0.1).items():
        assert counts == (1, 1), path


def test_every_path_reaches_the_brute_force_maximum_on_tied_scores():
    """200 seeded cases; scores are multiples of 1/8 (exact in float32), so ties between
    impostors, between genuine scores and across the two are frequent."""
    rng = np.random.default_rng(13)
    levels = np.arange(-8, 9) / 8.0
    refused = 0
    for case in range(200):
        gen = rng.choice(levels, size=rng.integers(1, 15))
        imp = rng.choice(levels[rng.integers(0, 8) :], size=rng.integers(1, 25))
        far = float(rng.choice([0.04, 0.1, 0.2, 0.25, 0.5, 1.0]))
        best, lowest, k = brute_force_max_tar(gen, imp, far)
        if k == 0:
            refused += 1
            with pytest.raises(InsufficientPairsError):
                tar_at_far(gen, imp, far)
            with pytest.raises(InsufficientPairsError):
                threshold_from_impostors(imp, far)
            continue
        r = tar_at_far(gen, imp, far)
        assert r.far.k == np.count_nonzero(imp >= r.threshold) <= k, case
        # the lowest admissible threshold: nothing between it and the brute-force lowest
        assert not np.any((np.r_[gen, imp] >= lowest) & (np.r_[gen, imp] < r.threshold)), case
        for path, (true_accepts, false_accepts) in every_path(gen, imp, far).items():
            assert true_accepts == best, (case, path)
            assert false_accepts == np.count_nonzero(imp >= lowest) <= k, (case, path)
    assert 10 < refused < 100  # both branches exercised


def test_far_one_accepts_everything():
    r = tar_at_far([-0.5, 0.2], [0.0, 0.1, 0.3], 1.0)
    assert r.threshold == -np.inf and (r.tar.k, r.far.k, r.allowed_false_accepts) == (2, 3, 3)


def test_bad_arguments_name_themselves():
    with pytest.raises(ValueError, match="target_far must be in"):
        tar_at_far([0.5], [0.1, 0.2], 0.0)
    with pytest.raises(ValueError, match="top_impostor_desc must be sorted"):
        summary = summary_of([0.5], [0.1, 0.2, 0.3])
        summary.top_impostor_scores = summary.top_impostor_scores[::-1]
        summary.tar_at_far(0.5)
    with pytest.raises(ValueError, match="impostor_scores: 1 of 2 are NaN or inf"):
        threshold_from_impostors(np.array([0.1, np.nan]), 0.5)

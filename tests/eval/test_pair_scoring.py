"""Blockwise all-pairs scoring equals the exact all-pairs computation on a moderate set."""

import numpy as np
import pytest

from partialfc.eval import roc_curve, tar_at_far
from partialfc.eval.pair_scoring import _bin_index, count_scores_at_least, score_all_pairs


def _clustered(rng, n_ids, per_id, d, noise):
    centers = rng.normal(size=(n_ids, d))
    x = np.repeat(centers, per_id, 0) + noise * rng.normal(size=(n_ids * per_id, d))
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    labels = np.repeat(np.arange(n_ids), per_id)
    perm = rng.permutation(len(x))  # rows in no particular order
    return x[perm].astype(np.float32), labels[perm]


def _exact(x, labels):
    s = x.astype(np.float64) @ x.T.astype(np.float64)
    iu = np.triu_indices(len(x), 1)
    same = labels[iu[0]] == labels[iu[1]]
    return s[iu][same], s[iu][~same]


def test_blockwise_summary_equals_exact_pairs():
    rng = np.random.default_rng(0)
    x, labels = _clustered(rng, n_ids=300, per_id=5, d=32, noise=0.9)
    gen, imp = _exact(x, labels)
    summary = score_all_pairs(x, labels, block=256, sub_block=64, n_bins=4096, keep_top=2000)
    assert summary.n_impostor == imp.size == 1500 * 1499 // 2 - 300 * 10
    np.testing.assert_allclose(np.sort(summary.genuine_scores), np.sort(gen), atol=1e-5)
    np.testing.assert_allclose(summary.top_impostor_scores, np.sort(imp)[::-1][:2000], atol=1e-5)
    exact_hist = np.bincount(_bin_index(imp, 4096), minlength=4096)
    assert summary.impostor_histogram.sum() == imp.size
    # float32 tiles vs the float64 reference: only scores within float32 rounding of a bin
    # edge may land in the neighbouring bin
    pos = (imp + 1.0) * 2048
    near_edge = np.count_nonzero(np.abs(pos - np.round(pos)) < 2048 * 2e-6)
    moved = np.abs(summary.impostor_histogram - exact_hist).sum()
    assert moved <= 2 * near_edge
    for far in (1e-4, 1e-3):
        fast, ref = summary.tar_at_far(far), tar_at_far(gen, imp, far)
        assert fast.allowed_false_accepts == ref.allowed_false_accepts
        assert fast.threshold == pytest.approx(ref.threshold, abs=1e-5)
        assert fast.tar.k == ref.tar.k and fast.far.k == ref.far.k
        # the threshold is a float32 value, so the float32 second pass counts the same pairs
        again = count_scores_at_least(x, [fast.threshold], labels, block=256)
        assert again["thresholds"][0] == fast.threshold
        assert (again["impostor"][0], again["genuine"][0]) == (fast.far.k, fast.tar.k)
    with pytest.raises(ValueError, match="larger keep_top"):
        summary.tar_at_far(0.1)
    roc = summary.roc()
    assert roc.auc == pytest.approx(roc_curve(gen, imp).auc, abs=1e-3)


def test_second_pass_counts_are_exact():
    rng = np.random.default_rng(1)
    x, labels = _clustered(rng, n_ids=100, per_id=4, d=16, noise=1.0)
    gen, imp = _exact(x, labels)
    thresholds = [0.9, 0.5, 0.2, 0.0]
    counts = count_scores_at_least(x, thresholds, labels, block=64)
    np.testing.assert_array_equal(counts["thresholds"], np.sort(np.float32(thresholds)))
    for t, ni, ng in zip(counts["thresholds"], counts["impostor"], counts["genuine"], strict=True):
        assert ni == np.count_nonzero(imp >= t) and ng == np.count_nonzero(gen >= t)


def test_no_labels_means_every_pair_is_impostor():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(130, 8)).astype(np.float32)
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    summary = score_all_pairs(x, block=50, sub_block=16, keep_top=100)
    assert summary.n_impostor == 130 * 129 // 2 and summary.genuine_scores.size == 0
    _, imp = _exact(x, np.arange(130))
    np.testing.assert_allclose(summary.top_impostor_scores, np.sort(imp)[::-1][:100], atol=1e-6)

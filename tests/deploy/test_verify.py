"""Calibrated thresholds: hand-worked values, brute-force agreement, FAR realised on held-out
impostors of real Omniglot embeddings."""

from __future__ import annotations

import numpy as np
import pytest

from partialfc.deploy import (
    CalibratedThreshold,
    Embedder,
    Verifier,
    calibrate,
    decide,
    threshold_from_impostors,
)
from partialfc.eval import InsufficientPairsError


def test_threshold_from_hand_worked_impostors():
    # 10 impostors, FAR 0.2 -> k = 2 false accepts allowed -> the lowest threshold keeping
    # them is just above the 3rd highest score, 0.70 (in float32, the verification precision)
    scores = np.array([0.10, 0.90, 0.30, 0.80, 0.20, 0.70, 0.40, 0.60, 0.50, 0.05])
    t = threshold_from_impostors(scores, 0.2)
    assert (t.allowed_false_accepts, t.false_accepts, t.n_impostor) == (2, 2, 10)
    # float32(0.7) = 0.69999999 rounds down, so the threshold is the float32 after it
    assert float(np.float32(0.70)) < 0.70
    assert t.threshold == float(np.nextafter(np.float32(0.70), np.float32(1)))
    assert t.threshold == 0.7000000476837158
    # a tie across position k rejects the whole tie: never more than k accepts
    tied = threshold_from_impostors(np.array([0.9, 0.8, 0.8, 0.1]), 0.5)
    assert tied.false_accepts == 1
    # float32(0.8) = 0.80000001 already lies above 0.8: it is the smallest float32 above it
    assert tied.threshold == float(np.float32(0.8)) == 0.800000011920929
    with pytest.raises(InsufficientPairsError):
        threshold_from_impostors(scores, 0.05)  # FAR below 1 / 10 cannot be resolved


def test_float32_cosine_equal_to_the_boundary_impostor_is_rejected():
    """``decide`` scores in float32: a cosine equal to the (k+1)-th highest calibration
    impostor must be rejected there too, and the next float32 cosine above it accepted."""
    boundary = np.float32(0.3)  # not representable in float64 steps: float32(0.3) != 0.3
    scores = np.array([0.9, boundary, 0.1, 0.0], dtype=np.float32)
    t = threshold_from_impostors(scores, 0.25)  # k = 1
    assert t.false_accepts == 1
    above = np.nextafter(boundary, np.float32(1.0))
    a = np.array([[1.0, 0.0], [1.0, 0.0]], dtype=np.float32)
    b = np.array([[boundary, 0.0], [above, 0.0]], dtype=np.float32)
    v = decide(a, b, t)
    assert v.score.tolist() == [boundary, above]
    assert v.accept.tolist() == [False, True]


def brute_force_impostors(embeddings, labels):
    s = embeddings @ embeddings.T
    i, j = np.triu_indices(len(labels), k=1)
    return s[i, j][labels[i] != labels[j]]


@pytest.fixture(scope="module")
def halves(small_model, omniglot_images):
    """Embeddings of 100 classes, each class's 20 drawings split 10/10 at random."""
    model, spec = small_model
    images, labels = omniglot_images
    e = Embedder.from_module(model, spec).embed(images)
    rng = np.random.default_rng(0)
    first = np.zeros(len(labels), dtype=bool)
    for c in range(100):
        first[c * 20 + rng.permutation(20)[:10]] = True
    return (e[first], labels[first]), (e[~first], labels[~first])


def test_calibrate_agrees_with_brute_force(halves):
    (e, labels), _ = halves
    t = calibrate(e, labels, target_far=1e-3)
    impostors = brute_force_impostors(e, labels)
    assert t.n_impostor == impostors.size == 1000 * 999 // 2 - 100 * 45
    k = int(np.floor(1e-3 * impostors.size))
    assert t.allowed_false_accepts == k
    # just above the (k+1)-th highest impostor (blockwise and direct GEMMs may round apart)
    assert t.threshold == pytest.approx(np.sort(impostors)[::-1][k], abs=1e-6)
    assert np.sort(impostors)[::-1][k] < t.threshold
    assert t.false_accepts == np.count_nonzero(impostors >= t.threshold) == k


def test_calibrated_far_holds_on_independent_held_out_impostors():
    """Independent impostor scores: the FAR realised on a large held-out set falls inside the
    calibration's 95% Clopper–Pearson interval in about 95% of repetitions."""
    inside = 0
    for seed in range(20):
        rng = np.random.default_rng(seed)
        t = threshold_from_impostors(rng.normal(0.0, 0.1, 100_000), 1e-3)  # k = 100
        held = rng.normal(0.0, 0.1, 1_000_000)
        realised = np.count_nonzero(held >= t.threshold) / held.size
        low, high = t.far_interval_95
        inside += low <= realised <= high
        assert 0.5e-3 < realised < 1.5e-3  # 1/sqrt(100) = 10% relative error, 5 sigma
    assert inside >= 17  # P(<= 16 of 20 | 95% coverage) = 1.6%


@pytest.mark.parametrize("target_far", [1e-2, 1e-3])
def test_calibrated_threshold_realises_its_far_on_held_out_omniglot(halves, target_far):
    """Real embeddings, held-out drawings of the same classes. All-pairs scores share images
    (each image is in ~990 pairs), so they are not independent and a binomial interval on the
    pair count is too narrow; over random splits the realised/target ratio spans 0.88-1.22."""
    (e_cal, l_cal), (e_held, l_held) = halves
    t = calibrate(e_cal, l_cal, target_far)
    held = brute_force_impostors(e_held, l_held)
    realised = np.count_nonzero(held >= t.threshold) / held.size
    assert 0.75 < realised / target_far < 1.33, realised


def test_verifier_decides_with_the_calibrated_threshold(small_model, omniglot_images, tmp_path):
    model, spec = small_model
    images, _ = omniglot_images
    embedder = Embedder.from_module(model, spec)
    t = CalibratedThreshold(0.5, 1e-3, 10, 10, 10_000, (5e-4, 2e-3), embedder.model_sha256)
    t.save(tmp_path / "t.json")
    loaded = CalibratedThreshold.load(tmp_path / "t.json")
    assert loaded == t
    verifier = Verifier(embedder, loaded)
    result = verifier.verify(images[:6], images[1:7])
    e = Embedder.from_module(model, spec).embed(images[:7])
    expected = np.sum(e[:6] * e[1:7], axis=1)
    np.testing.assert_allclose(result.score, expected, atol=1e-6)
    np.testing.assert_array_equal(result.accept, expected >= 0.5)
    assert decide(e[:1], e[:1], loaded).accept.all()  # an image matches itself


def test_threshold_file_errors_name_the_file(tmp_path):
    path = tmp_path / "t.json"
    path.write_text('{"format": "partialfc.gallery"}')
    with pytest.raises(ValueError, match="t.json: not a calibrated threshold file"):
        CalibratedThreshold.load(path)

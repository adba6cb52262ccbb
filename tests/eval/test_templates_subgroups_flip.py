"""Templates, media pooling, the flip test, and a worked Gaussian example of a demographic
false-match differential."""

import numpy as np
import pytest
from scipy.stats import norm

from partialfc.eval.embedding import embed_images, resize_images, with_input_size
from partialfc.eval.subgroups import subgroup_report
from partialfc.eval.templates import pool_media_templates, pool_templates


def test_templates_average_raw_then_normalise():
    emb = np.array([[3.0, 0.0], [0.0, 1.0], [0.0, 2.0]])
    ids, t = pool_templates(emb, ["b", "b", "a"])
    assert ids.tolist() == ["a", "b"]
    np.testing.assert_allclose(t[1], np.array([1.5, 0.5]) / np.hypot(1.5, 0.5), rtol=1e-6)
    np.testing.assert_allclose(t[0], [0.0, 1.0])


def test_media_pooling_weights_media_not_frames():
    # template 7: three frames of one video along x, one still along y
    emb = np.array([[1.0, 0], [1.0, 0], [1.0, 0], [0, 1.0], [0, 5.0]])
    tids, mids = [7, 7, 7, 7, 8], [100, 100, 100, 200, 300]
    ids, t = pool_media_templates(emb, tids, mids)
    np.testing.assert_allclose(t[0], [2**-0.5, 2**-0.5], rtol=1e-6)
    _, plain = pool_templates(emb, tids)
    np.testing.assert_allclose(plain[0], [3 / 10**0.5, 1 / 10**0.5], rtol=1e-6)
    assert ids.tolist() == [7, 8]


def test_flip_test_sums_raw_embeddings_before_normalising():
    # e(x) = [2*x0 + x1, x1] on 1x2 images: x = [1, 3] -> [5, 3]; flipped [3, 1] -> [7, 1]
    def embed(images):
        x = images.reshape(len(images), 2).astype(np.float32)
        return np.stack([2 * x[:, 0] + x[:, 1], x[:, 1]], 1)

    images = np.array([[[1, 3]], [[2, 2]]], dtype=np.uint8)
    out = embed_images(embed, images, flip=True, batch_size=1)
    np.testing.assert_allclose(out[0], np.array([12, 4]) / np.hypot(12, 4), rtol=1e-6)
    np.testing.assert_allclose(out[1], np.array([12, 4]) / np.hypot(12, 4), rtol=1e-6)
    raw = embed_images(embed, images, flip=True, normalize=False)
    np.testing.assert_allclose(raw[0], [12, 4])  # raw sum kept for template pooling
    plain = embed_images(embed, images)
    np.testing.assert_allclose(plain[0], np.array([5, 3]) / np.hypot(5, 3), rtol=1e-6)
    with pytest.raises(ValueError, match="uint8"):
        embed_images(embed, images.astype(np.float32))


def test_resize_to_model_input_size():
    grey = np.zeros((2, 112, 92), np.uint8)
    grey[:, :56] = 200  # top half bright
    out = resize_images(grey, (28, 28))
    assert out.shape == (2, 28, 28) and out[0, :14].min() == 200 and out[0, 14:].max() == 0
    rgb = np.full((1, 10, 10, 3), 7, np.uint8)
    assert resize_images(rgb, (20, 30)).shape == (1, 20, 30, 3)
    assert resize_images(rgb, (10, 10)) is rgb
    shapes = []
    with_input_size(lambda x: shapes.append(x.shape) or np.ones((len(x), 2)), (5, 6))(rgb)
    assert shapes == [(1, 5, 6, 3)]


# A worked example of the differentials NIST measured (FRVT Part 3, Grother et al., NISTIR 8280,
# 2019): impostor scores N(0, 0.05) for group B and N(0.05, 0.05) for group A, one shared
# threshold t = 0.25.
SIGMA, MEAN_A, MEAN_B, T = 0.05, 0.05, 0.0, 0.25


def test_gaussian_demographic_analytic():
    fmr_a = norm.sf(T, MEAN_A, SIGMA)  # Q(4)
    fmr_b = norm.sf(T, MEAN_B, SIGMA)  # Q(5)
    assert fmr_a == pytest.approx(3.167e-5, rel=1e-3)
    assert fmr_b == pytest.approx(2.867e-7, rel=1e-3)
    assert 100 < fmr_a / fmr_b < 120  # a hundredfold difference from a one-sigma shift


def test_gaussian_demographic_sampled_at_shared_threshold():
    rng = np.random.default_rng(6)
    n_a, n_b = 2_000_000, 20_000_000
    z = rng.standard_normal(n_a + n_b, dtype=np.float32)
    imp = SIGMA * z + np.repeat(np.float32([MEAN_A, MEAN_B]), [n_a, n_b])
    groups = np.repeat(np.array([0, 1], dtype=np.int8), [n_a, n_b])  # 0 = A, 1 = B
    gen = rng.normal(0.6, 0.1, 2000)
    report = subgroup_report(T, gen, np.repeat([0, 1], 1000), imp, groups)
    a, b = report.groups
    assert (a.group, a.fmr.n, b.fmr.n) == ("0", n_a, n_b)
    # the analytic rates lie inside the per-group 95% Clopper-Pearson intervals
    assert a.fmr.lower < norm.sf(T, MEAN_A, SIGMA) < a.fmr.upper
    assert b.fmr.lower < norm.sf(T, MEAN_B, SIGMA) < b.fmr.upper
    assert a.fmr.k > 30 and b.fmr.k >= 1  # counts that back the rates
    assert report.fmr_max_over_min > 30  # two orders of magnitude, within sampling noise
    assert "| 0 |" in report.to_markdown()

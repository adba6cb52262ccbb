"""Within-class whitening (WCCN): the projection recomputed independently, its effect on a
verification problem with a nuisance direction, and its errors."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.linalg import sqrtm

from partialfc.eval import roc_auc
from partialfc.models.whitening import WithinClassWhitening


def _people(rng, n_people=40, per_person=5, dim=6, nuisance=5.0):
    """Identity signal of norm ~1 in every dimension, plus a large within-person nuisance
    along the last dimension (lighting, pose)."""
    centres = rng.normal(size=(n_people, dim))
    labels = np.repeat(np.arange(n_people), per_person)
    noise = 0.3 * rng.normal(size=(len(labels), dim))
    noise[:, -1] += nuisance * rng.normal(size=len(labels))
    return centres[labels] + noise, labels


def _within_class_covariance(x, labels):
    """Independently: the sum over identities of np.cov's scatter, over N."""
    total = np.zeros((x.shape[1], x.shape[1]))
    for k in np.unique(labels):
        rows = x[labels == k]
        total += np.cov(rows, rowvar=False, bias=True) * len(rows)
    return total / len(x)


@pytest.mark.parametrize("regularization", [0.0, 0.5, 2.0])
def test_projection_is_the_inverse_square_root_of_the_ridged_covariance(regularization):
    x, labels = _people(np.random.default_rng(0))
    w = WithinClassWhitening(regularization).fit(x, labels)
    s_w = _within_class_covariance(x, labels)
    ridged = s_w + regularization * np.trace(s_w) / len(s_w) * np.eye(len(s_w))
    expected = np.linalg.inv(np.real(sqrtm(ridged)))
    np.testing.assert_allclose(w.projection, expected, rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(w.transform(x), x @ expected, rtol=1e-5, atol=1e-5)


def test_plain_whitening_gives_unit_within_class_covariance():
    x, labels = _people(np.random.default_rng(1))
    mapped = WithinClassWhitening(0.0).fit(x, labels).transform(x).astype(np.float64)
    np.testing.assert_allclose(_within_class_covariance(mapped, labels), np.eye(6), atol=1e-5)


def test_a_huge_ridge_keeps_the_cosines():
    x, labels = _people(np.random.default_rng(2))
    mapped = WithinClassWhitening(1e9).fit(x, labels).transform(x)

    def cos(z):
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
        return z @ z.T

    np.testing.assert_allclose(cos(mapped), cos(x), atol=1e-6)


def test_whitening_learned_on_some_people_separates_unseen_people():
    rng = np.random.default_rng(3)
    x, labels = _people(rng, n_people=80)
    train, test = labels < 40, labels >= 40
    w = WithinClassWhitening(1.0).fit(x[train], labels[train])

    def auc(z, y):
        z = z / np.linalg.norm(z, axis=1, keepdims=True)
        s, same = z @ z.T, y[:, None] == y[None, :]
        upper = np.triu(np.ones_like(same), 1).astype(bool)
        return roc_auc(s[upper & same], s[upper & ~same])

    before, after = auc(x[test], labels[test]), auc(w.transform(x[test]), labels[test])
    assert before < 0.7 and after > 0.8  # the nuisance direction no longer dominates


def test_bad_input_is_a_clear_error():
    x, labels = _people(np.random.default_rng(4))
    with pytest.raises(ValueError, match="regularization"):
        WithinClassWhitening(-1.0)
    with pytest.raises(ValueError, match="regularization"):
        WithinClassWhitening(float("nan"))
    with pytest.raises(ValueError, match="labels"):
        WithinClassWhitening().fit(x, labels[:-1])
    with pytest.raises(ValueError, match="two embeddings"):
        WithinClassWhitening().fit(x[:10], np.arange(10))
    bad = x.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        WithinClassWhitening().fit(bad, labels)
    with pytest.raises(ValueError, match="singular"):
        WithinClassWhitening(0.0).fit(np.zeros((4, 3)), np.array([0, 0, 1, 1]))
    with pytest.raises(ValueError, match="identical"):  # no ridge can help a zero covariance
        WithinClassWhitening(1.0).fit(np.ones((4, 3)), np.array([0, 0, 1, 1]))
    with pytest.raises(RuntimeError, match="before fit"):
        WithinClassWhitening().transform(x)
    with pytest.raises(ValueError, match=r"\(N, 6\)"):
        WithinClassWhitening().fit(x, labels).transform(x[:, :5])

"""experiments/omniglot_whitening.py: the map is applied, learned on training drawings only."""

from __future__ import annotations

import types

import numpy as np
import pytest

from experiments import omniglot_whitening


def test_whitened_multiplies_by_the_projection():
    rng = np.random.default_rng(0)
    weights = rng.normal(size=(12, 5))
    projection = rng.normal(size=(5, 5))
    projection = projection + projection.T

    def embed(images):
        return images.reshape(len(images), -1) @ weights

    images = rng.normal(size=(7, 3, 4))
    expected = (images.reshape(7, -1) @ weights) @ projection
    got = omniglot_whitening.whitened(embed, projection)(images)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)


class _PixelProjection:
    """A stand-in model: a fixed random projection of the pixels to 16 dimensions."""

    def __init__(self):
        self.weights = np.random.default_rng(1).normal(size=(28 * 28, 16)).astype(np.float32)
        self.spec = types.SimpleNamespace(input_size=(28, 28))
        self.seen = []

    def embed_raw(self, images, flip=False, batch_size=256):
        self.seen.append(len(images))
        return images.reshape(len(images), -1).astype(np.float32) @ self.weights


def test_a_huge_ridge_scores_like_the_cosine_and_training_excludes_the_holdout(monkeypatch):
    from partialfc.backbone import embedder as embedder_module

    model = _PixelProjection()
    monkeypatch.setattr(embedder_module.Embedder, "load", classmethod(lambda cls, p: model))
    out = omniglot_whitening.evaluate_run("stub", "5", [1e9, 0.0])
    # 964 background classes minus the 205 of the five held-out alphabets, 20 drawings each
    assert out["train_drawings"] == 759 * 20 == model.seen[0]
    assert out["cosine"]["one_shot_trials"] == 2000
    # λ → ∞: P → c·I, and the cosine is scale-free
    assert out["wccn 1e+09"]["one_shot_hits"] == out["cosine"]["one_shot_hits"]
    assert out["wccn 1e+09"]["auc"] == pytest.approx(out["cosine"]["auc"], abs=1e-4)
    # plain whitening (λ = 0) changes the scores of this pixel model
    assert out["wccn 0"]["one_shot_hits"] != out["cosine"]["one_shot_hits"]


def test_no_held_out_alphabet_is_refused(tmp_path, capsys):
    code = omniglot_whitening.main(["stub", "--holdout", "0", "--out", str(tmp_path / "o.json")])
    assert code == 2
    assert "holds out no alphabet" in capsys.readouterr().err
    assert not (tmp_path / "o.json").exists()

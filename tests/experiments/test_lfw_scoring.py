"""Post-hoc scoring rules: Joint Bayesian is the Gaussian log-likelihood ratio, LDA finds the
between-class directions, and the driver's cosine and whitening rows are the recipe's."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import multivariate_normal

from experiments import lfw_face_recipe as recipe_mod
from experiments import lfw_scoring


def _identities(rng, people=40, per_person=5, d=4, spread=(3.0, 2.0, 1.0, 0.5), noise=0.4):
    centres = rng.normal(size=(people, d)) * np.array(spread[:d])
    labels = np.repeat(np.arange(people), per_person)
    return centres[labels] + noise * rng.normal(size=(len(labels), d)), labels


def test_joint_bayesian_is_the_gaussian_log_likelihood_ratio():
    rng = np.random.default_rng(0)
    x, labels = _identities(rng)
    x = x - x.mean(0)
    jb = lfw_scoring.JointBayesian(ridge=0.0).fit(x, labels)
    # the model's covariances, estimated here independently of the class
    means = np.stack([x[labels == c].mean(0) for c in range(40)])
    s_eps = np.cov((x - means[labels]).T, bias=True)
    s_mu = np.cov(means.T, bias=True)
    same = np.block([[s_mu + s_eps, s_mu], [s_mu, s_mu + s_eps]])
    apart = np.block([[s_mu + s_eps, 0 * s_mu], [0 * s_mu, s_mu + s_eps]])
    a, b = rng.normal(size=(6, 4)), rng.normal(size=(6, 4))
    joint = np.concatenate([a, b], axis=1)
    llr = multivariate_normal(cov=same).logpdf(joint) - multivariate_normal(cov=apart).logpdf(joint)
    constant = 0.5 * (np.linalg.slogdet(apart)[1] - np.linalg.slogdet(same)[1])
    np.testing.assert_allclose(jb.score(a, b), llr - constant, rtol=1e-9, atol=1e-9)
    # symmetric, and a person's two photos score above two people's
    np.testing.assert_allclose(jb.score(a, b), jb.score(b, a), rtol=1e-12)
    genuine = jb.score(x[0::5], x[1::5])
    impostor = jb.score(x[0::5], np.roll(x[1::5], 1, axis=0))
    assert genuine.mean() > impostor.mean() + 1.0


def test_joint_bayesian_refuses_bad_input():
    with pytest.raises(ValueError, match="ridge"):
        lfw_scoring.JointBayesian(ridge=-1.0)
    with pytest.raises(ValueError, match="two embeddings"):
        lfw_scoring.JointBayesian().fit(np.eye(3), np.arange(3))
    with pytest.raises(RuntimeError, match="before fit"):
        lfw_scoring.JointBayesian().score(np.eye(3), np.eye(3))


def test_lda_finds_the_axes_the_identities_spread_along():
    rng = np.random.default_rng(1)
    x, labels = _identities(rng, people=200, spread=(0.1, 5.0, 0.1, 2.0), noise=0.05)
    v = lfw_scoring.lda_projection(x, labels, 2)
    assert v.shape == (4, 2)
    np.testing.assert_allclose(np.abs(v[:, 0]), [0, 1, 0, 0], atol=0.05)
    np.testing.assert_allclose(np.abs(v[:, 1]), [0, 0, 0, 1], atol=0.05)
    with pytest.raises(ValueError, match="k must be"):
        lfw_scoring.lda_projection(x, labels, 5)


def test_as_norm_is_the_symmetric_z_score_against_each_faces_closest_impostors():
    rng = np.random.default_rng(2)
    cohort, a, b = rng.normal(size=(30, 5)), rng.normal(size=(7, 5)), rng.normal(size=(7, 5))
    k = 4
    unit = lambda v: v / np.linalg.norm(v)  # noqa: E731

    def stats(x):  # the k largest cosines against the cohort, one face at a time
        top = sorted((float(unit(x) @ unit(c)) for c in cohort), reverse=True)[:k]
        return np.mean(top), np.sqrt(np.mean((np.array(top) - np.mean(top)) ** 2))

    expected = []
    for x, y in zip(a, b, strict=True):
        s = float(unit(x) @ unit(y))
        (mx, sx), (my, sy) = stats(x), stats(y)
        expected.append(0.5 * ((s - mx) / sx + (s - my) / sy))
    norm = lfw_scoring.AdaptiveScoreNorm(cohort, k)
    np.testing.assert_allclose(norm.score(a, b), expected, rtol=1e-12)
    np.testing.assert_allclose(norm.score(a, b), norm.score(b, a), rtol=1e-12)
    # the cohort is used as directions: its scale does not matter, nor does the faces'
    rescaled = lfw_scoring.AdaptiveScoreNorm(3.0 * cohort, k)
    np.testing.assert_allclose(rescaled.score(2.0 * a, b), expected, rtol=1e-12)


def test_as_norm_refuses_a_bad_cohort_or_k():
    with pytest.raises(ValueError, match=r"top_k must be in \[2, 3\]"):
        lfw_scoring.AdaptiveScoreNorm(np.eye(3), 4)
    with pytest.raises(ValueError, match="top_k"):
        lfw_scoring.AdaptiveScoreNorm(np.eye(3), 1)
    with pytest.raises(ValueError, match=r"cohort must be \(faces, dims\), got shape \(3,\)"):
        lfw_scoring.AdaptiveScoreNorm(np.ones(3), 2)
    # a cohort of one face repeated: the z-score of every face is 0 / 0, refused, not NaN
    repeated = lfw_scoring.AdaptiveScoreNorm(np.tile([[1.0, 2.0]], (4, 1)), 3)
    with pytest.raises(ValueError, match=r"faces \[0, 1\]: their top_k = 3 cohort cosines"):
        repeated.score(np.eye(2), np.eye(2))


def test_cosine_and_whitening_rows_are_the_recipes_evaluation(shared_data, tmp_path):
    from partialfc.deploy import Embedder
    from tests.train.test_lfw_recipe import FAST, REPO, _saved_model

    sets = [f"recipe.data_root={shared_data / 'lfw_dev'}", *FAST, "recipe.pair_sources=[grey]"]
    recipe, _ = recipe_mod.load_recipe(REPO / "configs" / "lfw_dev_val.yaml", sets)
    split = recipe_mod.build_split(recipe)
    pair_sets = {"grey": recipe_mod.pair_images(recipe, split, "grey")}
    model = str(_saved_model(tmp_path / "m", 0))
    rules = lfw_scoring.score_run(model, recipe, split, pair_sets)
    # an 8-d model: no LDA rows (k = 64, 128 exceed d); a cohort of 2,561 images or 498 people
    as_norm = [f"wccn 1 + as-norm {k} {c}" for k in (100, 300) for c in ("images", "means")]
    assert sorted(rules) == sorted(
        ["cosine", "wccn 0.3", "wccn 1", "wccn 3", "wccn 1 centred", "joint bayesian", *as_norm]
    )
    # the training run's own evaluation (raw f(x) + f(mirror(x))), plain and whitened
    raw = Embedder.load(model).embed_raw
    projection = recipe_mod.fit_whitening(raw, split, recipe, 32).projection
    for rule, embed in (("cosine", raw), ("wccn 1", lambda x: raw(x) @ projection)):
        expected = recipe_mod.evaluate_validation(embed, split, recipe, 32, baseline=False)
        expected = expected["model"]["pairs_grey"]
        assert rules[rule]["grey"]["auc"] == pytest.approx(expected["auc"], abs=1e-9)
        assert rules[rule]["grey"]["accuracy"] == pytest.approx(expected["accuracy"]["mean"])
    assert rules["joint bayesian"]["grey"]["auc"] != pytest.approx(rules["cosine"]["grey"]["auc"])


def test_driver_refuses_a_config_without_validation_folds(capsys):
    from tests.train.test_lfw_recipe import REPO

    with pytest.raises(SystemExit):
        lfw_scoring.main(["--config", str(REPO / "configs" / "lfw_dev_final.yaml"), "run"])
    assert "lfw_dev_final.yaml: needs validation folds" in capsys.readouterr().err

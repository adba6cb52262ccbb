"""Scoring rules for trained LFW models: cosine, within-class whitening, LDA, Joint Bayesian.

    python -m experiments.lfw_scoring --config configs/lfw_dev_val.yaml RUN [RUN ...] \\
        --out runs/lfw_scoring.json

Each ``RUN`` is a trained run folder (or an export) of the recipe in
``experiments/lfw_face_recipe.py``; its backbone must be the plain one (a run folder's
checkpoint, not the export of a whitened run, which is whitened already). The images are
embedded once (``f(x) + f(mirror(x))``, the recipe's flip test); every rule is then learned on
the embeddings of the training people only and scored on the validation pairs of both image
sources of ``recipe.pair_sources`` (threshold from the other fold):

- ``cosine``: the cosine of the raw embeddings (the recipe's ``model_unwhitened``);
- ``wccn λ``: cosine after within-class whitening with ridge ``λ``
  (:class:`partialfc.models.whitening.WithinClassWhitening`; ``λ = 1`` is the recipe's);
- ``wccn 1 centred``: the same, minus the whitened training mean before the cosine;
- ``wccn 1 + lda k``: cosine after whitening and a projection onto the ``k`` directions of
  largest between-class scatter (Fisher LDA: Belhumeur, Hespanha & Kriegman, "Eigenfaces vs.
  Fisherfaces", TPAMI 1997, §2.3 — after whitening ``S_w``, the generalised eigenproblem
  ``S_b v = λ S_w v`` is the ordinary one of ``S_b``);
- ``joint bayesian``: the log-likelihood ratio of :class:`JointBayesian` on the normalised,
  centred embeddings;
- ``wccn 1 + as-norm k images`` / ``k means``: the whitened cosine normalised against a cohort
  of training faces (:class:`AdaptiveScoreNorm`): the whitened training images, or the
  training people's mean directions.

The printed table and the JSON list, per run and rule, the pair accuracy and ROC AUC.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from experiments import lfw_face_recipe as recipe_mod


def _class_means(x: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per-identity means ``(C, d)``, each row's identity index ``(N,)`` and counts ``(C,)``."""
    classes, index, counts = np.unique(labels, return_inverse=True, return_counts=True)
    sums = np.zeros((len(classes), x.shape[1]))
    np.add.at(sums, index, x)
    return sums / counts[:, None], index, counts


class JointBayesian:
    """Joint Bayesian verification score (Chen, Cao, Wang, Wen & Sun, "Bayesian Face Revisited:
    A Joint Formulation", ECCV 2012, §3).

    A face is ``x = μ + ε`` with identity ``μ ~ N(0, S_μ)`` and within-person variation
    ``ε ~ N(0, S_ε)``. The log-likelihood ratio of "same person" against "different people" is,
    up to a constant, ``r(x₁, x₂) = ½ (x₁ᵀ A x₁ + x₂ᵀ A x₂ − 2 x₁ᵀ G x₂)`` with
    ``F = S_ε⁻¹``, ``G = −(2 S_μ + S_ε)⁻¹ S_μ S_ε⁻¹``, ``A = (S_μ + S_ε)⁻¹ − (F + G)``.

    :meth:`fit` estimates ``S_μ`` as the covariance of the identity means and ``S_ε`` as the
    within-identity covariance (the paper's initialisation, without its EM refinement), plus
    ``ridge`` (default 1e-3) times the mean eigenvalue of ``S_ε`` on its diagonal. Inputs
    should be centred (the model has mean zero).
    """

    def __init__(self, ridge: float = 1e-3):
        if not np.isfinite(ridge) or ridge < 0:
            raise ValueError(f"ridge must be finite and >= 0, got {ridge!r}")
        self.ridge = float(ridge)
        self.A: np.ndarray | None = None
        self.G: np.ndarray | None = None

    def fit(self, embeddings: np.ndarray, labels: np.ndarray) -> JointBayesian:
        x = np.asarray(embeddings, dtype=np.float64)
        means, index, counts = _class_means(x, np.asarray(labels))
        if not (counts >= 2).any():
            raise ValueError("no identity has two embeddings: S_eps is undefined")
        residual = x - means[index]
        s_eps = residual.T @ residual / len(x)
        d = x.shape[1]
        s_eps += self.ridge * np.trace(s_eps) / d * np.eye(d)
        centred = means - means.mean(0)
        s_mu = centred.T @ centred / len(means)
        f = np.linalg.inv(s_eps)
        g = -np.linalg.solve(2 * s_mu + s_eps, s_mu @ f)
        self.G = (g + g.T) / 2  # symmetric in exact arithmetic
        self.A = np.linalg.inv(s_mu + s_eps) - (f + self.G)
        return self

    def score(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """``(P, d), (P, d) → (P,)`` log-likelihood ratios (up to one constant)."""
        if self.A is None:
            raise RuntimeError("JointBayesian.score before fit")
        a, b = np.asarray(first, np.float64), np.asarray(second, np.float64)
        quad = np.einsum("ij,jk,ik->i", a, self.A, a) + np.einsum("ij,jk,ik->i", b, self.A, b)
        return 0.5 * (quad - 2 * np.einsum("ij,jk,ik->i", a, self.G, b))


class AdaptiveScoreNorm:
    """Adaptive symmetric score normalisation (AS-norm; Matějka et al., "Analysis of Score
    Normalization in Multilingual Speaker Recognition", Interspeech 2017: adaptive S-norm).

    With ``s`` the cosine of ``a`` and ``b``, and ``μ_a, σ_a`` the mean and standard deviation
    of the ``top_k`` largest cosines of ``a`` against a cohort of faces of other people,
    ``s' = ½ ((s − μ_a) / σ_a + (s − μ_b) / σ_b)``: each face's score is measured against the
    impostors most like it, which removes a per-face offset that one threshold cannot.
    """

    def __init__(self, cohort: np.ndarray, top_k: int):
        cohort = np.asarray(cohort, dtype=np.float64)
        if cohort.ndim != 2:
            raise ValueError(f"cohort must be (faces, dims), got shape {cohort.shape}")
        if not 2 <= top_k <= len(cohort):
            raise ValueError(f"top_k must be in [2, {len(cohort)}] (the cohort size), got {top_k}")
        self.cohort = _unit64(cohort)
        self.top_k = int(top_k)

    def _impostor_stats(self, unit: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        cosines = unit @ self.cohort.T
        top = -np.partition(-cosines, self.top_k - 1, axis=1)[:, : self.top_k]
        sd = top.std(1)
        if not (sd > 0).all():
            faces = np.flatnonzero(~(sd > 0))[:5].tolist()
            raise ValueError(
                f"faces {faces}: their top_k = {self.top_k} cohort cosines are all equal "
                "(a cohort of repeated faces?), so their scores cannot be normalised"
            )
        return top.mean(1), sd

    def score(self, first: np.ndarray, second: np.ndarray) -> np.ndarray:
        """``(P, d), (P, d) → (P,)`` normalised scores (float64)."""
        a, b = _unit64(first), _unit64(second)
        s = np.sum(a * b, axis=1)
        mean_a, sd_a = self._impostor_stats(a)
        mean_b, sd_b = self._impostor_stats(b)
        return 0.5 * ((s - mean_a) / sd_a + (s - mean_b) / sd_b)


def _unit64(x: np.ndarray) -> np.ndarray:
    """Rows scaled to unit length, in float64 (a zero row stays zero)."""
    x = np.asarray(x, dtype=np.float64)
    norms = np.linalg.norm(x, axis=1, keepdims=True)
    return x / np.where(norms > 0, norms, 1.0)


def lda_projection(embeddings: np.ndarray, labels: np.ndarray, k: int) -> np.ndarray:
    """``(d, k)`` orthonormal directions of largest between-class scatter
    ``S_b = (1/N) Σ_c n_c (μ_c − μ)(μ_c − μ)ᵀ`` (largest eigenvalue first)."""
    x = np.asarray(embeddings, dtype=np.float64)
    if not 1 <= k <= x.shape[1]:
        raise ValueError(f"k must be in [1, {x.shape[1]}], got {k}")
    means, _, counts = _class_means(x, np.asarray(labels))
    centred = means - x.mean(0)
    s_b = (centred * counts[:, None]).T @ centred / len(x)
    _, vectors = np.linalg.eigh(s_b)
    return vectors[:, ::-1][:, :k]


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    from partialfc.eval import l2_normalize

    return np.sum(l2_normalize(a) * l2_normalize(b), axis=1)


def scoring_rules(
    train: np.ndarray,
    labels: np.ndarray,
    lambdas=(0.3, 1.0, 3.0),
    ks=(64, 128),
    as_norm_ks=(100, 300),
):
    """``name → (transform, score)``: each rule's map of raw embeddings (learned on ``train``
    and ``labels``) and its pair score of two mapped embedding arrays."""
    from partialfc.eval import l2_normalize
    from partialfc.models.whitening import WithinClassWhitening

    rules = {"cosine": (lambda x: x, _cosine)}
    for lam in lambdas:
        p = WithinClassWhitening(lam).fit(train, labels).projection
        rules[f"wccn {lam:g}"] = (lambda x, p=p: x @ p, _cosine)
    p = WithinClassWhitening(1.0).fit(train, labels).projection
    mean = (train @ p).mean(0)
    rules["wccn 1 centred"] = (lambda x: x @ p - mean, _cosine)
    for k in (k for k in ks if k < train.shape[1]):
        v = lda_projection(train @ p, labels, k)
        rules[f"wccn 1 + lda {k}"] = (lambda x, v=v: x @ p @ v, _cosine)
    unit_mean = l2_normalize(train).mean(0)
    jb = JointBayesian().fit(l2_normalize(train) - unit_mean, labels)
    rules["joint bayesian"] = (lambda x: l2_normalize(x) - unit_mean, jb.score)
    whitened = train @ p
    person_means, _, _ = _class_means(l2_normalize(whitened), labels)
    for name, cohort in (("images", whitened), ("means", person_means)):
        for k in (k for k in as_norm_ks if k <= len(cohort)):
            norm = AdaptiveScoreNorm(cohort, k)
            rules[f"wccn 1 + as-norm {k} {name}"] = (lambda x: x @ p, norm.score)
    return rules


def score_run(model: str, recipe, split, pair_sets: dict) -> dict:
    """Accuracy and AUC of every rule of :func:`scoring_rules` for one model."""
    from partialfc.deploy import Embedder
    from partialfc.eval import verification_report

    embedder = Embedder.load(model)
    size = embedder.spec.input_size[0]

    def embed(images):
        return recipe_mod.embed_flip_test(embedder.embed_raw, images, size, recipe.flip_test)

    train = embed(split.train_images)
    sources = {s: embed(p.images) for s, p in pair_sets.items()}
    out = {}
    for name, (transform, score) in scoring_rules(train, split.train_labels).items():
        out[name] = {}
        for source, pairs in pair_sets.items():
            x = transform(sources[source])
            report = verification_report(
                f"{name} {source}",
                scores=score(x[pairs.first], x[pairs.second]),
                is_genuine=split.pairs.issame[pairs.keep],
                folds=split.pairs.fold[pairs.keep],
                fars=(1e-2,),
            )
            acc = report.kfold_accuracy
            out[name][source] = {
                "accuracy": acc.mean,
                "per_fold": [a.rate for a in acc.fold_accuracy],
                "auc": report.auc,
            }
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", default="configs/lfw_dev_val.yaml")
    parser.add_argument("models", nargs="+", help="trained run folders (unwhitened backbones)")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--out", default="runs/lfw_scoring.json")
    args = parser.parse_args(argv)
    try:
        recipe, _ = recipe_mod.load_validation_recipe(args.config, args.set)
    except ValueError as err:
        parser.error(str(err))
    split = recipe_mod.build_split(recipe)
    pair_sets = {s: recipe_mod.pair_images(recipe, split, s) for s in recipe.pair_sources}
    result = {"config": args.config, "overrides": args.set, "runs": {}}
    for model in args.models:
        result["runs"][model] = score_run(model, recipe, split, pair_sets)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    recipe_mod._atomic_write_json(out, result)
    head = "".join(f" {s} accuracy (%) | {s} AUC |" for s in pair_sets)
    print(f"| run | rule |{head}\n|---|---|" + "---|---|" * len(pair_sets))
    for model, rules in result["runs"].items():
        for name, r in rules.items():
            cells = [f"{100 * r[s]['accuracy']:.2f} | {r[s]['auc']:.4f}" for s in pair_sets]
            print(f"| {Path(model).name} | {name} | {' | '.join(cells)} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

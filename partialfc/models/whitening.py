"""Within-class whitening of embeddings, learned on labelled training embeddings.

Within-class covariance normalisation (WCCN; Hatch, Kajarekar & Stolcke, "Within-class
covariance normalization for SVM-based speaker recognition", ICSLP 2006, §2): with the
within-class covariance of the training embeddings ``x_i`` of identities ``y_i``

    S_w = (1/N) Σ_i (x_i − μ_{y_i})(x_i − μ_{y_i})ᵀ = U Λ Uᵀ,

the map ``x ↦ P x`` with ``P = U (Λ + λ·mean(Λ)·I)^(−1/2) Uᵀ`` scales every direction in which
images of one person vary down to unit variance, so the cosine of two mapped embeddings weighs
the directions that separate people more than those that separate photos of one person.
``λ`` (``regularization``, relative to the mean eigenvalue) keeps the directions in which the
training images barely vary from being blown up: the training images were seen in training,
so their within-class scatter underestimates that of unseen people. ``P`` is linear (no
centering), so it can be folded into a backbone's last linear layer
(:func:`partialfc.models.common.fold_linear_map`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["WithinClassWhitening"]


class WithinClassWhitening:
    """``x ↦ P x``, ``P = U (Λ + λ·mean(Λ)·I)^(−1/2) Uᵀ`` from the within-class covariance
    ``S_w = U Λ Uᵀ`` of :meth:`fit`'s embeddings (WCCN, Hatch et al., ICSLP 2006).

    ``regularization`` (``λ``, default 1.0): ridge added to every eigenvalue, in units of their
    mean; ``λ → ∞`` tends to the identity map (times a constant), ``λ = 0`` is plain
    whitening. :attr:`projection` is the symmetric ``(d, d)`` matrix ``P`` (float64).
    """

    def __init__(self, regularization: float = 1.0):
        if not np.isfinite(regularization) or regularization < 0:
            raise ValueError(f"regularization must be finite and >= 0, got {regularization!r}")
        self.regularization = float(regularization)
        self.projection: np.ndarray | None = None

    def fit(self, embeddings: np.ndarray, labels: np.ndarray) -> WithinClassWhitening:
        """Learn ``P`` from ``(N, d)`` embeddings and their ``(N,)`` identity labels; at least
        one identity needs two embeddings."""
        x = np.asarray(embeddings, dtype=np.float64)
        y = np.asarray(labels)
        if x.ndim != 2 or y.shape != (len(x),):
            raise ValueError(
                f"embeddings must be (N, d) with labels (N,), got {x.shape} and {y.shape}"
            )
        if not np.isfinite(x).all():
            raise ValueError("embeddings contain NaN or infinite values")
        classes, index, counts = np.unique(y, return_inverse=True, return_counts=True)
        if not (counts >= 2).any():
            raise ValueError(
                f"no identity has two embeddings ({len(classes)} identities, {len(x)} "
                "embeddings): the within-class covariance is undefined"
            )
        sums = np.zeros((len(classes), x.shape[1]))
        np.add.at(sums, index, x)
        residual = x - (sums / counts[:, None])[index]
        scatter = residual.T @ residual / len(x)
        eigenvalues, eigenvectors = np.linalg.eigh(scatter)
        eigenvalues = np.clip(eigenvalues, 0.0, None)
        ridge = self.regularization * eigenvalues.mean()
        if ridge + eigenvalues.min() <= 0:
            raise ValueError(
                "the within-class covariance is singular and regularization is 0: "
                "use regularization > 0"
                if eigenvalues.max() > 0
                else "the within-class covariance is zero (singular): every identity's "
                "embeddings are identical"
            )
        scale = 1.0 / np.sqrt(eigenvalues + ridge)
        self.projection = (eigenvectors * scale) @ eigenvectors.T
        return self

    def transform(self, embeddings: np.ndarray) -> np.ndarray:
        """``(N, d)`` → ``(N, d)`` float32: ``x Pᵀ`` (= ``x P``; ``P`` is symmetric)."""
        if self.projection is None:
            raise RuntimeError("WithinClassWhitening.transform before fit")
        x = np.asarray(embeddings)
        if x.ndim != 2 or x.shape[1] != len(self.projection):
            raise ValueError(
                f"embeddings must be (N, {len(self.projection)}) as in fit, got {x.shape}"
            )
        return (x.astype(np.float64) @ self.projection).astype(np.float32)

"""1:1 verification with a threshold calibrated from impostor scores for a stated FAR.

Never a hard-coded threshold: ``calibrate(embeddings, labels, target_far)`` scores every pair
of different identities in a calibration set and sets the lowest threshold that accepts at
most ``k = floor(FAR · n_impostor)`` of them: the smallest float32 value above the
``(k+1)``-th highest impostor score (``partialfc.eval.tar_at_far``; float32 because
verification scores are float32 cosines, so that score itself stays rejected). The result
carries ``k`` and ``n_impostor``: a FAR backed by ``k`` false accepts has a relative standard
error of about ``1/√k``, and FARs below ``1/n_impostor`` are refused.

    threshold = calibrate(embedder.embed(cal_images), cal_labels, target_far=1e-3)
    result = Verifier(embedder, threshold).verify(images_a, images_b)   # pairs row by row
    result.score, result.accept

A threshold only means something for the model it was calibrated on: the file records the
model's SHA-256 (``Embedder.model_sha256``, :mod:`partialfc.backbone.fingerprint`) and
:func:`check_threshold_model` (used by ``Verifier`` and ``verify``/``search --threshold``)
refuses it for other weights.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from partialfc.atomic import atomic_write_bytes
from partialfc.eval import proportion, score_all_pairs
from partialfc.eval._validate import as_scores
from partialfc.eval.tar_at_far import threshold_from_top_impostors

THRESHOLD_FORMAT = "partialfc.threshold"


def check_finite_rows(embeddings, what: str = "embeddings", describe=None, shown: int = 5) -> None:
    """Raise ValueError naming the rows of ``embeddings`` ``(n, d)`` that hold NaN or inf.

    ``describe(i)`` names row ``i`` (its image file, record, identity); a model that produces
    non-finite outputs must not turn into thresholds, scores or matches.
    """
    e = np.asarray(embeddings)
    bad = np.flatnonzero(~np.isfinite(e.reshape(len(e), -1)).all(axis=1)) if e.size else []
    if len(bad):
        rows = ", ".join(
            f"row {i}" + (f" ({describe(int(i))})" if describe else "") for i in bad[:shown]
        )
        more = f" and {len(bad) - shown} more" if len(bad) > shown else ""
        raise ValueError(
            f"{what}: {len(bad)} of {len(e)} embeddings contain NaN or inf: {rows}{more}"
        )


@dataclass(frozen=True)
class CalibratedThreshold:
    """Accept a pair when ``cosine >= threshold``."""

    threshold: float
    target_far: float
    allowed_false_accepts: int  # k = floor(target_far · n_impostor)
    false_accepts: int  # calibration impostors >= threshold (≤ k)
    n_impostor: int
    far_interval_95: tuple[float, float]  # Clopper–Pearson on the calibration impostors
    model_sha256: str | None = None  # the weights it was calibrated on (None: not recorded)

    def to_dict(self) -> dict:
        return {"format": THRESHOLD_FORMAT, "version": 2, **asdict(self)}

    def save(self, path: str | os.PathLike) -> None:
        atomic_write_bytes(Path(path), (json.dumps(self.to_dict(), indent=2) + "\n").encode())

    @classmethod
    def load(cls, path: str | os.PathLike) -> CalibratedThreshold:
        path = Path(path)
        try:
            d = json.loads(path.read_text())
            if d.get("format") != THRESHOLD_FORMAT:
                raise ValueError(f"format is {d.get('format')!r}, not {THRESHOLD_FORMAT!r}")
            return cls(
                threshold=float(d["threshold"]),
                target_far=float(d["target_far"]),
                allowed_false_accepts=int(d["allowed_false_accepts"]),
                false_accepts=int(d["false_accepts"]),
                n_impostor=int(d["n_impostor"]),
                far_interval_95=tuple(float(v) for v in d["far_interval_95"]),
                model_sha256=_optional_hash(d.get("model_sha256")),
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a calibrated threshold file: {err}") from None


def _optional_hash(value) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or len(value) != 64 or value.strip("0123456789abcdef"):
        raise ValueError(f"model_sha256 {value!r} is not a hex SHA-256")
    return value


class ModelMismatchError(ValueError):
    """A threshold calibrated on other weights than the model it is used with."""


def check_threshold_model(
    threshold: CalibratedThreshold,
    model_sha256: str | None,
    threshold_name: str = "threshold",
    model_name: str = "the model",
    allow_other_model: bool = False,
) -> str | None:
    """Refuse a threshold calibrated on other weights (ModelMismatchError naming both hashes).

    Returns a warning (a string, else None) when the check cannot be made (a threshold or a
    model without a hash) or is overridden by ``allow_other_model``.
    """
    recorded = threshold.model_sha256
    if recorded is None:
        return f"{threshold_name} records no model hash; it cannot be checked against {model_name}"
    if model_sha256 is None:
        return f"{model_name} has no hash; {threshold_name} cannot be checked against it"
    if recorded == model_sha256:
        return None
    message = (
        f"{threshold_name} was calibrated on the model with sha256 {recorded}, but {model_name} "
        f"has sha256 {model_sha256}"
    )
    if allow_other_model:
        return message + "; used anyway (--allow-other-model)"
    raise ModelMismatchError(
        message + ": recalibrate on this model (partialfc verify --calibrate), or pass "
        "--allow-other-model"
    )


def calibrate(
    embeddings: np.ndarray,
    labels,
    target_far: float,
    source: str = "calibration embeddings",
    model_sha256: str | None = None,
) -> CalibratedThreshold:
    """Threshold at ``target_far`` from all different-label pairs of L2-normalised embeddings.

    Pairs are scored blockwise (``partialfc.eval.score_all_pairs``) keeping only the highest
    ``k + 1`` impostor scores, so large calibration sets fit in memory. Rows with NaN or inf
    are refused (ValueError naming ``source`` and the rows with their labels).
    ``model_sha256`` (``embedder.model_sha256``) is recorded in the result.
    """
    embeddings = np.asarray(embeddings, dtype=np.float32)
    labels = np.asarray(labels).reshape(-1)
    if embeddings.ndim != 2 or embeddings.shape[0] != labels.size:
        raise ValueError(f"embeddings {embeddings.shape} and labels ({labels.size},) disagree")
    check_finite_rows(embeddings, source, lambda i: f"label {labels[i]}")
    n_pairs = labels.size * (labels.size - 1) // 2
    keep = int(min(n_pairs, np.floor(target_far * n_pairs) + 2))
    summary = score_all_pairs(embeddings, labels, keep_top=max(keep, 1))
    t = threshold_from_impostors(
        summary.top_impostor_scores, target_far, n_impostor=summary.n_impostor
    )
    return replace(t, model_sha256=_optional_hash(model_sha256))


def threshold_from_impostors(
    impostor_scores: np.ndarray, target_far: float, n_impostor: int | None = None
) -> CalibratedThreshold:
    """Threshold from impostor scores (all of them, or the top ones with ``n_impostor``):
    the smallest float32 value above the ``(k+1)``-th highest, ``k = floor(FAR · n)``."""
    scores = np.asarray(impostor_scores, dtype=np.float64).reshape(-1)
    if not np.isfinite(scores).all():
        raise ValueError(
            f"impostor_scores: {int((~np.isfinite(scores)).sum())} of {scores.size} are NaN or inf"
        )
    scores = np.sort(as_scores(scores, "impostor_scores"))[::-1]
    n = scores.size if n_impostor is None else int(n_impostor)
    chosen = threshold_from_top_impostors(scores, n, target_far, score_dtype=np.float32)
    far = proportion(chosen.false_accepts, chosen.n_impostor, 0.95)
    return CalibratedThreshold(
        threshold=chosen.threshold,
        target_far=chosen.target_far,
        allowed_false_accepts=chosen.allowed_false_accepts,
        false_accepts=chosen.false_accepts,
        n_impostor=chosen.n_impostor,
        far_interval_95=(float(far.lower), float(far.upper)),
    )


@dataclass(frozen=True)
class Verification:
    score: np.ndarray  # (N,) cosine of each pair
    accept: np.ndarray  # (N,) bool: score >= threshold
    threshold: float
    target_far: float


def decide(embeddings_a, embeddings_b, threshold: CalibratedThreshold) -> Verification:
    """Row-wise cosine of two L2-normalised ``(N, d)`` arrays and the decision."""
    a = np.atleast_2d(np.asarray(embeddings_a, dtype=np.float32))
    b = np.atleast_2d(np.asarray(embeddings_b, dtype=np.float32))
    if a.shape != b.shape:
        raise ValueError(f"pair arrays differ in shape: {a.shape} vs {b.shape}")
    check_finite_rows(a, "first images of the pairs")
    check_finite_rows(b, "second images of the pairs")
    score = np.einsum("nd,nd->n", a, b)
    accept = score >= threshold.threshold
    return Verification(score, accept, threshold.threshold, threshold.target_far)


class Verifier:
    """An Embedder and a calibrated threshold (refused if calibrated on other weights, see
    :func:`check_threshold_model`; ``allow_other_model=True`` overrides with a warning)."""

    def __init__(
        self,
        embedder,
        threshold: CalibratedThreshold,
        flip: bool = False,
        allow_other_model: bool = False,
    ):
        warning = check_threshold_model(
            threshold, getattr(embedder, "model_sha256", None), allow_other_model=allow_other_model
        )
        if warning:
            warnings.warn(warning, stacklevel=2)
        self.embedder = embedder
        self.threshold = threshold
        self.flip = flip

    def verify(self, images_a: np.ndarray, images_b: np.ndarray) -> Verification:
        """Score pair ``i`` = (``images_a[i]``, ``images_b[i]``); uint8 image batches."""
        if len(images_a) != len(images_b):
            raise ValueError(f"{len(images_a)} images in a but {len(images_b)} in b")
        ea = self.embedder.embed(images_a, flip=self.flip)
        eb = self.embedder.embed(images_b, flip=self.flip)
        return decide(ea, eb, self.threshold)

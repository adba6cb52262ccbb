"""1:1 verification with a threshold calibrated from impostor scores for a stated FAR.

Never a hard-coded threshold: ``calibrate(embeddings, labels, target_far)`` scores every pair
of different identities in a calibration set and sets the threshold so that at most
``k = floor(FAR · n_impostor)`` of them are accepted (``partialfc.eval.tar_at_far``, the IJB-C
protocol). The result carries ``k`` and ``n_impostor``: a FAR backed by ``k`` false accepts has a
relative standard error of about ``1/√k``, and FARs below ``1/n_impostor`` are refused.

    threshold = calibrate(embedder.embed(cal_images), cal_labels, target_far=1e-3)
    result = Verifier(embedder, threshold).verify(images_a, images_b)   # pairs row by row
    result.score, result.accept
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from partialfc.atomic import atomic_write_bytes
from partialfc.eval import proportion, score_all_pairs
from partialfc.eval.tar_at_far import threshold_from_top_impostors

THRESHOLD_FORMAT = "partialfc.threshold"


@dataclass(frozen=True)
class CalibratedThreshold:
    """Accept a pair when ``cosine >= threshold``."""

    threshold: float
    target_far: float
    allowed_false_accepts: int  # k = floor(target_far · n_impostor)
    false_accepts: int  # calibration impostors >= threshold (≤ k)
    n_impostor: int
    far_interval_95: tuple[float, float]  # Clopper–Pearson on the calibration impostors

    def to_dict(self) -> dict:
        return {"format": THRESHOLD_FORMAT, "version": 1, **asdict(self)}

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
            )
        except (OSError, ValueError, KeyError, TypeError) as err:
            raise ValueError(f"{path}: not a calibrated threshold file: {err}") from None


def calibrate(embeddings: np.ndarray, labels, target_far: float) -> CalibratedThreshold:
    """Threshold at ``target_far`` from all different-label pairs of L2-normalised embeddings.

    Pairs are scored blockwise (``partialfc.eval.score_all_pairs``) keeping only the highest
    ``k + 1`` impostor scores, so large calibration sets fit in memory.
    """
    embeddings = np.asarray(embeddings, dtype=np.float32)
    labels = np.asarray(labels).reshape(-1)
    if embeddings.ndim != 2 or embeddings.shape[0] != labels.size:
        raise ValueError(f"embeddings {embeddings.shape} and labels ({labels.size},) disagree")
    n_pairs = labels.size * (labels.size - 1) // 2
    keep = int(min(n_pairs, np.floor(target_far * n_pairs) + 2))
    summary = score_all_pairs(embeddings, labels, keep_top=max(keep, 1))
    return threshold_from_impostors(
        summary.top_impostor_scores, target_far, n_impostor=summary.n_impostor
    )


def threshold_from_impostors(
    impostor_scores: np.ndarray, target_far: float, n_impostor: int | None = None
) -> CalibratedThreshold:
    """Threshold from impostor scores (all of them, or the top ones with ``n_impostor``)."""
    scores = np.sort(np.asarray(impostor_scores, dtype=np.float64).reshape(-1))[::-1]
    n = scores.size if n_impostor is None else int(n_impostor)
    chosen = threshold_from_top_impostors(scores, n, target_far)
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
    score = np.einsum("nd,nd->n", a, b)
    accept = score >= threshold.threshold
    return Verification(score, accept, threshold.threshold, threshold.target_far)


class Verifier:
    """An Embedder and a calibrated threshold."""

    def __init__(self, embedder, threshold: CalibratedThreshold, flip: bool = False):
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

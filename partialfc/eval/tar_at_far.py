"""TAR at a fixed FAR, with the threshold set from impostor scores alone.

Seed 001, ch. 6: sort impostors descending, allow ``k = floor(FAR · n_impostor)`` false
accepts, take the k-th highest impostor score as the threshold, accept ``score >= threshold``.
``k`` is the error bar (relative standard error ≈ 1/√k) and is always returned; ``k = 0`` is
refused because such a FAR cannot be resolved with these pairs.

Ties: if impostor scores tied with the k-th one would push the false accepts past ``k``, the
threshold moves just above the tie, so the realized FAR never exceeds the target.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ._validate import as_scores
from .intervals import Proportion, proportion
from .results import Result


class InsufficientPairsError(ValueError):
    """The requested FAR (or FPIR) is below ``1 / n`` for the available impostor trials."""


@dataclass(frozen=True)
class ImpostorThreshold(Result):
    """A threshold chosen from impostor scores at ``target_far``."""

    target_far: float
    threshold: float
    allowed_false_accepts: int  # k = floor(target_far * n_impostor)
    false_accepts: int  # impostors actually >= threshold (<= allowed; smaller only on ties)
    n_impostor: int


def threshold_from_top_impostors(
    top_impostor_desc: np.ndarray, n_impostor: int, target_far: float, what: str = "impostor pairs"
) -> ImpostorThreshold:
    """Threshold from the highest impostor scores, sorted descending.

    ``top_impostor_desc`` needs at least ``k + 1`` entries (all of them when ``k + 1 >
    n_impostor``); large-scale scoring keeps only this head of the distribution.
    """
    if not 0.0 < target_far <= 1.0:
        raise ValueError(f"target FAR must be in (0, 1], got {target_far}")
    k = int(np.floor(target_far * n_impostor + 1e-9))
    if k == 0:
        raise InsufficientPairsError(
            f"only {n_impostor} {what} — cannot resolve FAR = {target_far:g}: at least "
            f"{int(np.ceil(1 / target_far))} are needed to admit one false accept, and about "
            f"{int(np.ceil(100 / target_far))} to measure it to ±10%"
        )
    need = min(k + 1, n_impostor)
    if top_impostor_desc.size < need:
        raise ValueError(f"need the top {need} impostor scores, got {top_impostor_desc.size}")
    threshold = float(top_impostor_desc[k - 1])
    false_accepts = int(np.count_nonzero(top_impostor_desc[:need] >= threshold))
    if false_accepts > k:  # a tie straddles position k: step just above it
        threshold = float(np.nextafter(threshold, np.inf))
        false_accepts = int(np.count_nonzero(top_impostor_desc[:need] >= threshold))
    return ImpostorThreshold(
        target_far=float(target_far),
        threshold=threshold,
        allowed_false_accepts=k,
        false_accepts=false_accepts,
        n_impostor=int(n_impostor),
    )


def top_descending(scores: np.ndarray, count: int) -> np.ndarray:
    """The ``count`` largest values of ``scores``, sorted descending (O(n) selection)."""
    count = min(count, scores.size)
    if count <= 0:
        return scores[:0]
    if count < scores.size:
        scores = np.partition(scores, scores.size - count)[scores.size - count :]
    return np.sort(scores)[::-1]


def impostor_threshold(impostor, target_far: float) -> ImpostorThreshold:
    """Threshold admitting at most ``floor(target_far · n)`` of the impostor scores."""
    imp = as_scores(impostor, "impostor")
    k = int(np.floor(target_far * imp.size + 1e-9))
    return threshold_from_top_impostors(top_descending(imp, k + 1), imp.size, target_far)


@dataclass(frozen=True)
class TarAtFar(Result):
    """TAR at ``target_far``: ``tar`` and the realized ``far`` with counts and intervals."""

    target_far: float
    threshold: float
    allowed_false_accepts: int
    tar: Proportion
    far: Proportion

    def __str__(self) -> str:
        return (
            f"TAR@FAR={self.target_far:g}: {self.tar} at threshold {self.threshold:.4f} "
            f"(k={self.far.k} false accepts of {self.far.n})"
        )


def tar_at_far(genuine, impostor, target_far: float, confidence: float = 0.95) -> TarAtFar:
    """TAR at ``target_far`` (threshold from impostors only; see module docstring)."""
    return tar_at_threshold(genuine, impostor_threshold(impostor, target_far), confidence)


def tar_at_threshold(genuine, chosen: ImpostorThreshold, confidence: float = 0.95) -> TarAtFar:
    """TAR of ``genuine`` scores at a threshold already chosen from impostors."""
    gen = as_scores(genuine, "genuine")
    true_accepts = int(np.count_nonzero(gen >= chosen.threshold))
    return TarAtFar(
        target_far=chosen.target_far,
        threshold=chosen.threshold,
        allowed_false_accepts=chosen.allowed_false_accepts,
        tar=proportion(true_accepts, gen.size, confidence),
        far=proportion(chosen.false_accepts, chosen.n_impostor, confidence),
    )


def tar_at_zero_far(genuine, impostor, confidence: float = 0.95) -> TarAtFar:
    """Highest TAR with no false accept: threshold = lowest genuine score above every impostor.

    The realized FAR is 0 of ``n_impostor``; its interval's upper bound says how little that
    proves (about 3.7/n at 95%). ``target_far`` is reported as 0.
    """
    gen = as_scores(genuine, "genuine")
    imp = as_scores(impostor, "impostor")
    above = gen[gen > imp.max()]
    threshold = float(above.min()) if above.size else float(np.nextafter(imp.max(), np.inf))
    chosen = ImpostorThreshold(
        target_far=0.0,
        threshold=threshold,
        allowed_false_accepts=0,
        false_accepts=0,
        n_impostor=int(imp.size),
    )
    return tar_at_threshold(gen, chosen, confidence)

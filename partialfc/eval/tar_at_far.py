"""TAR at a fixed FAR, with the threshold set from impostor scores alone.

A pair is accepted when ``score >= threshold``. With the ``n`` impostor scores sorted
descending, ``s_1 >= s_2 >= ... >= s_n``, and ``k = floor(FAR · n)`` false accepts allowed,

    threshold = the smallest representable value > s_(k+1),
    false accepts = #{i : s_i > s_(k+1)} <= k,

the lowest threshold that admits at most ``k`` impostors, hence the largest TAR the target
allows. Ties: every impostor equal to ``s_(k+1)`` is rejected with it, so when a tie straddles
position ``k`` the realized FAR is below the target, never above. ``k = n`` (FAR = 1) accepts
everything (threshold ``-inf``).

The step above ``s_(k+1)`` is taken in the precision the scores are compared in (float64 by
default; float32 for thresholds applied to float32 cosines), so ``s_(k+1)`` itself stays
rejected in that precision too.

``k`` is the error bar (relative standard error ≈ 1/√k) and is always returned; ``k = 0`` is
refused because such a FAR cannot be resolved with these pairs.
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
    false_accepts: int  # impostors >= threshold: <= allowed, smaller only on ties
    n_impostor: int


def next_above(value: float, dtype=np.float64) -> float:
    """The smallest number representable in ``dtype`` that is strictly greater than ``value``."""
    dtype = np.dtype(dtype)
    if dtype.kind != "f":
        raise ValueError(f"score_dtype must be a floating dtype, got {dtype}")
    step = dtype.type(value)
    if float(step) <= value:
        step = np.nextafter(step, dtype.type(np.inf))
    return float(step)


def threshold_from_top_impostors(
    top_impostor_desc: np.ndarray,
    n_impostor: int,
    target_far: float,
    what: str = "impostor pairs",
    score_dtype=np.float64,
) -> ImpostorThreshold:
    """Threshold just above the ``(k+1)``-th highest impostor score (see module docstring).

    ``top_impostor_desc``: the highest impostor scores, sorted descending; at least ``k + 1``
    of them unless that is more than ``n_impostor`` (large-scale scoring keeps only this head).
    ``score_dtype``: the precision later scores are compared in (float32 for float32 cosines).
    """
    if not 0.0 < target_far <= 1.0:
        raise ValueError(f"target_far must be in (0, 1], got {target_far}")
    k = int(np.floor(target_far * n_impostor + 1e-9))
    if k == 0:
        raise InsufficientPairsError(
            f"only {n_impostor} {what} — cannot resolve FAR = {target_far:g}: at least "
            f"{int(np.ceil(1 / target_far))} are needed to admit one false accept, and about "
            f"{int(np.ceil(100 / target_far))} to measure it to ±10%"
        )
    top = np.asarray(top_impostor_desc, dtype=np.float64).reshape(-1)
    if k >= n_impostor:  # every impostor may be accepted
        return ImpostorThreshold(float(target_far), -np.inf, k, int(n_impostor), int(n_impostor))
    if top.size < k + 1:
        raise ValueError(f"top_impostor_desc: need the top {k + 1} impostor scores, got {top.size}")
    if np.any(np.diff(top[: k + 1]) > 0):
        raise ValueError("top_impostor_desc must be sorted in descending order")
    boundary = float(top[k])  # s_(k+1): the first score that would make k + 1 false accepts
    threshold = next_above(boundary, score_dtype)
    return ImpostorThreshold(
        target_far=float(target_far),
        threshold=threshold,
        allowed_false_accepts=k,
        false_accepts=int(np.count_nonzero(top[: k + 1] >= threshold)),
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
    """Lowest threshold admitting at most ``floor(target_far · n)`` of the impostor scores."""
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

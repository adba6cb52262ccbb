"""Binomial proportions with exact (Clopper–Pearson) confidence intervals.

A rate measured as ``k`` events out of ``n`` trials is only as good as ``k``: its relative
standard error is about ``1/sqrt(k)`` (binomial counting: ``k`` is nearly Poisson when
rates are small). Every rate in
``partialfc.eval`` is therefore a :class:`Proportion` that carries ``k`` and ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import beta

from .results import Result


@dataclass(frozen=True)
class Proportion(Result):
    """``k`` of ``n`` with a two-sided Clopper–Pearson interval at ``confidence``."""

    k: int
    n: int
    rate: float
    lower: float
    upper: float
    confidence: float

    def __str__(self) -> str:
        """``63.31% [63.00, 63.63] (54880/86724)``: the rate and its interval in percent."""
        bounds = f"[{100 * self.lower:.2f}, {100 * self.upper:.2f}]"
        return f"{percent(self.rate)} {bounds} ({self.k}/{self.n})"


def percent(rate: float) -> str:
    """The one format of a measured rate in text: a percentage with two decimals,
    ``0.0004472 -> '0.04%'`` (targets such as FAR = 1e-3 keep the form they were given in)."""
    return f"{100 * rate:.2f}%"


def clopper_pearson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Exact binomial interval: ``[B(α/2; k, n−k+1), B(1−α/2; k+1, n−k)]``, α = 1 − confidence.

    The bounds are 0 when ``k = 0`` and 1 when ``k = n``.
    """
    if n < 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    if n == 0:
        return 0.0, 1.0
    alpha = 1.0 - confidence
    lower = 0.0 if k == 0 else float(beta.ppf(alpha / 2, k, n - k + 1))
    upper = 1.0 if k == n else float(beta.ppf(1 - alpha / 2, k + 1, n - k))
    return lower, upper


def proportion(k: int, n: int, confidence: float = 0.95) -> Proportion:
    """``k / n`` with its Clopper–Pearson interval (rate is NaN when ``n = 0``)."""
    k, n = int(k), int(n)
    lower, upper = clopper_pearson(k, n, confidence)
    rate = k / n if n else float("nan")
    return Proportion(k=k, n=n, rate=rate, lower=lower, upper=upper, confidence=confidence)

"""Binomial proportions with exact (Clopper–Pearson) confidence intervals, and Wilson's score
interval for plots of accuracies.

A rate measured as ``k`` events out of ``n`` trials is only as good as ``k``: its relative
standard error is about ``1/sqrt(k)`` (binomial counting: ``k`` is nearly Poisson when
rates are small). Every rate in
``partialfc.eval`` is therefore a :class:`Proportion` that carries ``k`` and ``n``.
"""

from __future__ import annotations

from dataclasses import dataclass

from scipy.stats import beta, norm

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


def wilson(k: int, n: int, confidence: float = 0.95) -> tuple[float, float]:
    """Wilson score interval (Wilson, JASA 1927; Newcombe, Statistics in Medicine 1998)::

        (p + z²/2n ± z·sqrt(p(1 − p)/n + z²/4n²)) / (1 + z²/n),   p = k/n,

    with ``z`` the ``1 − α/2`` normal quantile (α = 1 − confidence; default 95 %, z = 1.96).
    Unlike the normal approximation it stays inside [0, 1] and is not empty at k = 0 or n.
    """
    if n <= 0 or k < 0 or k > n:
        raise ValueError(f"need 0 <= k <= n and n >= 1, got k={k}, n={n}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence}")
    z = float(norm.ppf(1 - (1 - confidence) / 2))
    p = k / n
    denominator = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denominator
    half = z * (p * (1 - p) / n + z * z / (4 * n * n)) ** 0.5 / denominator
    # exactly 0 at k = 0 and 1 at k = n (the formula gives them up to rounding)
    return (0.0 if k == 0 else center - half), (1.0 if k == n else center + half)

"""Positive-preserving negative sampling inside one rank's class block (Partial FC, An et al.,
arXiv 2010.05222, §3.3).

The active set of a rank is every local class that is a label in the *global* batch, plus
negatives drawn uniformly without replacement from the remaining local classes, up to a fixed
budget ``ceil(r * C_local)`` (all positives when they alone exceed it). The draw depends only
on ``(seed, step, rank)``.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch
from torch import Tensor

__all__ = ["sampling_budget", "sampling_generator", "sample_active_classes"]

_MIX = 0x9E3779B97F4A7C15  # 64-bit golden-ratio constant for seed mixing


def sampling_budget(num_local_classes: int, sample_rate: float) -> int:
    """``ceil(r * C_local)``: number of active classes per step when positives fit in it.

    ``r`` is taken as the decimal it is written as (its shortest repr, so 0.1 is 1/10) and the
    product is exact: float products such as 0.1 * 1000 = 100.00000000000001 or
    0.56 * 10^7 = 5600000.000000001 do not add a class.
    """
    exact = Fraction(repr(float(sample_rate))) * num_local_classes
    return min(num_local_classes, math.ceil(exact))


def sampling_generator(seed: int, step: int, rank: int, device="cpu") -> torch.Generator:
    """A generator on ``device`` whose state is a fixed function of ``(seed, step, rank)``.

    Draws are reproducible per device type (CPU and CUDA generators differ).
    """
    mixed = 0
    for part in (seed, step, rank):
        mixed = ((mixed ^ (int(part) & 0xFFFFFFFFFFFFFFFF)) * _MIX + 0x632BE5AB) % (1 << 63)
    gen = torch.Generator(device=device)
    gen.manual_seed(mixed)
    return gen


def sample_active_classes(
    positives: Tensor,
    num_local_classes: int,
    budget: int,
    generator: torch.Generator,
    positives_sorted: bool = False,
) -> Tensor:
    """Sorted local class indices: all ``positives`` plus uniform negatives up to ``budget``.

    The ``n = budget - P`` negatives are a uniformly random ``n``-subset of the ``N = C_local - P``
    non-positive classes, drawn in ``O(n log n)`` time and memory when ``n <= N / 4``
    (:func:`_distinct_uniform`) and by a permutation of ``N`` otherwise, then mapped to class
    indices past the positives (:func:`_skip_positives`). Nothing of size ``C_local`` is built
    on the sparse path, so the draw costs the same at 10^5 and 10^7 classes per rank.

    Args:
        positives: unique local class indices (any order) that must be active.
        num_local_classes: ``C_local``.
        budget: target size of the active set.
        generator: a generator on the device where the draw happens (see
            :func:`sampling_generator`); ``positives`` is moved there.
        positives_sorted: ``positives`` are already sorted (ascending): one sort fewer.

    Returns:
        ``(max(budget, len(positives)),)`` long tensor, sorted, on ``positives.device``.
    """
    device = positives.device
    positives = positives.to(generator.device, torch.long)
    if not positives_sorted:
        positives = torch.sort(positives).values
    num_negatives = budget - positives.numel()
    if num_negatives <= 0:
        return positives.to(device)
    pool = num_local_classes - positives.numel()
    if 4 * num_negatives <= pool:
        draws = _distinct_uniform(pool, num_negatives, generator)
    else:
        draws = torch.randperm(pool, generator=generator, device=generator.device)[:num_negatives]
    negatives = _skip_positives(draws, positives)
    return torch.sort(torch.cat([positives, negatives])).values.to(device)


def _distinct_uniform(n: int, m: int, generator: torch.Generator) -> Tensor:
    """A uniformly random ``m``-subset of ``[0, n)`` (unsorted), for ``m`` well below ``n``.

    Draw integers with replacement and keep the distinct ones until there are ``m`` or more,
    then keep a uniform ``m`` of them. The draws are exchangeable under any relabelling of
    ``[0, n)`` and the stopping rule looks only at counts, so the distinct set is a uniform
    subset of its size, and a uniform ``m``-subset of it is a uniform ``m``-subset of ``[0, n)``.
    Expected draws: ``n ln(n / (n - m)) <= 1.16 m`` for ``m <= n / 4``.
    """
    dev = generator.device
    distinct = torch.empty(0, dtype=torch.long, device=dev)
    while distinct.numel() < m:
        extra = int(1.2 * (m - distinct.numel())) + 64
        draws = torch.randint(0, n, (extra,), generator=generator, device=dev)
        distinct = torch.unique(torch.cat([distinct, draws]))
    if distinct.numel() > m:
        keep = torch.randperm(distinct.numel(), generator=generator, device=dev)[:m]
        distinct = distinct[keep]
    return distinct


def _skip_positives(draws: Tensor, sorted_positives: Tensor) -> Tensor:
    """Map ``u`` in ``[0, C_local - P)`` to the ``u``-th class that is not a positive.

    With positives ``p_0 < p_1 < ...``, ``p_j - j`` non-positives precede ``p_j``; the answer is
    ``u`` plus the number of ``j`` with ``p_j - j <= u``.
    """
    shifted = sorted_positives - torch.arange(sorted_positives.numel(), device=draws.device)
    return draws + torch.searchsorted(shifted, draws, right=True)

"""Positive-preserving negative sampling inside one rank's class block (seed 000 §3.3).

The active set of a rank is every local class that is a label in the *global* batch, plus
negatives drawn uniformly without replacement from the remaining local classes, up to a fixed
budget ``ceil(r * C_local)`` (all positives when they alone exceed it). The draw depends only
on ``(seed, step, rank)``.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["sampling_budget", "sampling_generator", "sample_active_classes"]

_MIX = 0x9E3779B97F4A7C15  # 64-bit golden-ratio constant for seed mixing


def sampling_budget(num_local_classes: int, sample_rate: float) -> int:
    """``ceil(r * C_local)``: number of active classes per step when positives fit in it."""
    # round first so that e.g. 0.1 * 1000 = 100.00000000000001 does not become 101
    return min(num_local_classes, math.ceil(round(sample_rate * num_local_classes, 9)))


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
    positives: Tensor, num_local_classes: int, budget: int, generator: torch.Generator
) -> Tensor:
    """Sorted local class indices: all ``positives`` plus uniform negatives up to ``budget``.

    Args:
        positives: unique local class indices (any order) that must be active.
        num_local_classes: ``C_local``.
        budget: target size of the active set.
        generator: a generator on the device where the draw happens (see
            :func:`sampling_generator`); ``positives`` is moved there.

    Returns:
        ``(max(budget, len(positives)),)`` long tensor, sorted, on ``positives.device``.
    """
    device = positives.device
    positives = positives.to(generator.device, torch.long)
    num_negatives = budget - positives.numel()
    if num_negatives <= 0:
        return torch.sort(positives).values.to(device)
    is_positive = torch.zeros(num_local_classes, dtype=torch.bool, device=generator.device)
    is_positive[positives] = True
    perm = torch.randperm(num_local_classes, generator=generator, device=generator.device)
    negatives = perm[~is_positive[perm]][:num_negatives]
    return torch.sort(torch.cat([positives, negatives])).values.to(device)

"""Sampling budget against exact rational arithmetic, and the output contract of the draw
(dtype, sortedness, positives kept) for either path and either positive dtype."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest
import torch

from partialfc.classifier.sampling import (
    sample_active_classes,
    sampling_budget,
    sampling_generator,
)

_CLASS_COUNTS = [1, 2, 3, 7, 10, 99, 1000, 4097, 85_742, 1_000_003, 9_999_675, 10_000_000]


@pytest.mark.parametrize("num_classes", _CLASS_COUNTS)
def test_budget_is_the_exact_ceiling_of_the_rate_as_written(num_classes):
    """``ceil(r * C)`` with ``r`` read as the decimal it was written as (0.56 means 56/100):
    float products such as 0.56 * 10^7 = 5600000.000000001 must not add a class."""
    for percent in range(1, 101):
        rate = percent / 100
        expected = min(num_classes, math.ceil(Fraction(percent, 100) * num_classes))
        assert sampling_budget(num_classes, rate) == expected, (num_classes, rate)
    for rate in (0.001, 0.0125, 1 / 3, 2 / 3):
        expected = min(num_classes, math.ceil(Fraction(repr(rate)) * num_classes))
        assert sampling_budget(num_classes, rate) == expected, (num_classes, rate)


@pytest.mark.parametrize("dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize(
    ("num_classes", "budget"),
    [(50, 2), (50, 8), (50, 30), (400, 40)],  # no negatives / distinct draws / permutation
)
def test_draw_is_sorted_long_and_keeps_every_positive(dtype, num_classes, budget):
    positives = torch.tensor([31, 4, 17], dtype=dtype)
    for step in range(20):
        got = sample_active_classes(positives, num_classes, budget, sampling_generator(3, step, 0))
        assert got.dtype == torch.long
        assert got.numel() == max(budget, positives.numel())
        assert torch.equal(got, torch.unique(got))  # sorted and distinct
        assert torch.isin(positives.long(), got).all()
        assert 0 <= int(got.min()) and int(got.max()) < num_classes


def test_generator_depends_on_seed_step_and_rank_only():
    draws = {}
    for key in [(0, 0, 0), (1, 0, 0), (0, 1, 0), (0, 0, 1), (2**40, 3, 7), (-1, 0, 0)]:
        a = torch.randint(0, 2**31, (4,), generator=sampling_generator(*key))
        b = torch.randint(0, 2**31, (4,), generator=sampling_generator(*key))
        assert torch.equal(a, b)
        draws[key] = tuple(a.tolist())
    assert len(set(draws.values())) == len(draws)

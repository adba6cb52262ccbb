"""Wilson score interval against published values."""

import pytest

from partialfc.eval.intervals import clopper_pearson, wilson


@pytest.mark.parametrize(
    "k, n, lower, upper",
    [  # Newcombe, Statistics in Medicine 1998, Table I, method 3 (score interval)
        (81, 263, 0.2553, 0.3662),
        (15, 148, 0.0624, 0.1605),
        (0, 20, 0.0, 0.1611),
        (1, 29, 0.0061, 0.1718),
    ],
)
def test_wilson_matches_newcombe(k, n, lower, upper):
    low, high = wilson(k, n)
    assert low == pytest.approx(lower, abs=5e-5) and high == pytest.approx(upper, abs=5e-5)


def test_wilson_is_narrower_than_clopper_pearson_and_holds_the_rate():
    for k in (0, 1, 10, 200, 378, 390, 399, 400):
        low, high = wilson(k, 400)
        assert 0 <= low <= k / 400 <= high <= 1
        if 10 <= k <= 390:  # away from 0 and n; at k = 0 Wilson's upper bound is the wider
            cp_low, cp_high = clopper_pearson(k, 400)
            assert high - low < cp_high - cp_low
    assert wilson(0, 400) == (0.0, pytest.approx(1.959964**2 / (400 + 1.959964**2)))
    assert wilson(400, 400)[1] == 1.0 and wilson(400, 400)[0] < 1.0
    assert wilson(200, 400, confidence=0.99)[0] < wilson(200, 400)[0]


@pytest.mark.parametrize("k, n", [(-1, 10), (11, 10), (0, 0)])
def test_wilson_refuses_impossible_counts(k, n):
    with pytest.raises(ValueError, match="need 0 <= k <= n"):
        wilson(k, n)

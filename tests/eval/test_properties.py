"""Property checks against independent brute-force definitions (hypothesis, small inputs)."""

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from sklearn.metrics import roc_auc_score

from partialfc.eval import (
    InsufficientPairsError,
    accuracy_at_threshold,
    best_threshold,
    cmc,
    roc_curve,
    tar_at_far,
)

# integer-valued scores force many ties
scores = st.lists(st.integers(-5, 5), min_size=1, max_size=40)


@settings(max_examples=30, deadline=None)
@given(scores, scores)
def test_roc_counts_and_auc_by_brute_force(gen, imp):
    roc = roc_curve(gen, imp)
    g, i = np.array(gen), np.array(imp)
    for t, ta, fa in zip(
        roc.thresholds[1:], roc.true_accepts[1:], roc.false_accepts[1:], strict=True
    ):
        assert ta == np.sum(g >= t) and fa == np.sum(i >= t)
    y = np.r_[np.ones(g.size), np.zeros(i.size)]
    assert np.isclose(roc.auc, roc_auc_score(y, np.r_[g, i]))


@settings(max_examples=30, deadline=None)
@given(scores, scores, st.sampled_from([0.05, 0.1, 0.25, 0.5]))
def test_tar_at_far_threshold_is_the_lowest_admissible(gen, imp, far):
    i = np.array(imp, dtype=float)
    k = int(np.floor(far * i.size + 1e-9))
    try:
        r = tar_at_far(gen, imp, far)
    except InsufficientPairsError:
        assert k == 0
        return
    assert r.far.k == np.sum(i >= r.threshold) <= k
    # no lower candidate threshold (an impostor score below it) would still admit <= k
    lower = i[i < r.threshold]
    if lower.size:
        assert np.sum(i >= lower.max()) > k
    assert r.tar.k == np.sum(np.array(gen) >= r.threshold)


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(-5, 5), st.booleans()), min_size=1, max_size=40))
def test_best_threshold_reaches_the_brute_force_maximum(pairs):
    s = np.array([p[0] for p in pairs], dtype=float)
    same = np.array([p[1] for p in pairs])
    candidates = np.r_[s, s.max() + 1]
    brute = max(np.sum((s >= t) == same) for t in candidates)
    assert accuracy_at_threshold(s, same, best_threshold(s, same)).accuracy.k == brute


@settings(max_examples=20, deadline=None)
@given(st.integers(0, 10_000))
def test_cmc_rank_equals_sorted_position(seed):
    rng = np.random.default_rng(seed)
    sim = rng.normal(size=(6, 8))  # continuous scores: no ties
    gallery = np.arange(8)
    probes = rng.integers(0, 8, 6)
    curve = cmc(sim, probes, gallery, max_rank=8)
    ranks = [1 + int(np.sum(sim[p] > sim[p, probes[p]])) for p in range(6)]
    assert curve.hits.tolist() == [sum(r <= k for r in ranks) for k in range(1, 9)]

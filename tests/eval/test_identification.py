"""CMC (seed worked example), open-set FNIR@FPIR, faiss search vs brute force."""

import numpy as np
import pytest

from partialfc.eval import identification_report
from partialfc.eval.identification import (
    cmc,
    cmc_from_ranks,
    mated_search,
    open_set_identification,
    ranks_from_neighbors,
)
from partialfc.eval.search import ExactSearch, HNSWSearch, IVFSearch

# Seed 001, ch. 6, "A CMC curve, also by hand": ten probes against a gallery of five
# identities. The per-probe rank table did not survive text extraction; these ranks give the
# curve the text describes (rank-1 at 0.70, reaching 1.0 within the five identities).
SEED_RANKS = [1, 1, 1, 2, 1, 3, 1, 1, 5, 1]
SEED_CMC = [0.7, 0.8, 0.9, 0.9, 1.0]


def _similarity_with_ranks(ranks, n_ids=5, seed=0):
    """Probe x gallery scores where probe i's identity (i % n_ids) sits at ranks[i]."""
    rng = np.random.default_rng(seed)
    levels = np.array([0.9, 0.7, 0.5, 0.3, 0.1])
    sim = np.empty((len(ranks), n_ids))
    labels = np.arange(len(ranks)) % n_ids
    for i, r in enumerate(ranks):
        others = rng.permutation([j for j in range(n_ids) if j != labels[i]])
        order = np.insert(others, r - 1, labels[i])  # identity at position r - 1
        sim[i, order] = levels
    return sim, labels


def test_seed_cmc_counts_by_hand():
    curve = cmc_from_ranks(SEED_RANKS, max_rank=5)
    assert curve.hits.tolist() == [7, 8, 9, 9, 10]
    np.testing.assert_allclose(curve.rates, SEED_CMC)
    sim, labels = _similarity_with_ranks(SEED_RANKS)
    from_scores = cmc(sim, labels, np.arange(5), max_rank=5)
    assert from_scores.hits.tolist() == [7, 8, 9, 9, 10]
    assert curve.rank(1).k == 7 and curve.rank(1).n == 10


def test_rank_counts_identities_and_ties_count_against():
    # gallery rows: ids [0, 0, 1, 2]; probe of id 0 best mated 0.6, id 1 scores 0.6 (tie)
    sim = np.array([[0.6, 0.2, 0.6, 0.1], [0.1, 0.9, 0.95, 0.97]])
    m = mated_search(sim, [0, 7], [0, 0, 1, 2])
    assert m.ranks.tolist() == [2, 0]  # tie -> rank 2; id 7 not enrolled -> 0
    assert m.mated_scores[0] == pytest.approx(0.6)


def test_scores_are_compared_in_their_own_precision():
    # distinct in float64, equal once rounded to float32
    sim = np.array([[0.30000001, 0.30000002]])
    assert np.float32(sim[0, 0]) == np.float32(sim[0, 1])
    assert mated_search(sim, [1], [0, 1]).ranks.tolist() == [1]
    assert mated_search(sim, [0], [0, 1]).ranks.tolist() == [2]
    assert mated_search(sim, [1], [0, 1]).mated_scores.dtype == np.float64
    # float32 scores are compared as float32: there the two are a tie, counted against
    assert mated_search(sim.astype(np.float32), [1], [0, 1]).ranks.tolist() == [2]
    assert cmc(sim, [1], [0, 1], max_rank=2).hits.tolist() == [1, 1]


def test_identification_report_keeps_float64_embeddings():
    # the probe's cosines to its own identity (1) and to the other (1 - 5e-11) round to the
    # same float32 value
    delta = 1e-5
    gallery = np.array([[1.0, 0.0], [np.cos(delta), np.sin(delta)]])
    probe = np.array([[1.0, 0.0]])
    r = identification_report("t", gallery, [0, 1], probe, [0], max_rank=2)
    assert r.cmc.hits.tolist() == [1, 1]
    g32, p32 = gallery.astype(np.float32), probe.astype(np.float32)
    r32 = identification_report("t", g32, [0, 1], p32, [0], max_rank=2)
    assert r32.cmc.hits.tolist() == [0, 1]


def test_open_set_float32_mated_score_tied_with_the_boundary_is_a_miss():
    # float32 scores (what a float32 gallery search returns): FPIR 0.1 over 10 non-mated
    # probes -> k = 1 -> the threshold is just above the 2nd highest, float32(0.3); a mated
    # score equal to it must not count as a hit
    nonmated = np.array([0.9, 0.3] + [0.0] * 8, dtype=np.float32)
    m = mated_search(np.array([[0.3, 0.1]], dtype=np.float32), [0], [0, 1])
    assert m.ranks.tolist() == [1] and m.mated_scores[0] == nonmated[1]
    (p,) = open_set_identification(m, nonmated, target_fpirs=[0.1])
    assert (p.fpir.k, p.fnir.k, p.fnir.n) == (1, 1, 1)


def test_ranks_from_neighbors_dedupes_identities():
    nl = np.array([[3, 3, 5, 1], [2, 4, 4, 4], [9, 9, 9, 9]])
    assert ranks_from_neighbors(nl, [1, 2, 1]).tolist() == [3, 1, 0]


def test_open_set_fnir_at_fpir_by_hand():
    # 10 non-mated probes: top scores; FPIR = 0.1 -> k = 1 false positive allowed -> the
    # threshold sits just above the 2nd highest, 0.5: only the 0.7 probe returns a candidate
    nonmated = [0.7, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.2, 0.1, 0.0]
    # mated probes: hits need rank 1 and a mated score > 0.5
    sim = np.array([[0.9, 0.1], [0.65, 0.1], [0.8, 0.85], [0.2, 0.75], [0.5, 0.1]])
    m = mated_search(sim, [0, 0, 0, 1, 0], [0, 1])
    assert m.ranks.tolist() == [1, 1, 2, 1, 1]
    (p,) = open_set_identification(m, nonmated, target_fpirs=[0.1, 0.01])  # 0.01 unresolvable
    assert p.threshold == np.nextafter(0.5, 1.0) and (p.fpir.k, p.fpir.n) == (1, 10)
    # misses: the rank-2 probe and the probe tied with the 2nd non-mated score (0.5); the 0.65
    # probe is a hit (a threshold at the highest non-mated score, 0.7, would miss it)
    assert (p.fnir.k, p.fnir.n) == (2, 5)
    assert p.tpir == pytest.approx(0.6)
    (p2,) = open_set_identification(m, nonmated, target_fpirs=[0.1], rank=2)
    assert p2.fnir.k == 1


def _unit(rng, n, d):
    x = rng.normal(size=(n, d)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_faiss_exact_search_equals_brute_force():
    rng = np.random.default_rng(0)
    gallery, queries = _unit(rng, 3000, 64), _unit(rng, 200, 64)
    scores, idx = ExactSearch(64).add(gallery).search(queries, 10)
    brute = queries @ gallery.T
    expected = np.argsort(-brute, axis=1)[:, :10]
    np.testing.assert_array_equal(idx, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), atol=1e-5)


def test_approximate_indexes_agree_with_exact():
    rng = np.random.default_rng(1)
    gallery, queries = _unit(rng, 3000, 32), _unit(rng, 200, 32)
    exact = np.argmax(queries @ gallery.T, axis=1)
    _, ivf_all = IVFSearch(32, nlist=16, nprobe=16).add(gallery).search(queries, 1)
    np.testing.assert_array_equal(ivf_all[:, 0], exact)  # visiting every cell is exact
    _, hnsw = HNSWSearch(32, m=16, ef_search=256).add(gallery).search(queries, 1)
    assert np.mean(hnsw[:, 0] == exact) >= 0.95
    with pytest.raises(ValueError, match="nlist=64 needs >= 64"):
        IVFSearch(32, nlist=64).add(gallery[:10])
    with pytest.raises(ValueError, match=r"queries must have shape \(N, 32\)"):
        ExactSearch(32).add(gallery).search(queries[:, :5], 1)

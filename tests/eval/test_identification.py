"""CMC (a worked example), open-set FNIR@FPIR, faiss search vs brute force."""

import numpy as np
import pytest

from partialfc.eval import clopper_pearson, identification_report
from partialfc.eval.identification import (
    cmc,
    cmc_from_ranks,
    mated_search,
    open_set_identification,
    ranks_from_neighbors,
)
from partialfc.eval.search import ExactSearch, HNSWSearch, IVFSearch

# A CMC curve by hand: ten probes against a gallery of five identities, with ranks that give
# rank-1 0.70 and reach 1.0 within the five identities.
WORKED_RANKS = [1, 1, 1, 2, 1, 3, 1, 1, 5, 1]
WORKED_CMC = [0.7, 0.8, 0.9, 0.9, 1.0]


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


def test_worked_cmc_counts_by_hand():
    curve = cmc_from_ranks(WORKED_RANKS, max_rank=5)
    assert curve.hits.tolist() == [7, 8, 9, 9, 10]
    np.testing.assert_allclose(curve.rates, WORKED_CMC)
    sim, labels = _similarity_with_ranks(WORKED_RANKS)
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


def test_cmc_fields_default_depth_and_not_found_by_hand():
    # ranks 0 (not found) and 25 (beyond the default depth of 20) are misses at every rank
    curve = cmc_from_ranks([0, 1, 3, 25])
    assert curve.ranks.tolist() == list(range(1, 21))
    assert curve.hits.tolist() == [1, 1] + [2] * 18 and curve.n_probes == 4
    sim, labels = _similarity_with_ranks(WORKED_RANKS)
    assert cmc(sim, labels, np.arange(5)).ranks.tolist() == list(range(1, 21))
    # the same ranks as floats (e.g. read back from JSON) or as a column
    for ranks in ([0.0, 1.0, 3.0, 25.0], np.array([[0], [1], [3], [25]])):
        assert cmc_from_ranks(ranks).hits.tolist() == curve.hits.tolist()


def test_cmc_and_open_set_to_dict_by_hand():
    curve = cmc_from_ranks([1, 2, 0, 1], max_rank=3)
    assert curve.to_dict() == {
        "ranks": [1, 2, 3],
        "hits": [2, 3, 3],
        "n_probes": 4,
        "type": "CmcCurve",
        "rates": [0.5, 0.75, 0.75],
    }
    nonmated = [0.7, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.2, 0.1, 0.0]
    m = mated_search(np.array([[0.9, 0.1], [0.2, 0.75]]), [0, 0], [0, 1])
    (p,) = open_set_identification(m, nonmated, target_fpirs=[0.1])
    d = p.to_dict()
    assert d["tpir"] == 0.5 and d["type"] == "OpenSetPoint"
    assert (d["target_fpir"], d["rank"], d["fnir"]["k"], d["fpir"]["k"]) == (0.1, 1, 1, 1)


def test_labels_given_as_columns_are_read_as_their_values():
    sim = np.array([[0.6, 0.2, 0.6, 0.1], [0.1, 0.9, 0.95, 0.97], [0.3, 0.2, 0.1, 0.4]])
    flat = mated_search(sim, [0, 7, 2], [0, 0, 1, 2])
    assert flat.ranks.tolist() == [2, 0, 1]
    column = mated_search(sim, np.array([[0], [7], [2]]), np.array([[0], [0], [1], [2]]))
    assert column.ranks.tolist() == [2, 0, 1]
    unique = mated_search(sim, [0, 7, 2], np.array([[0], [5], [1], [2]]))
    assert unique.ranks.tolist() == [2, 0, 1]
    nl = np.array([[3, 3, 5, 1], [2, 4, 4, 4], [9, 9, 9, 9]])
    assert ranks_from_neighbors(nl, np.array([[1], [2], [1]])).tolist() == [3, 1, 0]


def test_probe_absent_from_a_gallery_that_brackets_it():
    # label 1 sorts between the enrolled 0 and 2: still absent, rank 0, score -inf
    m = mated_search(np.array([[0.2, 0.9], [0.8, 0.1]]), [1, 0], [0, 2])
    assert m.ranks.tolist() == [0, 1] and m.ranks.dtype == np.int64
    assert m.mated_scores.tolist() == [-np.inf, 0.8]
    r = ranks_from_neighbors(np.array([[2, 0], [0, 2]]), [1, 0])
    assert r.tolist() == [0, 1] and r.dtype == np.int64


def test_score_precision_float32_kept_integers_become_float64():
    sim32 = np.array([[0.25, 0.5]], dtype=np.float32)
    assert mated_search(sim32, [1], [0, 1]).mated_scores.dtype == np.float32
    m = mated_search(np.array([[3, 7, 7]]), [1], [0, 1, 2])
    assert m.ranks.tolist() == [2] and m.mated_scores.tolist() == [7.0]
    assert m.mated_scores.dtype == np.float64


def test_open_set_skips_unresolvable_fpirs_wherever_they_are():
    nonmated = [0.7, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.2, 0.1, 0.0]
    m = mated_search(np.array([[0.9, 0.1]]), [0], [0, 1])
    points = open_set_identification(m, nonmated, target_fpirs=[0.01, 0.1, 0.05, 0.2])
    assert [p.target_fpir for p in points] == [0.1, 0.2]


def test_open_set_mated_score_at_the_threshold_is_a_hit_and_fields_by_hand():
    # FPIR 0.1 of 10 -> threshold = next float64 above 0.5; a mated score equal to it is kept
    nonmated = [0.7, 0.5, 0.45, 0.4, 0.35, 0.3, 0.3, 0.2, 0.1, 0.0]
    at = float(np.nextafter(0.5, 1.0))
    m = mated_search(np.array([[at, 0.1], [0.5, 0.1], [0.2, 0.3]]), [0, 0, 0], [0, 1])
    (p,) = open_set_identification(m, np.array(nonmated)[:, None], [0.1], rank=2, confidence=0.8)
    assert p.threshold == at and (p.target_fpir, p.rank) == (0.1, 2)
    assert (p.fpir.k, p.fpir.n, p.fnir.k, p.fnir.n) == (1, 10, 2, 3)
    assert (p.fpir.lower, p.fpir.upper) == pytest.approx(clopper_pearson(1, 10, 0.8))
    assert (p.fnir.lower, p.fnir.upper) == pytest.approx(clopper_pearson(2, 3, 0.8))
    assert p.fpir.confidence == p.fnir.confidence == 0.8


def test_identification_errors_name_the_argument():
    with pytest.raises(ValueError, match=r"^ranks is empty$"):
        cmc_from_ranks([])
    with pytest.raises(ValueError, match=r"^ranks must be >= 0 \(0 = not found\)$"):
        cmc_from_ranks([1, -1])
    with pytest.raises(ValueError, match=r"^similarity has 2 rows, 3 labels$"):
        mated_search(np.zeros((2, 4)), [0, 1, 2], [0, 1, 2, 3])
    with pytest.raises(ValueError, match=r"^similarity \(1, 2\) does not match 3 gallery labels$"):
        mated_search(np.zeros((1, 2)), [0], [0, 1, 2])
    with pytest.raises(ValueError, match=r"^neighbor_labels \(2, 3\) vs 3 probes$"):
        ranks_from_neighbors(np.zeros((2, 3)), [0, 1, 2])
    with pytest.raises(
        ValueError, match=r"^no non-mated probes: open-set rates need probes absent"
    ):
        open_set_identification(mated_search(np.ones((1, 1)), [0], [0]), [])


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

"""1:N identification: closed-set CMC and open-set FNIR at FPIR (NIST FRVT 1:N, Grother et al.,
NISTIR 8271, 2019).

Ranks count *identities*, not gallery rows: a probe's mated rank is 1 + the number of other
identities whose best score is ``>=`` the best mated score (ties count against the probe).
Scores are compared in the precision they come in (float64 stays float64).

Open-set: the threshold comes from the top-1 scores of the ``n`` non-mated probes alone, with
the TAR@FAR rule of :mod:`partialfc.eval.tar_at_far`: ``k = floor(FPIR · n)`` and the threshold
just above the ``(k+1)``-th highest non-mated score, the lowest one that lets at most ``k``
non-mated searches return anything at or above it. A mated search is a miss (FNIR) unless its
mated identity is at rank ≤ R with a score ``>=`` the threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .intervals import Proportion, proportion
from .results import Result
from .tar_at_far import threshold_from_top_impostors, top_descending


@dataclass(frozen=True)
class MatedSearch(Result):
    """Per-probe outcome of searching mated probes: rank (0 = absent) and the mated score."""

    ranks: np.ndarray
    mated_scores: np.ndarray


def _per_identity_max(similarity: np.ndarray, gallery_labels) -> tuple[np.ndarray, np.ndarray]:
    """Reduce ``(P, G)`` scores to ``(P, n_identities)``: best gallery row of each identity."""
    labels = np.asarray(gallery_labels).reshape(-1)
    if similarity.ndim != 2 or similarity.shape[1] != labels.size:
        raise ValueError(
            f"similarity {similarity.shape} does not match {labels.size} gallery labels"
        )
    ids, index = np.unique(labels, return_inverse=True)
    if ids.size == labels.size:
        return ids, similarity[:, np.argsort(index)]
    order = np.argsort(index, kind="stable")
    starts = np.flatnonzero(np.r_[True, np.diff(index[order]) != 0])
    return ids, np.maximum.reduceat(similarity[:, order], starts, axis=1)


def _as_scores_matrix(similarity) -> np.ndarray:
    """Scores as an array in their own floating precision (integers become float64)."""
    similarity = np.asarray(similarity)
    if not np.issubdtype(similarity.dtype, np.floating):
        similarity = similarity.astype(np.float64)
    return similarity


def mated_search(similarity, probe_labels, gallery_labels) -> MatedSearch:
    """Rank and score of each probe's own identity in the gallery (full ``(P, G)`` scores)."""
    similarity = _as_scores_matrix(similarity)
    probe_labels = np.asarray(probe_labels).reshape(-1)
    if similarity.shape[0] != probe_labels.size:
        raise ValueError(f"similarity has {similarity.shape[0]} rows, {probe_labels.size} labels")
    ids, per_id = _per_identity_max(similarity, gallery_labels)
    pos = np.searchsorted(ids, probe_labels)
    present = (pos < ids.size) & (ids[np.minimum(pos, ids.size - 1)] == probe_labels)
    rows = np.arange(probe_labels.size)
    mated = np.where(present, per_id[rows, np.minimum(pos, ids.size - 1)], -np.inf)
    better = (per_id >= mated[:, None]).sum(axis=1)  # includes the mated identity itself
    return MatedSearch(ranks=np.where(present, better, 0).astype(np.int64), mated_scores=mated)


def ranks_from_neighbors(neighbor_labels, probe_labels) -> np.ndarray:
    """Mated rank from ranked search results ``(P, k)`` (e.g. faiss); 0 if not in the top k.

    Repeated identities in a result list count once (rank is over identities).
    """
    nl = np.asarray(neighbor_labels)
    probe_labels = np.asarray(probe_labels).reshape(-1)
    if nl.ndim != 2 or nl.shape[0] != probe_labels.size:
        raise ValueError(f"neighbor_labels {nl.shape} vs {probe_labels.size} probes")
    k = nl.shape[1]
    earlier = np.tril(np.ones((k, k), dtype=bool), -1)
    repeat = ((nl[:, :, None] == nl[:, None, :]) & earlier).any(axis=2)
    distinct_rank = np.cumsum(~repeat, axis=1)
    hit = nl == probe_labels[:, None]
    first = np.argmax(hit, axis=1)
    found = hit.any(axis=1)
    return np.where(found, distinct_rank[np.arange(nl.shape[0]), first], 0).astype(np.int64)


@dataclass(frozen=True)
class CmcCurve(Result):
    """Rank-k identification rate for k = 1..max_rank, with the hit counts."""

    ranks: np.ndarray
    hits: np.ndarray
    n_probes: int

    @property
    def rates(self) -> np.ndarray:
        return self.hits / self.n_probes

    def rank(self, k: int) -> Proportion:
        return proportion(int(self.hits[k - 1]), self.n_probes)

    def to_dict(self):
        out = super().to_dict()
        out["rates"] = self.rates.tolist()
        return out


def cmc_from_ranks(ranks, max_rank: int = 20) -> CmcCurve:
    """CMC from mated ranks (1-based; 0 = true identity not found / not enrolled)."""
    ranks = np.asarray(ranks, dtype=np.int64).reshape(-1)
    if ranks.size == 0:
        raise ValueError("ranks is empty")
    if (ranks < 0).any():
        raise ValueError("ranks must be >= 0 (0 = not found)")
    found = ranks[ranks > 0]
    counts = np.bincount(np.minimum(found, max_rank + 1), minlength=max_rank + 2)[1 : max_rank + 1]
    return CmcCurve(
        ranks=np.arange(1, max_rank + 1), hits=np.cumsum(counts), n_probes=int(ranks.size)
    )


def cmc(similarity, probe_labels, gallery_labels, max_rank: int = 20) -> CmcCurve:
    """Closed-set CMC from full probe×gallery scores."""
    return cmc_from_ranks(mated_search(similarity, probe_labels, gallery_labels).ranks, max_rank)


@dataclass(frozen=True)
class OpenSetPoint(Result):
    """FNIR at a target FPIR; TPIR = 1 − FNIR."""

    target_fpir: float
    threshold: float
    rank: int
    fpir: Proportion
    fnir: Proportion

    @property
    def tpir(self) -> float:
        return 1.0 - self.fnir.rate

    def to_dict(self):
        out = super().to_dict()
        out["tpir"] = self.tpir
        return out


def open_set_identification(
    mated: MatedSearch,
    nonmated_top_scores,
    target_fpirs=(1e-1, 1e-2),
    rank: int = 1,
    confidence: float = 0.95,
) -> list[OpenSetPoint]:
    """FNIR at each FPIR that the non-mated probes can resolve (others are skipped).

    ``nonmated_top_scores``: the best gallery score of each non-mated probe.
    """
    top = np.asarray(nonmated_top_scores, dtype=np.float64).reshape(-1)
    if top.size == 0:
        raise ValueError("no non-mated probes: open-set rates need probes absent from the gallery")
    points = []
    for fpir in target_fpirs:
        k = int(np.floor(fpir * top.size + 1e-9))
        if k == 0:
            continue
        chosen = threshold_from_top_impostors(
            top_descending(top, k + 1), top.size, fpir, what="non-mated probes"
        )
        mated_scores = np.asarray(mated.mated_scores, dtype=np.float64)
        hit = (mated.ranks >= 1) & (mated.ranks <= rank) & (mated_scores >= chosen.threshold)
        points.append(
            OpenSetPoint(
                target_fpir=float(fpir),
                threshold=chosen.threshold,
                rank=rank,
                fpir=proportion(chosen.false_accepts, top.size, confidence),
                fnir=proportion(int(hit.size - hit.sum()), int(hit.size), confidence),
            )
        )
    return points

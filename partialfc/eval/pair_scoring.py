"""All-pairs scoring at scale: blockwise GEMM into a fine histogram plus the exact top scores.

``N`` templates give ``N(N−1)/2`` pairs — 10^8 for N ≈ 14,150 (the size of IJB-C's
1:1 protocol, Maze et al., ICB 2018). The scores
are never materialised: each ``block × block`` tile of ``E Eᵀ`` (upper triangle only) is
reduced at once into

* a histogram of impostor scores on ``n_bins`` equal bins over [−1, 1] (ROC curve, EER), and
* the exact ``keep_top`` highest impostor scores, which fix the TAR@FAR threshold (just above
  the ``(k+1)``-th highest, :mod:`partialfc.eval.tar_at_far`) exactly for every
  FAR ≤ (keep_top − 1) / n_impostor,
* every genuine score (same label), exactly; rows are sorted by label so only tiles whose label
  ranges overlap need the label comparison.

:func:`count_scores_at_least` is an exact second pass for any other threshold.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .progress import progress_bar
from .roc import RocCurve
from .tar_at_far import TarAtFar, tar_at_threshold, threshold_from_top_impostors


@dataclass
class PairScoreSummary:
    """Impostor histogram + exact top impostor scores + exact genuine scores."""

    n_impostor: int
    impostor_histogram: np.ndarray  # int64 (n_bins,), bins [-1 + i·w, -1 + (i+1)·w)
    top_impostor_scores: np.ndarray  # descending, exact
    genuine_scores: np.ndarray  # exact, in no particular order

    @property
    def n_bins(self) -> int:
        return int(self.impostor_histogram.size)

    @property
    def bin_width(self) -> float:
        return 2.0 / self.n_bins

    def to_dict(self) -> dict:
        return {
            "n_impostor": self.n_impostor,
            "n_genuine": int(self.genuine_scores.size),
            "n_bins": self.n_bins,
            "bin_width": self.bin_width,
            "n_top_impostor_scores": int(self.top_impostor_scores.size),
        }

    @property
    def max_exact_far(self) -> float:
        """Largest FAR whose threshold the kept top scores determine exactly."""
        return (self.top_impostor_scores.size - 1) / self.n_impostor

    def tar_at_far(self, target_far: float, genuine=None, confidence: float = 0.95) -> TarAtFar:
        """Exact TAR@FAR: threshold just above the ``(k+1)``-th highest kept impostor score,
        stepped in float32 (the precision the pairs were scored in, and that
        :func:`count_scores_at_least` compares in)."""
        k = int(np.floor(target_far * self.n_impostor + 1e-9))
        kept = self.top_impostor_scores.size
        if k + 1 > kept and kept < self.n_impostor:
            raise ValueError(
                f"FAR = {target_far:g} needs the top {k + 1} impostor scores but only "
                f"{self.top_impostor_scores.size} were kept; score again with a larger keep_top"
            )
        chosen = threshold_from_top_impostors(
            self.top_impostor_scores, self.n_impostor, target_far, score_dtype=np.float32
        )
        gen = self.genuine_scores if genuine is None else genuine
        return tar_at_threshold(gen, chosen, confidence)

    def roc(self, genuine=None) -> RocCurve:
        """ROC at the histogram's bin edges (accept ``score >= edge``); counts exact up to
        float rounding of scores that fall exactly on an edge."""
        gen = np.asarray(self.genuine_scores if genuine is None else genuine, dtype=np.float64)
        gen_hist = np.bincount(_bin_index(gen, self.n_bins), minlength=self.n_bins)
        used = np.flatnonzero((gen_hist > 0) | (self.impostor_histogram > 0))[::-1]
        true_accepts = np.cumsum(gen_hist[::-1])[::-1][used]
        false_accepts = np.cumsum(self.impostor_histogram[::-1])[::-1][used]
        edges = -1.0 + used * self.bin_width
        return RocCurve(
            thresholds=np.concatenate([[np.inf], edges]),
            true_accepts=np.concatenate([[0], true_accepts]).astype(np.int64),
            false_accepts=np.concatenate([[0], false_accepts]).astype(np.int64),
            n_genuine=int(gen.size),
            n_impostor=self.n_impostor,
        )


def _bin_index(scores: np.ndarray, n_bins: int) -> np.ndarray:
    idx = np.floor((np.asarray(scores, dtype=np.float64) + 1.0) * (n_bins / 2.0))
    return np.clip(idx, 0, n_bins - 1).astype(np.int64)


class _TopK:
    """Running multiset of the ``k`` largest values seen."""

    def __init__(self, k: int):
        self.k = int(k)
        self.values = np.empty(0, dtype=np.float32)
        self.cutoff = -np.inf

    def update(self, values: np.ndarray) -> None:
        if self.k == 0:
            return
        if self.values.size >= self.k:
            values = values[values > self.cutoff]
        if values.size == 0:
            return
        merged = np.concatenate([self.values, values.astype(np.float32, copy=False)])
        if merged.size > self.k:
            merged = np.partition(merged, merged.size - self.k)[merged.size - self.k :]
        self.values = merged
        if merged.size >= self.k:
            self.cutoff = float(merged.min())


class _Accumulator:
    """Impostor histogram, running top-k and genuine scores, fed tile by tile."""

    def __init__(self, n_bins: int, keep_top: int, tile_size: int):
        self.n_bins = n_bins
        self.hist = np.zeros(n_bins, dtype=np.int64)
        self.top = _TopK(keep_top)
        self.genuine: list[np.ndarray] = []
        self.n_impostor = 0
        self._scale = np.float32(n_bins / 2.0)
        self._work = np.empty(tile_size, dtype=np.float32)
        self._index = np.empty(tile_size, dtype=np.int32)

    def add_impostors_fast(self, s: np.ndarray) -> None:
        """Every entry of the contiguous tile ``s`` is an impostor pair."""
        flat = s.reshape(-1)
        w, idx = self._work[: flat.size], self._index[: flat.size]
        np.add(flat, np.float32(1.0), out=w)
        np.multiply(w, self._scale, out=w)
        np.clip(w, 0, self.n_bins - 1, out=w)
        np.copyto(idx, w, casting="unsafe")  # truncation = floor for w >= 0
        self.hist += np.bincount(idx, minlength=self.n_bins)
        self.top.update(flat)
        self.n_impostor += flat.size

    def add_masked(self, s: np.ndarray, valid, same) -> None:
        impostor = np.ones(s.shape, dtype=bool) if valid is None else valid.copy()
        if same is not None:
            self.genuine.append(s[same].astype(np.float64))
            impostor &= ~same
        imp = s[impostor]
        self.hist += np.bincount(_bin_index(imp, self.n_bins), minlength=self.n_bins)
        self.top.update(imp)
        self.n_impostor += imp.size


def _prepare(embeddings, labels, block: int):
    e = np.ascontiguousarray(np.asarray(embeddings, dtype=np.float32))
    if e.ndim != 2 or e.shape[0] < 2:
        raise ValueError(f"embeddings must be (N >= 2, d), got shape {e.shape}")
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    if labels is None:
        return e, None
    labels = np.asarray(labels).reshape(-1)
    if labels.size != e.shape[0]:
        raise ValueError(f"labels has {labels.size} entries, embeddings has {e.shape[0]} rows")
    order = np.argsort(labels, kind="stable")
    return np.ascontiguousarray(e[order]), labels[order]


def upper_tiles(n: int, block: int):
    """Upper-triangle tiles ``(r0, r1, c0, c1)`` with ``c0 >= r0``."""
    starts = range(0, n, block)
    for r0 in starts:
        for c0 in starts:
            if c0 >= r0:
                yield r0, min(r0 + block, n), c0, min(c0 + block, n)


def _sub_tiles(height: int, width: int, sub: int, diagonal: bool):
    """Sub-tiles of a ``height × width`` tile; on a diagonal tile only those on or above it."""
    for a0 in range(0, height, sub):
        for b0 in range(a0 if diagonal else 0, width, sub):
            yield a0, min(a0 + sub, height), b0, min(b0 + sub, width)


def _pair_masks(labels, r0, r1, c0, c1):
    """(valid pair mask or None if all valid, genuine mask or None if no genuine pairs)."""
    valid = None
    if r0 == c0:  # diagonal tile: strict upper triangle only
        valid = np.triu(np.ones((r1 - r0, c1 - c0), dtype=bool), 1)
    genuine = None
    if labels is not None and labels[r1 - 1] >= labels[c0]:  # sorted: label ranges overlap
        same = labels[r0:r1, None] == labels[None, c0:c1]
        if same.any():
            genuine = same if valid is None else same & valid
    return valid, genuine


def _tile_pairs(r0: int, r1: int, c0: int, c1: int) -> int:
    """Unordered pairs in a tile of :func:`upper_tiles` (a diagonal tile holds each once)."""
    k = r1 - r0
    return k * (k - 1) // 2 if r0 == c0 else k * (c1 - c0)


def score_all_pairs(
    embeddings,
    labels=None,
    *,
    block: int = 4096,
    n_bins: int = 1 << 16,
    keep_top: int = 20_000,
    sub_block: int = 512,
) -> PairScoreSummary:
    """Score every unordered pair of rows of ``embeddings`` (L2-normalised, ``(N, d)``).

    Pairs with equal ``labels`` are genuine; with ``labels=None`` every pair is an impostor
    (one template per subject). Memory is O(block² + keep_top), independent of N². A progress
    bar over the pairs shows on a terminal (:mod:`partialfc.eval.progress`).
    """
    e, labels = _prepare(embeddings, labels, block)
    n = e.shape[0]
    acc = _Accumulator(n_bins, keep_top, min(block, n) ** 2)
    tile = np.empty(min(block, n) ** 2, dtype=np.float32)
    bar = progress_bar(n * (n - 1) // 2, "scoring pairs", "pair")
    for r0, r1, c0, c1 in upper_tiles(n, block):
        s = tile[: (r1 - r0) * (c1 - c0)].reshape(r1 - r0, c1 - c0)
        np.matmul(e[r0:r1], e[c0:c1].T, out=s)
        valid, same = _pair_masks(labels, r0, r1, c0, c1)
        if valid is None and same is None:
            acc.add_impostors_fast(s)
        else:
            # tiles on the diagonal or with genuine pairs: only their small sub-tiles that
            # actually need a mask take the masked path
            for a0, a1, b0, b1 in _sub_tiles(r1 - r0, c1 - c0, sub_block, diagonal=r0 == c0):
                part = s[a0:a1, b0:b1]
                valid, same = _pair_masks(labels, r0 + a0, r0 + a1, c0 + b0, c0 + b1)
                if valid is None and same is None:
                    acc.add_impostors_fast(np.ascontiguousarray(part))
                else:
                    acc.add_masked(part, valid, same)
        bar.update(_tile_pairs(r0, r1, c0, c1))
    bar.close()
    hist, top, genuine, n_impostor = acc.hist, acc.top, acc.genuine, acc.n_impostor
    return PairScoreSummary(
        n_impostor=int(n_impostor),
        impostor_histogram=hist,
        top_impostor_scores=np.sort(top.values.astype(np.float64))[::-1],
        genuine_scores=np.concatenate(genuine) if genuine else np.empty(0),
    )


def count_scores_at_least(embeddings, thresholds, labels=None, *, block: int = 4096) -> dict:
    """Exact second pass: ``{"impostor": counts, "genuine": counts}`` of pairs ``>= t`` for
    each threshold in ``thresholds`` (any number of them, one GEMM sweep)."""
    e, labels = _prepare(embeddings, labels, block)
    t = np.sort(np.asarray(thresholds, dtype=np.float32).reshape(-1))
    imp_counts = np.zeros(t.size, dtype=np.int64)
    gen_counts = np.zeros(t.size, dtype=np.int64)
    for r0, r1, c0, c1 in upper_tiles(e.shape[0], block):
        s = e[r0:r1] @ e[c0:c1].T
        valid, same = _pair_masks(labels, r0, r1, c0, c1)
        mask = np.ones(s.shape, dtype=bool) if valid is None else valid
        if same is not None:
            g = np.sort(s[same])
            gen_counts += g.size - np.searchsorted(g, t, side="left")
            mask = mask & ~same
        imp = s[mask] if (valid is not None or same is not None) else s.ravel()
        # counts >= t for sorted t: bucket each score below the thresholds it reaches
        reached = np.searchsorted(t, imp, side="right")  # number of thresholds <= score
        imp_counts += np.cumsum(np.bincount(reached, minlength=t.size + 1)[::-1])[::-1][1:]
    return {"thresholds": t.astype(np.float64), "impostor": imp_counts, "genuine": gen_counts}

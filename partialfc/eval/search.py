"""Gallery search by inner product (cosine on L2-normalised embeddings) through faiss.

All indexes share one interface: ``add(embeddings)`` then ``search(queries, k) -> (scores,
indices)``, scores descending, index ``-1`` where fewer than ``k`` results exist.
``ExactSearch`` is brute force (``IndexFlatIP``); ``IVFSearch`` and ``HNSWSearch`` trade a
little recall for speed on large galleries.
"""

from __future__ import annotations

import numpy as np


def _rows(x: np.ndarray, dim: int, name: str) -> np.ndarray:
    x = np.ascontiguousarray(np.asarray(x, dtype=np.float32))
    if x.ndim != 2 or x.shape[1] != dim:
        raise ValueError(f"{name} must have shape (N, {dim}), got {x.shape}")
    return x


class GallerySearch:
    """Base class: subclasses create ``self.index`` (a faiss index, inner-product metric)."""

    def __init__(self, dim: int):
        self.dim = int(dim)
        self.index = self._make_index()

    def _make_index(self):
        raise NotImplementedError

    def __len__(self) -> int:
        return int(self.index.ntotal)

    def add(self, embeddings: np.ndarray) -> GallerySearch:
        x = _rows(embeddings, self.dim, "embeddings")
        if not self.index.is_trained:
            self.index.train(x)
        self.index.add(x)
        return self

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        if len(self) == 0:
            raise ValueError("the gallery is empty: add() embeddings before searching")
        scores, indices = self.index.search(_rows(queries, self.dim, "queries"), int(k))
        return scores, indices


class ExactSearch(GallerySearch):
    """Exact maximum inner product (``faiss.IndexFlatIP``)."""

    def _make_index(self):
        import faiss

        return faiss.IndexFlatIP(self.dim)


class IVFSearch(GallerySearch):
    """Inverted file over ``nlist`` k-means cells, ``nprobe`` cells visited per query.

    Trained on the first ``add()`` (needs at least ``nlist`` embeddings; ~40·nlist is better).
    """

    def __init__(self, dim: int, nlist: int = 1024, nprobe: int = 32):
        self.nlist, self.nprobe = int(nlist), int(nprobe)
        super().__init__(dim)

    def _make_index(self):
        import faiss

        quantizer = faiss.IndexFlatIP(self.dim)
        index = faiss.IndexIVFFlat(quantizer, self.dim, self.nlist, faiss.METRIC_INNER_PRODUCT)
        index.nprobe = self.nprobe
        self._quantizer = quantizer  # keep alive alongside the index
        return index

    def add(self, embeddings: np.ndarray) -> IVFSearch:
        if not self.index.is_trained and len(embeddings) < self.nlist:
            raise ValueError(f"IVF with nlist={self.nlist} needs >= {self.nlist} embeddings")
        return super().add(embeddings)


class HNSWSearch(GallerySearch):
    """Hierarchical navigable small-world graph (``M`` links per node, ``ef_search`` beam)."""

    def __init__(self, dim: int, m: int = 32, ef_search: int = 128):
        self.m, self.ef_search = int(m), int(ef_search)
        super().__init__(dim)

    def _make_index(self):
        import faiss

        index = faiss.IndexHNSWFlat(self.dim, self.m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efSearch = self.ef_search
        return index

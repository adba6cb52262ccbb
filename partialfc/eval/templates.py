"""Templates: many images of one subject, one vector (IJB-C templates, Maze et al.,
ICB 2018).

Average the *un-normalised* embeddings, then normalise: the norm carries quality, so the sum is
a free quality-weighted average. IJB templates pool by media first (the frames of one video are
nearly one sample): average within each media, then across the media of the template.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .embedding import l2_normalize


def _mean_by_group(values: np.ndarray, group_index: np.ndarray, n_groups: int) -> np.ndarray:
    """Row means of ``values`` per group (sparse averaging matrix; no Python loop)."""
    counts = np.bincount(group_index, minlength=n_groups).astype(np.float64)
    weights = 1.0 / counts[group_index]
    average = sp.csr_matrix(
        (weights, (group_index, np.arange(group_index.size))), shape=(n_groups, group_index.size)
    )
    return np.asarray(average @ values.astype(np.float64), dtype=np.float32)


def pool_templates(embeddings: np.ndarray, template_ids) -> tuple[np.ndarray, np.ndarray]:
    """``(unique template ids, normalised templates (T, d))``: mean of raw rows, then L2."""
    embeddings = np.asarray(embeddings)
    template_ids = np.asarray(template_ids).reshape(-1)
    if embeddings.ndim != 2 or embeddings.shape[0] != template_ids.size:
        raise ValueError(
            f"embeddings {embeddings.shape} and template_ids ({template_ids.size},) disagree"
        )
    ids, index = np.unique(template_ids, return_inverse=True)
    return ids, l2_normalize(_mean_by_group(embeddings, index, ids.size))


def pool_media_templates(
    embeddings: np.ndarray, template_ids, media_ids
) -> tuple[np.ndarray, np.ndarray]:
    """IJB pooling: mean of raw rows within each (template, media), mean over media, L2."""
    embeddings = np.asarray(embeddings)
    template_ids = np.asarray(template_ids).reshape(-1)
    media_ids = np.asarray(media_ids).reshape(-1)
    if not embeddings.shape[0] == template_ids.size == media_ids.size:
        raise ValueError(
            f"embeddings ({embeddings.shape[0]} rows), template_ids ({template_ids.size}) and "
            f"media_ids ({media_ids.size}) must have the same length"
        )
    ids, t_index = np.unique(template_ids, return_inverse=True)
    _, m_index = np.unique(media_ids, return_inverse=True)
    pairs, pair_index = np.unique(np.stack([t_index, m_index], 1), axis=0, return_inverse=True)
    pair_index = pair_index.reshape(-1)
    media_means = _mean_by_group(embeddings, pair_index, len(pairs))
    return ids, l2_normalize(_mean_by_group(media_means, pairs[:, 0], ids.size))

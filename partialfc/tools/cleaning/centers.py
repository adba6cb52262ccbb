"""The sub-centers a cleaning needs: the trained head's center table, through the head contract
(:meth:`partialfc.losses.contract.Head.class_centers`), and each sample's cosines to the
sub-centers of its own class."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def load_head_centers(checkpoint: str | Path) -> tuple[torch.Tensor, int]:
    """``(centers (C*K, d) float32, K)`` of the head of a training checkpoint, through the head
    contract: the head its config builds, with its saved state (any number of shards), asked
    for :meth:`~partialfc.losses.contract.Head.class_centers`. Any head kind with centers works
    (Partial FC, margin-softmax with sub-centers, softmax, ProxyNCA)."""
    from partialfc.train.builders import load_trained_head

    head, cfg = load_trained_head(checkpoint)
    centers = head.class_centers()
    if centers is None:
        raise ValueError(f"{checkpoint}: its head (head.kind={cfg.head.kind!r}) has no centers")
    return centers, int(head.num_subcenters)


def own_class_subcenter_cosines(
    embeddings: np.ndarray,
    labels: np.ndarray,
    centers: torch.Tensor,
    num_subcenters: int,
    chunk: int = 65536,
) -> np.ndarray:
    """``(N, K)`` cosines of each (unit) embedding to the K sub-centers of its own class.

    ``centers`` is class-major ``(C*K, d)``; only the K rows of each sample's class are read, so
    the cost is O(N·K·d) whatever the number of classes. Embeddings are read in chunks (a
    memory map stays on disk)."""
    k = int(num_subcenters)
    labels = np.asarray(labels, dtype=np.int64)
    c = centers.shape[0] // k
    if centers.shape[0] != c * k:
        raise ValueError(f"centers have {centers.shape[0]} rows, not a multiple of K={k}")
    if labels.size and (labels.min() < 0 or labels.max() >= c):
        raise ValueError(f"labels outside [0, {c}): the head has {c} classes")
    w = torch.nn.functional.normalize(centers.float(), dim=1).reshape(c, k, -1)
    out = np.empty((len(labels), k), dtype=np.float32)
    for start in range(0, len(labels), chunk):
        x = torch.from_numpy(np.ascontiguousarray(embeddings[start : start + chunk]))
        x = torch.nn.functional.normalize(x.float(), dim=1)
        y = torch.from_numpy(labels[start : start + chunk])
        out[start : start + len(x)] = torch.einsum("nd,nkd->nk", x, w[y]).numpy()
    return out

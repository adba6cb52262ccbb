"""The sub-centers a cleaning needs: the trained head's center table, through the head contract
(:meth:`partialfc.losses.contract.Head.class_centers`), and each sample's cosines to the
sub-centers of its own class."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch


def load_head_centers(checkpoint: str | Path) -> tuple[torch.Tensor, int]:
    """``(centers (C*K, d) float32, K)`` from a Partial FC checkpoint directory (the ``head``
    folder of a training checkpoint, or the training checkpoint itself), whatever number of
    shards it was written with: the shards are resharded into one block by the classifier's own
    loader and gathered with :func:`partialfc.classifier.gather_full_centers`."""
    from partialfc.classifier import PartialFC, gather_full_centers, load_partial_fc_checkpoint
    from partialfc.losses.margins import NormFaceMargin

    path = Path(checkpoint)
    head_dir = path / "head" if (path / "head" / "manifest.json").is_file() else path
    manifest_path = head_dir / "manifest.json"
    if not manifest_path.is_file():
        raise ValueError(f"{checkpoint}: no Partial FC head (manifest.json) found")
    manifest = json.loads(manifest_path.read_text())
    try:
        num_classes = int(manifest["num_classes"])
        dim = int(manifest["embedding_dim"])
        k = int(manifest["num_subcenters"])
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{manifest_path}: incomplete manifest ({err})") from None
    head = PartialFC(num_classes, dim, NormFaceMargin(), num_subcenters=k, init_std=0.0)
    load_partial_fc_checkpoint(head_dir, head)
    return gather_full_centers(head), k


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

"""Embedding a whole training set to a float32 memory map on disk (sets larger than memory),
through the backbone's one embedding loop (:func:`partialfc.backbone.embedding.run_backbone`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


@torch.no_grad()
def embed_to_memmap(
    backbone: torch.nn.Module,
    dataset,
    path: str | Path,
    batch_size: int = 512,
    device: str | torch.device = "cpu",
    num_workers: int = 0,
) -> np.memmap:
    """Embed ``dataset`` (yielding ``(uint8 C×H×W, label, ...)``) into an (N, d) float32 memory
    map at ``path``, rows L2-normalised; only one batch is in memory at a time."""
    from partialfc.backbone.embedding import run_backbone

    device = torch.device(device)
    backbone.to(device)
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=False, num_workers=num_workers
    )
    out = None
    row = 0
    for e in run_backbone(backbone, (batch[0] for batch in loader), device):
        e = torch.nn.functional.normalize(e, dim=1).numpy()
        if out is None:
            out = np.lib.format.open_memmap(
                path, mode="w+", dtype=np.float32, shape=(len(dataset), e.shape[1])
            )
        out[row : row + len(e)] = e
        row += len(e)
    if out is None:
        raise ValueError("embed_to_memmap: the dataset is empty")
    out.flush()
    return out

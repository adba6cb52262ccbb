"""Training diagnostics of Partial FC (An et al., CVPR 2022, §3.3), computed in ``no_grad``
from one step of a sharded head (:meth:`PartialFC.diagnostics`).

With ``x̂_i`` the normalised embeddings of the global batch, ``ŵ_j`` the normalised centers:

* APCS  = mean_i  cos(x̂_i, ŵ_{y_i})                       (intra-class compactness)
* AMNCS = mean_i  max_{j ∈ active, j ≠ y_i} cos(x̂_i, ŵ_j)  (hardest active negative)
* MICS  = max_{i ≠ j} cos(ŵ_i, ŵ_j) over a random sample of classes (inter-class discrepancy)

Sub-centers: a class's cosine is the max over its K sub-centers. Each rank scores the gathered
batch against the active rows of its own class block (read from the head's record of the last
forward, before the optimizer consumes it); a max-reduce over ranks completes both maxima.
MICS samples up to ``mics_classes`` classes per rank and all-gathers their dominant centers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from partialfc.classifier.collectives import (
    all_gather_rows_no_grad,
    all_gather_sizes,
    all_reduce_max,
)


@torch.no_grad()
def partial_fc_diagnostics(
    embeddings: torch.Tensor, labels: torch.Tensor, head, seed: int = 0, mics_classes: int = 512
) -> dict:
    """``{"apcs", "amncs", "mics"}`` for the step whose forward ``head`` just recorded."""
    record = head.active_rows
    if record is None:
        raise RuntimeError("diagnostics need the active rows of the last Partial FC forward")
    pg = head.process_group
    device = head.device
    k = head.num_subcenters
    sizes = [int(s) for s in all_gather_sizes([embeddings.shape[0]], device, pg)[:, 0]]
    x = all_gather_rows_no_grad(F.normalize(embeddings.float().to(device), dim=1), sizes, pg)
    y = all_gather_rows_no_grad(labels.to(device, torch.long), sizes, pg)

    # max positive / negative cosine per sample over the active rows, a chunk at a time
    neg_inf = torch.tensor(-float("inf"), device=device)
    positive = torch.full((x.shape[0],), -float("inf"), device=device)
    negative = positive.clone()
    step = head.chunk_rows
    for lo in range(0, record.rows.numel(), step):
        hi = lo + step
        w = F.normalize(record.read_weight(lo, hi), dim=1)
        row_class = record.rows[lo:hi].to(device) // k + head.block.start
        cos = x @ w.t()  # (B, rows of the chunk)
        is_positive = y.unsqueeze(1) == row_class.unsqueeze(0)
        positive = torch.maximum(positive, torch.where(is_positive, cos, neg_inf).amax(dim=1))
        negative = torch.maximum(negative, torch.where(is_positive, neg_inf, cos).amax(dim=1))
    positive = all_reduce_max(positive, pg)
    negative = all_reduce_max(negative, pg)

    # MICS over a sample of classes: each rank contributes up to `mics_classes` of its block
    gen = torch.Generator().manual_seed(int(seed) * 7919 + head.rank)
    local_classes = head.block.size
    take = min(mics_classes, local_classes)
    picked = torch.randperm(local_classes, generator=gen)[:take]
    rows = (picked.unsqueeze(1) * k + torch.arange(k)).reshape(-1).to(device)
    centers = F.normalize(head.centers.read(rows).float(), dim=1)  # (take * K, d)
    counts = [int(s) for s in all_gather_sizes([centers.shape[0]], device, pg)[:, 0]]
    centers = all_gather_rows_no_grad(centers, counts, pg)
    owner = torch.arange(centers.shape[0], device=device) // k  # same class ⇔ same sample slot
    gram = centers @ centers.t()
    gram.masked_fill_(owner.unsqueeze(0) == owner.unsqueeze(1), -float("inf"))
    mics = float(gram.max()) if centers.shape[0] > k else float("nan")
    return {
        "apcs": float(positive.mean()),
        "amncs": float(negative[torch.isfinite(negative)].mean()),
        "mics": mics,
        "mics_classes": int(centers.shape[0] // k),
    }
